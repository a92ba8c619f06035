#!/bin/bash
# The services, under tini: sshd (when the SSH step enabled it) and JupyterLab as $NB_USER.
# If either dies the other is stopped and we exit non-zero; SIGTERM/SIGINT stop both, after
# giving jobs outside the services (tmux, SSH sessions, docker exec) time to save.
set -uo pipefail
# shellcheck source=docker/rootfs/usr/local/lib/team/log.sh
source /usr/local/lib/team/log.sh
# shellcheck source=docker/rootfs/usr/local/lib/team/user.sh
source /usr/local/lib/team/user.sh

# What the healthcheck reads: /run/team, or /tmp/team-run on a read-only root (--read-only).
state=/run/team
jupyter_pid="" sshd_pid=""

# docker stop's SIGTERM reaches tini, and tini -g passes it to our process group: this script
# (the services have groups of their own, see below). Jobs started in tmux, an SSH session, a
# JupyterLab terminal or by `docker exec` live in yet other groups, and were killed without a
# chance to save when we exited. So on a stop they get SIGTERM first and time to end (a
# checkpoint), inside Docker's grace period: STOP_TIMEOUT seconds (default 10, docker stop's;
# make run passes it with --stop-timeout, make stop with -t, compose as stop_grace_period). Jobs
# get all but the last 3 s; JupyterLab and sshd are stopped after them and get the rest.
stop_timeout=${STOP_TIMEOUT:-10}
# Only docker decides when the container is killed (--stop-timeout, docker stop -t): say what a
# bad value means for the jobs, not that another value is "used".
if [[ $stop_timeout =~ ^[0-9]{1,5}$ ]] && [ "$stop_timeout" -lt 4 ]; then
  log_warn "STOP_TIMEOUT=$stop_timeout: if docker stop gives the container that too (make run passes it as --stop-timeout), it kills jobs in tmux, terminals and docker exec at once, before they can save a checkpoint; only where docker stop gives 10 s or more do they get 7 s. Fix: STOP_TIMEOUT=<4 or more, e.g. 60> (make run/stop), or -e STOP_TIMEOUT=<s> --stop-timeout <s>"
  stop_timeout=10
elif ! [[ $stop_timeout =~ ^[0-9]{1,5}$ ]]; then
  log_warn "STOP_TIMEOUT='$stop_timeout' is not a number of seconds: jobs get 7 s to save on a stop, which holds only if docker stop gives the container 10 s or more (Docker's default is 10). Fix: -e STOP_TIMEOUT=<s> --stop-timeout <s>, the same whole seconds, e.g. 60"
  stop_timeout=10
fi
own_pgid=$(ps -o pgid= -p $$ | tr -d ' ')

