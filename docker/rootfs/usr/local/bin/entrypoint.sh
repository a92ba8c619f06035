#!/usr/bin/env bash
# Container entrypoint, under tini (PID 1): run the numbered setup steps, then the user's hooks,
# then either the given command (as the non-root user) or the services (sshd + JupyterLab).
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib/team/log.sh
source /usr/local/lib/team/log.sh
# shellcheck source=SCRIPTDIR/../lib/team/user.sh
source /usr/local/lib/team/user.sh

# Setup steps: small scripts, one concern each, sourced in order. What each reads and sets (the
# user's -e variables aside) is listed here; a step uses nothing else from the ones before it.
# Plain shell variables are for later steps only; exported ones also reach services.sh, and
# from there Jupyter, or the command.
#   (here)         sets    START_SERVICES: 1 with no command (sshd + JupyterLab), 0 with one
#   10-user.sh     sets    WORKSPACE_MOUNTED (/workspace is a mount), ROOT_READONLY (--read-only)
#                  exports NB_UID NB_GID NB_HOME (the user as remapped, and its writable home)
#   15-cache.sh    reads   WORKSPACE_MOUNTED NB_UID
#                  exports XDG_CACHE_HOME TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
#   20-checks.sh   reads   /usr/share/team-image/versions.json (the build's record)
#                  sets    GPUS_AT_START ("index, name" of each GPU nvidia-smi lists)
#   25-gpu-record.sh reads GPUS_AT_START; writes /run/team/gpus (for the healthcheck)
#   30-ssh.sh      reads   START_SERVICES ROOT_READONLY; exports SSHD_ENABLED; unsets PUBLIC_KEY
#   35-env.sh      reads   ROOT_READONLY; writes /etc/team/environment (for SSH sessions, tmux)
#   40-jupyter.sh  reads   START_SERVICES ROOT_READONLY SSHD_ENABLED
#                  exports JUPYTER_PORT TEAM_JUPYTER_DIR TEAM_JUPYTER_URL; unsets JUPYTER_TOKEN
#                          JUPYTER_PASSWORD_HASH
#   services.sh    reads   SSHD_ENABLED NB_HOME JUPYTER_PORT TEAM_JUPYTER_DIR TEAM_JUPYTER_URL
# Root-only steps check `id -u` themselves.
# shellcheck disable=SC2034  # read by the sourced steps
START_SERVICES=$(( $# == 0 ))
for step in /usr/local/lib/team/entrypoint.d/*.sh; do
  # shellcheck source=/dev/null
  source "$step"
done

# run_hooks DIR: the user's hooks, in name order: *.sh are sourced (so they can export
# variables for what follows), other executables run, the rest ignored. The first hook that
# fails stops the container, named in the log with its exit status: a half-applied setup
# must not start the services as if all were well.
run_hooks() {
  local dir=$1 hook
  [ -d "$dir" ] || return 0
  for hook in "$dir"/*; do
    [ -e "$hook" ] || continue
    case "$hook" in
      *.sh)
        log_info "Sourcing hook $hook"
        # set -e ends the entrypoint at the hook's first failing command; say which hook.
        trap '_hook_failed "$hook" $?' ERR
        # shellcheck source=/dev/null
        source "$hook"
        trap - ERR ;;
      *)
        if [ -f "$hook" ] && [ -x "$hook" ]; then
          log_info "Running hook $hook"
          "$hook" || _hook_failed "$hook" $?
        else
          log_info "Ignoring hook $hook (not executable and not *.sh)"
        fi ;;
    esac
  done
}
_hook_failed() {
  log_error "Hook $1 failed (exit status $2); the container stops. Fix: correct or remove it in ${HOOKS_DIR}"
  exit "$2"
}
HOOKS_DIR=${HOOKS_DIR:-/etc/team/hooks.d}
run_hooks "$HOOKS_DIR"

if [ $# -gt 0 ]; then
  log_info "Executing: $*"
  if [ "$(id -u)" = 0 ]; then
    as_nb_user --exec env HOME="$NB_HOME" USER="$NB_USER" LOGNAME="$NB_USER" "$@"
  fi
  exec env HOME="$NB_HOME" "$@"
fi
exec /usr/local/lib/team/services.sh
