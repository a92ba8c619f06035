"""trainamp: the package behind train_amp.py, one job per module.

amp.py          the AMP lesson: autocast, GradScaler, the optimizer, schedule, divergence guard
cli.py          the command line (parser, help, number checks)
plan.py         the command line resolved once (device, AMP dtype, compile, CUDA graphs)
launch.py       torchrun/srun/Kubeflow detection, GPU choice, process group, stop signals
model.py        the torchvision model, torch.compile, CUDA graphs, backend flags
checkpoint.py   save (atomic), lock, resume
data/           sources (synthetic, digits, ImageFolder, tar shards), the workers' CPU decode,
                the GPU decode (nvJPEG, Triton crop kernel), the prefetch thread, the loaders
meter.py        progress output and the epoch's running numbers
trainer.py      the training loop
report.py       --benchmark and --compare
main.py         main(): run the mode asked for, map errors to exit statuses
api.py          the names benchmarks and tests import through train_amp.py"""
