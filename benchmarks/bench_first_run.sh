#!/bin/bash
# The first run, timed: a fresh clone -> make run (prebuilt image) -> a Jupyter save (contents
# API PUT, expect 201) -> an SSH login into tmux (the pane's folder). A READY with a warning (root's
# root-owned checkout) gets the one host step it names, then make stop and make run again.
# Usage, as the user to measure (docker access, no container named like make run's):
#   benchmarks/bench_first_run.sh SOURCE DIR PORT_JUPYTER PORT_SSH
# SOURCE: what to clone (a path, URL or git bundle: git bundle create /tmp/x.bundle HEAD); the
# image comes from IMAGE/TAG/BASE_IMAGE/PYTHON_VERSION in the environment, as for make run.
set -u
src=$1 dir=$2 pj=$3 ps=$4
export PORT_JUPYTER=$pj PORT_SSH=$ps
t0=$(date +%s.%N)
el() { printf '%6.1f s  %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$1"; }
rm -rf "$dir"; git clone -q "$src" "$dir" && cd "$dir" && el "cloned" || exit 1
[ -e ~/.ssh/id_ed25519.pub ] || { ssh-keygen -q -t ed25519 -N "" -f ~/.ssh/id_ed25519 && el "ssh key made (~/.ssh/id_ed25519)"; }
start_run() {
  (make run > run.log 2>&1 &)
  for _ in $(seq 1200); do
    grep -q "==> READY" run.log 2>/dev/null && break
    grep -q "^make: \*\*\*" run.log 2>/dev/null && { cat run.log; exit 1; }  # make run failed
    sleep 0.1
  done
  el "READY: $(grep '==> READY' run.log | tail -1 | cut -c1-24)"
}
start_run
if grep -q "^WARN.*==> READY" run.log; then
  step=$(grep -o 'setfacl [^(]*<dir>' run.log | head -1 | sed "s#<dir>#$dir#")
  echo "   the one host step: $step"
  $step && make -s stop >/dev/null && el "did the step, stopped"
  start_run
fi
token=$(grep '==> READY' run.log | tail -1 | grep -o 'token=[0-9a-f]*' | cut -d= -f2)
code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H "Authorization: token $token" -H 'Content-Type: application/json' \
  -d '{"type":"notebook","content":{"cells":[],"metadata":{},"nbformat":4,"nbformat_minor":5}}' \
  "http://127.0.0.1:$pj/api/contents/saved.ipynb")
el "Jupyter save: HTTP $code; on the host: $(stat -c '%U, %s bytes' saved.ipynb 2>&1)"
out=$(ssh -tt -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -p "$ps" dev@localhost \
  "tmux new -d -s main; sleep 0.3; tmux display -p -t main '#S #{pane_current_path}'" </dev/null | tr -d '\r' | tail -1)
el "SSH login in tmux (session, folder): $out"
grep -E "^(WARN|ERROR)" run.log | cut -c1-200
make -s stop