# _jobs: the PIDs of every process outside the services that is part of a job: in tmux, an
# SSH session, a JupyterLab terminal or from `docker exec`. Not in the services' process
# groups (ours, Jupyter's, sshd's), not PID 1, tmux's server or an sshd process, not a notebook
# kernel or what runs under one (Jupyter shuts its kernels down itself). A shell that leads its
# session (a tmux pane's, a terminal's, an SSH login's) is left alone too: signalled, it would
# end and its terminal's SIGHUP would kill the job it started before the job had saved. So
# each job process is signalled, not its group.
# shellcheck disable=SC2329  # called by stop_jobs, from the signal trap
_jobs() {
  local kernels
  kernels=" $(pgrep -d ' ' -f 'ipykernel_launcher') "
  ps -eo pid=,ppid=,pgid=,sid=,comm= | awk -v kernels="$kernels" \
      -v services=" $own_pgid ${jupyter_pid:-0} ${sshd_pid:-0} " '
    { ppid[$1] = $2 + 0; pg[$1] = $3 + 0; sid[$1] = $4 + 0
      c = $0; sub(/^ *[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ /, "", c); comm[$1] = c }
    END {
      for (p in pg) {
        if (p + 0 == 1 || pg[p] == 1 || index(services, " " pg[p] " ")) continue
        if (comm[p] ~ /^tmux|^sshd$|^docker-init$|^tini$/) continue
        if (comm[p] ~ /^-?(ba|da|z|fi|)sh$/ && sid[p] == p + 0) continue
        for (q = p + 0; q > 1 && !index(kernels, " " q " "); q = ppid[q] + 0) {}
        if (q <= 1) print p
      }
    }' | sort -n
}

# stop_jobs: SIGTERM each job process, then wait for them until the jobs' deadline.
# shellcheck disable=SC2329  # called by on_signal (a trap)
stop_jobs() {
  local jobs left line start=$SECONDS deadline=$((SECONDS + stop_timeout - 3))
  jobs=$(_jobs | paste -sd,)
  [ -n "$jobs" ] || return 0
  log_info "Stopping jobs still running outside the services (SIGTERM, up to $((stop_timeout - 3)) s to end: STOP_TIMEOUT=$stop_timeout less 3 s for the services):"
  while read -r line; do log_info "  ${line:0:160}"; done < <(ps -o pid=,user=,args= -p "$jobs")
  # shellcheck disable=SC2046  # one PID per word
  kill -TERM $(tr , ' ' <<<"$jobs") 2>/dev/null
  # Until each has ended (a zombie waiting for its parent to reap it has ended too).
  while left=$(ps -o pid=,stat= -p "$jobs" | awk '$2 !~ /^Z/ { print $1 }' | paste -sd,) && [ -n "$left" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log_warn "Jobs still running after $((stop_timeout - 3)) s are killed with the container: $(ps -o pid=,args= -p "$left" | sed "s/^ *//" | cut -c1-100 | paste -sd';'). Fix: -e STOP_TIMEOUT=<s> --stop-timeout <s> (make run and make stop: STOP_TIMEOUT=<s>; compose: STOP_TIMEOUT=<s> in .env)"
      return 0
    fi
    sleep 0.2
  done
  log_info "The jobs ended in time ($((SECONDS - start)) s of their $((stop_timeout - 3)) s)"
}

# stop_all: SIGTERM both, then SIGKILL what is left by the stop's deadline, inside Docker's
# stop timeout (STOP_TIMEOUT, default 10 s).
stop_all() {
  local pid deadline=${stop_deadline:-$((SECONDS + 8))}
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
  stop_deadline=$((SECONDS + stop_timeout - 1))
  log_info "Received $1: stopping JupyterLab${sshd_pid:+ and sshd}"
  stop_jobs
  stop_all
  log_info "Stopped cleanly"
  exit 0
}
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT

mkdir -p "$state" 2>/dev/null || { state=/tmp/team-run; mkdir -p "$state" 2>/dev/null; } || state=""

# Each service in a process group of its own (job control on while they start): tini -g's
# SIGTERM then reaches this script alone, which lets the jobs save first (stop_jobs) and only
# then stops the services. In our group, Jupyter began its shutdown at once, and a job in one
# of its terminals got the terminal's SIGHUP before it had saved.
set -m
# The SSH step (30-ssh.sh) enables sshd only with a key and when we run as root.
if [ "${SSHD_ENABLED:-0}" = 1 ]; then
  install -d -m 0755 /run/sshd   # privilege separation directory, lost with /run
  # sshd records each terminal login in utmp; without the file every logout logged
  # "syslogin_perform_logout: logout() returned an error".
  [ -e /run/utmp ] || install -m 0664 -g utmp /dev/null /run/utmp 2>/dev/null || true
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
# token or password reaches `docker logs`; the redactor ends when Jupyter closes the pipe. It
# runs as the user too: it reads only that user's token files, and root gains nothing.
as_nb_user --exec env -u TEAM_JUPYTER_URL -u SSHD_ENABLED -u SSHD_OFF_ASKED HOME="$NB_HOME" USER="$run_as" LOGNAME="$run_as" \
  SHELL=/bin/bash jupyter lab \
  > >(as_nb_user --exec /usr/local/lib/team/jupyter-log-redact "$TEAM_JUPYTER_DIR" >&2) 2>&1 &
jupyter_pid=$!
set +m

if [ -n "$state" ]; then
  # For the healthcheck: what to probe. No secrets here.
  printf 'JUPYTER_PORT=%s\nSSHD_ENABLED=%s\n' "$JUPYTER_PORT" "${sshd_pid:+1}" > "$state/services.env"
fi

# The ready line, once Jupyter answers (a few seconds; it exits on its own if Jupyter dies).
ready_deadline=$((SECONDS + 300))
while kill -0 "$jupyter_pid" 2>/dev/null && [ "$SECONDS" -lt "$ready_deadline" ]; do
  if curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$JUPYTER_PORT/api" 2>/dev/null; then
    if [ -n "$sshd_pid" ] && [ -n "${HOST_PORT_SSH:-}" ]; then
      # make run and compose say which host port they publish 22 on: a line to paste.
      ssh_note="SSH on: ssh -p $HOST_PORT_SSH -t $NB_USER@localhost tmux new -A -s main"
    elif [ -n "$sshd_pid" ]; then
      ssh_note="SSH on: ssh -p <host port of 22> -t $NB_USER@<host> tmux new -A -s main"
    elif [ -z "${SSHD_OFF_ASKED:-}" ] && [ "$(id -u)" = 0 ] && [ ! -s "$(getent passwd "$NB_USER" | cut -d: -f6)/.ssh/authorized_keys" ]; then
      # No key at all (not SSHD_ENABLED=0, not --user): the one case a user can fix by adding one.
      # shellcheck disable=SC2016  # printed for the user to paste, not expanded here
      ssh_note='SSH off: no public key; add one with -e PUBLIC_KEY="$(cat ~/.ssh/id_ed25519.pub)" -p 2222:22 (make run does it when ~/.ssh has one)'
    else ssh_note="SSH off"; fi
    if as_nb_user test -w /workspace; then
      log_info "==> READY  JupyterLab: $TEAM_JUPYTER_URL  |  $ssh_note"
    else
      # Up, but not what READY promises: the ERROR at start-up says why and the fix.
      log_warn "==> READY  JupyterLab: $TEAM_JUPYTER_URL  |  $ssh_note  |  but /workspace is not writable by $NB_USER: notebooks cannot be saved there (the ERROR above has the fix)"
    fi
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
