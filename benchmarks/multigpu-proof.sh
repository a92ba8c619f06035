#!/usr/bin/env bash
# The multi-GPU proof, in one go, on a host with >= 2 GPUs and this repository (in the image, or
# natively with torch + torchvision installed): every step's log and JSON go to OUTDIR, a summary
# to OUTDIR/summary.txt. Steps: the smoke suite with every multi-GPU test required; NCCL all-reduce
# bus bandwidth (benchmarks/bench_nccl.py) beside the NVLink peak; train_amp --benchmark on 1 GPU and
# on N GPUs in the same session (scaling efficiency = N-GPU images/s / (N x 1-GPU images/s));
# --compare under DDP; a real digits run under DDP that checkpoints, resumes, and is compared with
# one GPU.
#
#   benchmarks/multigpu-proof.sh OUTDIR [NGPUS (default: all visible)]
#
# With one GPU it still runs every step that can run (a dry run of the set-up); the smoke step
# then fails on purpose, because --require-gpus N cannot be met.
set -uo pipefail
out=${1:?usage: benchmarks/multigpu-proof.sh OUTDIR [NGPUS]}
n=${2:-$(python -c 'import torch; print(torch.cuda.device_count())')}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit
summary=$out/summary.txt
: >"$summary"

step() {  # step NAME CMD...: run CMD, log to OUTDIR/NAME.log, record rc and wall time
  local name=$1 start rc
  shift
  echo "== $name: $*" | tee -a "$summary"
  start=$(date +%s)
  "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "   rc=$rc, $(($(date +%s) - start)) s" | tee -a "$summary"
  tail -n 3 "$out/$name.log" | sed 's/^/   | /' | tee -a "$summary"
}

nvidia-smi topo -m >"$out/topo.txt" 2>&1
nvidia-smi nvlink -s >"$out/nvlink.txt" 2>&1
run=(torchrun --standalone --nproc-per-node "$n")
bench=(train_amp.py --benchmark --model resnet50 --batch-size 256)

step smoke python -m pytest smoke_tests -q -p no:cacheprovider --require-gpus "$n" \
  --report-dir "$out/smoke"
step nccl "${run[@]}" benchmarks/bench_nccl.py --json "$out/nccl.json"
step bench-1gpu python "${bench[@]}" --out "$out/bench-1gpu"
step "bench-${n}gpu" "${run[@]}" "${bench[@]}" --out "$out/bench-${n}gpu"
step compare-ddp "${run[@]}" train_amp.py --compare --data digits --model resnet18 --epochs 3 \
  --out "$out/compare-ddp"
# Digits: 1 GPU for 6 epochs; N GPUs for 3 epochs, then resumed to 6 from the checkpoint.
step digits-1gpu python train_amp.py --data digits --model resnet18 --epochs 6 \
  --checkpoint-dir "$out/ck-1gpu" --metrics "$out/digits-1gpu.json"
step digits-ddp-first "${run[@]}" train_amp.py --data digits --model resnet18 --epochs 3 \
  --checkpoint-dir "$out/ck-ddp" --metrics "$out/digits-ddp-first.json"
step digits-ddp-resumed "${run[@]}" train_amp.py --data digits --model resnet18 --epochs 6 \
  --checkpoint-dir "$out/ck-ddp" --resume --metrics "$out/digits-ddp-resumed.json"

python - "$out" "$n" <<'EOF' | tee -a "$summary"
import json, pathlib, sys
out, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def images_per_s(d):
    files = sorted(pathlib.Path(d).glob("*.json"))
    return json.loads(files[-1].read_text()).get("images_per_s") if files else None
one, many = images_per_s(out / "bench-1gpu"), images_per_s(out / f"bench-{n}gpu")
if one and many:
    print(f"train_amp ResNet-50 bs256/GPU: 1 GPU {one:.0f} img/s, {n} GPUs {many:.0f} img/s,"
          f" scaling efficiency {many / (n * one):.3f} (target >= 0.95)")
else:
    print("benchmark figures missing: see bench-*.log")
for name in ("digits-1gpu", "digits-ddp-first", "digits-ddp-resumed"):
    f = out / f"{name}.json"
    final = json.loads(f.read_text()).get("final", {}) if f.exists() else {}
    print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in final.items()
                                  if k in ("epoch", "step", "val_acc", "train_acc", "images_per_s")))
EOF
