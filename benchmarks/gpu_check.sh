#!/usr/bin/env bash
# The GPU figures to compare before and after a change that moves train_amp's GPU paths (issue
# 34's redesign): the smoke suite with --require-gpu, train_amp --benchmark of ResNet-50 (compiled
# and eager) and ResNet-18 with CUDA graphs, a 2-epoch digits run, and bench_input's --decode
# device rows. Run natively on a GPU host from a checkout: OUT=dir benchmarks/gpu_check.sh
# (each part is time-bounded, so one call fits a 10-minute device slot).
set -u
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import sys,torch,torchvision;print(sys.version.split()[0],torch.__version__,torchvision.__version__,torch.version.cuda)"
  python -c "import triton;print('triton',triton.__version__)"
  nproc
} > "$out/env.txt" 2>&1

timed() {  # timed NAME SECONDS CMD...: CMD's output and its exit status and seconds in NAME.txt
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "rc=$? $((SECONDS - start))s" >> "$out/$name.txt"
}
# test_versions needs --expect-versions (the image's file): outside the image it errors by design.
timed smoke 280 python -m pytest smoke_tests --require-gpu -q -p no:cacheprovider -rs --durations=12
timed bench_r50 150 python train_amp.py --benchmark --model resnet50 --batch-size 256 --progress none --out "$out/b1"
timed bench_r50_eager 150 python train_amp.py --benchmark --model resnet50 --batch-size 256 --compile off --progress none --out "$out/b2"
timed bench_r18_graphs 150 python train_amp.py --benchmark --model resnet18 --batch-size 256 --compile on --cuda-graphs --progress none --out "$out/b3"
timed digits 150 python train_amp.py --data digits --model resnet18 --epochs 2 --progress lines --checkpoint-dir "$out/ckpt"
timed bench_input 170 python benchmarks/bench_input.py --images 4096 --epochs 3 \
  --rows synthetic,device,device-roi,device-replay,device-decode-once,workers --out "$out/bench_input.json"
tail -n 3 "$out"/*.txt
