#!/usr/bin/env bash
# The services, under tini: sshd (when the SSH step enabled it) and JupyterLab as $NB_USER.
# If either dies the other is stopped and we exit non-zero; SIGTERM/SIGINT stop both quickly.
set -uo pipefail
# shellcheck source=docker/rootfs/usr/local/lib/team/log.sh
source /usr/local/lib/team/log.sh
# shellcheck source=docker/rootfs/usr/local/lib/team/user.sh
source /usr/local/lib/team/user.sh

# What the healthcheck reads: /run/team, or /tmp/team-run on a read-only root (--read-only).
state=/run/team
jupyter_pid="" sshd_pid=""

# stop_all: SIGTERM both (tini -g has usually sent it already), then SIGKILL what is left after
# 8 s, inside Docker's default 10 s stop timeout.
stop_all() {
  local pid deadline=$((SECONDS + 8))
  for pid in $jupyter_pid $sshd_pid; do kill -TERM "$pid" 2>/dev/null; done
  for pid in $jupyter_pid $sshd_pid; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  # Reap them so no zombie outlives us.
  wait 2>/dev/null
}

# shellcheck disable=SC2329  # invoked by the traps below
on_signal() {
  log_info "Received $1: stopping JupyterLab${sshd_pid:+ and sshd}"
  stop_all
  log_info "Stopped cleanly"
  exit 0
}
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT

mkdir -p "$state" 2>/dev/null || { state=/tmp/team-run; mkdir -p "$state" 2>/dev/null; } || state=""

# The SSH step (30-ssh.sh) enables sshd only with a key and when we run as root.
if [ "${SSHD_ENABLED:-0}" = 1 ]; then
  install -d -m 0755 /run/sshd   # privilege separation directory, lost with /run
  /usr/sbin/sshd -D -e &
  sshd_pid=$!
fi

# Started with --user, that UID may have no passwd entry; 10-user.sh picked a writable home.
run_as=$NB_USER
[ "$(id -u)" = 0 ] || run_as=$(id -un 2>/dev/null || id -u)
cd /workspace || exit 1
# Jupyter gets neither the root environment's extras nor the ready URL (it holds the token);
# its settings come from /etc/jupyter/jupyter_server_config.py, which reads TEAM_JUPYTER_DIR.
# Everything it and its kernels print goes through the redactor (jupyter-log-redact), so no
# token or password reaches `docker logs`; the redactor ends when Jupyter closes the pipe.
as_nb_user --exec env -u TEAM_JUPYTER_URL -u SSHD_ENABLED HOME="$NB_HOME" USER="$run_as" LOGNAME="$run_as" \
  SHELL=/bin/bash jupyter lab \
  > >(/usr/local/lib/team/jupyter-log-redact "$TEAM_JUPYTER_DIR" >&2) 2>&1 &
jupyter_pid=$!

if [ -n "$state" ]; then
  # For the healthcheck: what to probe. No secrets here.
  printf 'JUPYTER_PORT=%s\nSSHD_ENABLED=%s\n' "$JUPYTER_PORT" "${sshd_pid:+1}" > "$state/services.env"
fi

# The ready line, once Jupyter answers (a few seconds; it exits on its own if Jupyter dies).
ready_deadline=$((SECONDS + 300))
while kill -0 "$jupyter_pid" 2>/dev/null && [ "$SECONDS" -lt "$ready_deadline" ]; do
  if curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$JUPYTER_PORT/api" 2>/dev/null; then
    if [ -n "$sshd_pid" ]; then
      ssh_note="SSH on: ssh -p <host port of 22> -t $NB_USER@<host> tmux new -A -s main"
    elif [ "$(id -u)" = 0 ] && [ ! -s "$(getent passwd "$NB_USER" | cut -d: -f6)/.ssh/authorized_keys" ]; then
      # No key at all (not SSHD_ENABLED=0, not --user): the one case a user can fix by adding one.
      # shellcheck disable=SC2016  # printed for the user to paste, not expanded here
      ssh_note='SSH off: no public key; add one with -e PUBLIC_KEY="$(cat ~/.ssh/id_ed25519.pub)" -p 2222:22 (make run does it when ~/.ssh has one)'
    else ssh_note="SSH off"; fi
    log_info "==> READY  JupyterLab: $TEAM_JUPYTER_URL  |  $ssh_note"
    break
  fi
  sleep 0.2
done

# Wait for the first service to end; a signal interrupts this and runs on_signal.
# shellcheck disable=SC2086  # $sshd_pid is empty or one PID
wait -n -p died "$jupyter_pid" $sshd_pid
rc=$?
if [ "${died:-}" = "$sshd_pid" ] && [ -n "$sshd_pid" ]; then
  name=sshd; other="JupyterLab"
else
  name=JupyterLab; other="sshd"
fi
[ -n "$sshd_pid" ] || other=""
log_error "$name exited unexpectedly (exit code $rc)${other:+; stopping $other}. The container exits so a --restart policy can start it again."
stop_all
exit $((rc == 0 ? 1 : rc))
