#!/usr/bin/env bash
# The stop scenarios of tests/test_train_amp_stop.py on a GPU host, for each --decode path
# (device: nvJPEG and the prefetch thread; workers: PIL in DataLoader workers): SIGTERM to the
# process group, `| tee` ended by Ctrl-C, SIGHUP (a dropped SSH session), SIGUSR1 then SIGTERM,
# stderr closed. Prints one line
# per run: tree, decode, scenario, exit status, the checkpoint's (epoch, step) and seconds.
# Usage, natively on a GPU host: benchmarks/gpu_stop_check.sh [TREE ...] (a TREE holds
# train_amp.py and trainamp/; default: this checkout). OUT=dir keeps the logs.
set -u
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/gpu_stop_check}
mkdir -p "$out"
data="$out/data"
python3 - "$data" <<'EOF'
import os, sys
from PIL import Image
root = sys.argv[1]
for k, colour in enumerate(((200, 30, 30), (30, 30, 200))):
    os.makedirs(f"{root}/class{k}", exist_ok=True)
    for i in range(400):
        Image.new("RGB", (64, 48), tuple((v + 3 * i) % 256 for v in colour)).save(
            f"{root}/class{k}/{i}.jpg")
EOF
waitstep() {  # waitstep LOG PID: until the log shows step 3 or later (2 min), or PID ended
  for _ in $(seq 600); do
    grep -qE 'step ([3-9]|[1-9][0-9]+)/100' "$1" 2>/dev/null && return
    kill -0 "$2" 2>/dev/null || return
    sleep 0.2
  done
}
ckpt() {
  python3 -c "import sys, torch; c = torch.load(sys.argv[1], weights_only=True); print(c['epoch'], c['step_in_epoch'])" \
    "$1/last.pt" 2>/dev/null || echo none
}
run() {  # run TREE DECODE SCENARIO
  local tree=$1 decode=$2 scenario=$3 dir start=$SECONDS status
  dir="$out/$(basename "$tree")-$decode-$scenario"
  rm -rf "$dir" && mkdir -p "$dir"
  local job=(python3 "$tree/train_amp.py" --data "$data" --model resnet18 --image-size 32
             --batch-size 8 --num-workers 2 --decode "$decode" --log-every 1 --progress lines
             --checkpoint-dir "$dir/ck")
  case $scenario in
    group-term)
      setsid "${job[@]}" --epochs 3 > "$dir/log" 2>&1 & local pid=$!
      waitstep "$dir/log" $pid; kill -TERM -- -$pid; wait $pid; status=$? ;;
    tee-int)
      setsid env --default-signal=INT bash -c "trap true INT TERM; ${job[*]} --epochs 3 2>&1 | tee $dir/log > /dev/null; echo \${PIPESTATUS[0]} > $dir/exit" &
      local pid=$!
      waitstep "$dir/log" $pid; kill -INT -- -$pid; wait $pid; status=$(cat "$dir/exit" 2>/dev/null || echo none) ;;
    hup)  # a dropped SSH session without tmux: SIGHUP saves as SIGTERM does (exit 0)
      setsid "${job[@]}" --epochs 3 > "$dir/log" 2>&1 & local pid=$!
      waitstep "$dir/log" $pid; kill -HUP $pid; wait $pid; status=$? ;;
    usr1-term)
      setsid "${job[@]}" --epochs 3 > "$dir/log" 2>&1 & local pid=$!
      waitstep "$dir/log" $pid; kill -USR1 $pid; sleep 0.1; kill -TERM $pid; wait $pid; status=$? ;;
    stderr-closed)
      "${job[@]}" --steps 4 2>&- > "$dir/log"; status=$? ;;
  esac
  printf '%-10s %-8s %-14s exit=%-4s ckpt=%-8s %3ss\n' "$(basename "$tree")" "$decode" "$scenario" \
    "$status" "$(ckpt "$dir/ck" | tr ' ' ,)" "$((SECONDS - start))"
}
trees=("$@")
[ ${#trees[@]} -gt 0 ] || trees=(.)
for tree in "${trees[@]}"; do
  for decode in ${DECODES:-device workers}; do
    for scenario in ${SCENARIOS:-group-term tee-int hup usr1-term stderr-closed}; do
      run "$tree" "$decode" "$scenario"
    done
  done
done
