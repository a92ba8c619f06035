"""The command line: the parser with its help and examples, the number types that refuse
NaN and out-of-range values, and the defaults that depend on --data (parse_args)."""
import argparse
import math

from .data.options import CORES_FOR_WORKER_DECODE, DECODE_CPU_SHARE
from .errors import PROG

# --help's first line.
DESCRIPTION = "train a torchvision image classifier with automatic mixed precision (AMP)."
EPILOG = """\
examples:
  train_amp.py --data digits --model resnet18 --epochs 5          # real data, no download
  train_amp.py --data /data/imagenet --epochs 90 --checkpoint-dir ckpt
  train_amp.py --data /data/imagenet --epochs 90 --checkpoint-dir ckpt --resume
  train_amp.py --benchmark --model resnet50 --batch-size 256     # images/s + peak memory
  train_amp.py --compare --data digits --model resnet18 --epochs 3   # FP32 vs AMP report
  torchrun --nproc-per-node 8 /usr/local/bin/train_amp.py --data /data/imagenet
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      /usr/local/bin/train_amp.py --data /data/imagenet

AMP: autocast runs matmuls/convolutions in 16 bits while the weights stay FP32. fp16 needs
a GradScaler (scale -> backward -> unscale_ -> clip_grad_norm_ -> step -> update); bf16 has
FP32's range and needs none. --amp auto picks bf16 where the GPU has it (Ampere and newer),
else fp16; on a CPU bf16 where it computes it (AVX512-BF16 or AMX), else FP32: emulated bf16
is about 10x slower (--amp bf16 still forces it, with a warning). SIGTERM (docker stop, a scheduler's preemption)
or SIGHUP (a dropped SSH session) saves a checkpoint at the end of the current step and exits 0;
--resume continues there.

checkpoints: a run never replaces another run's CHECKPOINT_DIR/last.pt by surprise: if one is
there, add --resume to continue it, give another --checkpoint-dir for a new run (also for one
continued with --resume PATH), or add --overwrite to replace it (at this run's first save).
--auto-resume continues last.pt when it is there and starts fresh when not: the one command
line for a job a scheduler restarts (slurm/*.sbatch and k8s/*.yaml use it).
A save goes to last.HOST.PID.tmp, is fsynced, then renamed over last.pt, so a kill or a full
disk leaves the previous last.pt intact; a temp file left by a kill -9 is removed at the next
start. A run locks its CHECKPOINT_DIR (.train_amp.lock, flock): a second run into the same
folder is refused at start, naming the first one's PID and host.
The directory is created and write-tested before any training. A checkpoint is never written
from non-finite weights.

exit status: 0 done (or stopped by SIGTERM/SIGHUP/Ctrl-C after saving); 75 stopped after saving, once
a SIGUSR1 came (a scheduler's warning before its time limit, also when its SIGTERM follows:
requeue the job); 2 a problem in the command
line, the data or the checkpoint directory, with a one-line fix (also an unreadable image:
--skip-bad-images skips those and counts them in each epoch's summary); 3 training diverged
(the loss stayed NaN/inf; last.pt keeps the last good state); 4 a checkpoint could not be
written (e.g. disk full; the previous last.pt is kept); 5 a scheduler started several tasks
but they could not form one job (no master address, or no rendezvous within --dist-timeout):
never N separate copies of the run.

launchers: torchrun (its variables win, also torchrun inside srun); srun with one task per
process (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, also beside the RANK/LOCAL_RANK that pyxis
adds without WORLD_SIZE; master = first host of SLURM_JOB_NODELIST, port MASTER_PORT or
10000 + SLURM_JOB_ID % 20000); Kubeflow PyTorchJob pods started without
torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT: one process per pod); Kubeflow Trainer
TrainJob nodes started without torchrun (PET_NNODES/PET_NODE_RANK/PET_MASTER_*, only with
PET_NPROC_PER_NODE=1); else one process. RANK or WORLD_SIZE set alone is refused (exit 5).
The first line says which one was detected."""


def int_at_least(low):
    """An argparse type: an integer >= low."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


positive_int, non_negative_int = int_at_least(1), int_at_least(0)


def finite_float(low, strict, example):
    """An argparse type: a finite float >= low (> low when strict). float() alone accepts
    'nan' and 'inf', and an --lr nan run trains on and saves NaN weights with exit 0."""
    bound = f"{'>' if strict else '>='} {low:g}"

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number, e.g. {example}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}"
                                             f" (e.g. {example})")
        return value

    parse.__name__ = "number"  # argparse names the type in some messages
    return parse


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION,
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default="resnet50",
                   help="torchvision classification model name, random init (default: resnet50;"
                        " --list-models shows all)")
    g.add_argument("--list-models", action="store_true", help="print the model names and exit")
    g.add_argument("--data", default="synthetic",
                   help="'synthetic' (random images made in memory), 'digits' (scikit-learn's"
                        " bundled 8x8 handwritten digits, upscaled: real data, no download) or"
                        " the path of an ImageFolder (class subfolders; if it holds train/ and"
                        " val/, those are used) or of WebDataset-style tar shards (.tar files"
                        " whose samples are KEY.jpg or .png ... with KEY.cls, the class index;"
                        " val*.tar validate, or train/ and val/ hold the .tar files)"
                        " (default: synthetic)")
    g.add_argument("--image-size", type=positive_int, default=None,
                   help="side of the square training images (default: 224; 32 for digits)")
    g.add_argument("--num-classes", type=positive_int, default=None,
                   help="classes for synthetic data (default: 1000; digits: 10; ImageFolder:"
                        " its class folders)")
    g.add_argument("--synthetic-size", type=positive_int, default=4096,
                   help="images in the synthetic training set (default: 4096)")
    g.add_argument("--num-workers", type=non_negative_int, default=None,
                   help="DataLoader worker processes (default: 0 for in-memory data; CPUs per"
                        " process - 1 when they decode JPEGs; min(8, CPUs per process) when they"
                        " only read files for --decode device)")
    g.add_argument("--decode", choices=("auto", "workers", "device"), default="auto",
                   help="ImageFolder/tar JPEGs: decode and augment in the DataLoader workers"
                        " (PIL), or only read files there and decode + augment on the training"
                        " device (nvJPEG, one crop-and-resize per batch, overlapped with"
                        " training). auto: device on a GPU with fewer than"
                        f" {CORES_FOR_WORKER_DECODE} CPU cores per GPU when all files are"
                        " JPEGs, else workers; the first line says which (default: auto)")
    g.add_argument("--decode-cpu-share", type=finite_float(0, False, "--decode-cpu-share 0.3"),
                   default=DECODE_CPU_SHARE, metavar="FRACTION",
                   help="--decode device: the share of each batch the DataLoader workers decode"
                        " on the CPU while the GPU decodes the rest (nvJPEG sets the pace"
                        " beside a busy GPU; the workers otherwise only read files), e.g. 0.3"
                        " with --num-workers 12 on 16 cores; 0: the GPU decodes all (default:"
                        f" {DECODE_CPU_SHARE:g})")
    g.add_argument("--skip-bad-images", action="store_true",
                   help="ImageFolder: skip files that cannot be read or decoded (each named once"
                        " in a warning; the count is in every epoch's summary line) instead of"
                        " stopping at the first one with its name (default: stop)")

    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, default=1, help="epochs (default: 1)")
    g.add_argument("--steps", type=positive_int, default=None,
                   help="stop after this many optimizer steps in total (overrides --epochs);"
                        " with --benchmark: measured steps (default 30)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="images per step per process (default: 256; 64 for digits)")
    g.add_argument("--lr", type=finite_float(0, True, "--lr 0.1"), default=None,
                   help="peak learning rate of SGD with momentum (default: 0.1 x global batch"
                        " / 256); linear warm-up then cosine decay, per step")
    g.add_argument("--weight-decay", type=finite_float(0, False, "--weight-decay 5e-5"),
                   default=5e-5, help="(default: 5e-5)")
    g.add_argument("--warmup-steps", type=non_negative_int, default=None,
                   help="LR warm-up steps (default: 5%% of the steps); with --benchmark: untimed"
                        " steps before measuring (default: 10, 20 with --compile)")
    g.add_argument("--grad-clip", type=finite_float(0, False, "--grad-clip 1.0"), default=1.0,
                   help="clip the global gradient norm to this (after unscaling); 0 = off"
                        " (default: 1.0)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    g.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels, cudnn.benchmark off (slower; for debugging)")

    g = p.add_argument_group("precision and speed")
    g.add_argument("--amp", choices=("auto", "fp16", "bf16", "off"), default="auto",
                   help="autocast dtype. auto: bf16 on GPUs that have it, else fp16 (with"
                        " GradScaler); on CPU bf16 where the CPU computes it (AVX512-BF16 or"
                        " AMX), else FP32 (emulated bf16 is ~10x slower). off: FP32"
                        " (default: auto)")
    g.add_argument("--tf32", action="store_true",
                   help="let FP32 matmuls/convolutions use TF32 tensor cores (default: off, so"
                        " --amp off is strict FP32)")
    g.add_argument("--channels-last", nargs="?", const="on", default="auto",
                   choices=("auto", "on", "off"),
                   help="NHWC memory format, faster for convolutions on tensor cores. auto: on"
                        " for conv nets on a GPU (default: auto; bare flag = on)")
    g.add_argument("--compile", nargs="?", const="on", default="auto",
                   choices=("auto", "on", "off", "tuned"),
                   help="torch.compile the model (TorchInductor; needs g++, and Triton on GPU);"
                        " the first steps take about a minute longer. auto: on for a GPU when"
                        " Triton and a C compiler are there (ResNet-50 AMP ran 1.4x faster"
                        " compiled on an H200), off on CPU. tuned: on, plus Inductor's"
                        " coordinate-descent tuning of every generated kernel: about 4 more"
                        " minutes the first time (cached in TORCHINDUCTOR_CACHE_DIR: the image's CACHE_DIR),"
                        " then about 6%% faster (ResNet-50 AMP on an H200: 7,100 images/s)"
                        " (default: auto; bare flag = on)")
    g.add_argument("--cuda-graphs", nargs="?", const="on", default="off", choices=("on", "off"),
                   help="replay the compiled model's forward and backward as CUDA graphs"
                        " (torch.compile's reduce-overhead: two launches a step instead of"
                        " ~900 kernels); needs --compile, one GPU, one process. Helps models"
                        " whose steps are too short to hide the launches; off by default: on an"
                        " H200 ResNet-50 from synthetic data gained 1%%, and --decode device"
                        " lost 11%% (the model then leaves no gaps for the decoder's kernels)"
                        " (default: off; bare flag = on)")
    g.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="(default: auto = cuda if available)")
    g.add_argument("--dist-timeout", type=positive_int, default=1800, metavar="SECONDS",
                   help="several processes: how long to wait for the others (forming the job,"
                        " and in each collective) before failing with exit 5 (default: 1800)")

    g = p.add_argument_group("checkpoints and logging")
    g.add_argument("--checkpoint-dir", default="checkpoints",
                   help="where last.pt is written at each epoch end, every --save-every steps"
                        " and on SIGTERM (default: ./checkpoints; '' = never). If it already"
                        " holds a last.pt, the run stops unless --resume or --overwrite is given")
    g.add_argument("--overwrite", action="store_true",
                   help="start a new run (or continue --resume PATH) even though"
                        " CHECKPOINT_DIR/last.pt exists: it is replaced at this run's first"
                        " save (without this flag the run refuses to start, so an earlier run"
                        " is never lost by accident)")
    g.add_argument("--save-every", type=non_negative_int, default=0,
                   help="also save every N steps (default: 0 = epoch ends and SIGTERM only)")
    g.add_argument("--save-every-minutes", type=finite_float(0, False, "--save-every-minutes 10"),
                   default=0, metavar="M",
                   help="also save when M minutes passed since the last save: bounds what a"
                        " kill without warning (SIGKILL, a lost node) loses (default: 0 = off)")
    g.add_argument("--resume", nargs="?", const="auto", default=None, metavar="PATH",
                   help="continue from PATH (bare flag: CHECKPOINT_DIR/last.pt); a missing,"
                        " corrupt or mismatched checkpoint is an error, never a fresh start")
    g.add_argument("--auto-resume", action="store_true",
                   help="continue CHECKPOINT_DIR/last.pt when it exists, else start fresh: one"
                        " command line for every restart (Slurm requeue, torchrun"
                        " --max-restarts, Kubernetes). A last.pt of other settings, or"
                        " unreadable, is still an error, never replaced")
    g.add_argument("--log-every", type=positive_int, default=20,
                   help="progress update every N steps (default: 20)")
    g.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default="auto",
                   help="tqdm bar, plain log lines, or nothing (default: auto = bar on a TTY)")
    g.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="write TensorBoard scalars (loss, lr, images/s, accuracy) to DIR")
    g.add_argument("--metrics", metavar="FILE", default=None,
                   help="write per-epoch metrics and the final result as JSON")

    g = p.add_argument_group("modes")
    g.add_argument("--benchmark", action="store_true",
                   help="timing only: one synthetic batch already on the device, --warmup-steps"
                        " untimed then --steps timed; prints images/s and peak memory")
    g.add_argument("--compare", action="store_true",
                   help="run the same job in FP32 (TF32 off) and with AMP, then print a markdown"
                        " table and write compare.json, compare.md and compare.png to --out")
    g.add_argument("--out", default="amp_compare",
                   help="output directory of --compare (and --benchmark JSON) (default:"
                        " ./amp_compare)")
    g.add_argument("--print-launch", action="store_true",
                   help="print one line: this process's launcher, rank, world size, local rank"
                        " and the GPU it would use (also where no CUDA driver is), then exit"
                        " without forming the job or training (exit 2 if the GPUs cannot go"
                        " round, 5 if the tasks cannot form one job)")
    return p


def fill_defaults(args):
    """The defaults that depend on --data (parse_args fills them in; for a namespace of
    build_parser().parse_args, as the benchmarks make)."""
    if args.batch_size is None:
        args.batch_size = 64 if args.data == "digits" else 256
    if args.image_size is None:
        args.image_size = 32 if args.data == "digits" else 224


def parse_args(argv=None):
    """The command line -> its namespace with every default filled in, read-only from here on."""
    args = build_parser().parse_args(argv)
    fill_defaults(args)
    return args
