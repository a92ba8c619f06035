#!/bin/bash
# Container entrypoint, under tini (PID 1): run the numbered setup steps, then the user's hooks,
# then either the given command (as the non-root user) or the services (sshd + JupyterLab).
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib/team/log.sh
source /usr/local/lib/team/log.sh
# shellcheck source=SCRIPTDIR/../lib/team/user.sh
source /usr/local/lib/team/user.sh
# From here the venv is dev's to change: python/pip (venv-exec) refuse root in this container.
# Not on a read-only root: /run cannot be written, nor can the venv.
if [ "$(id -u)" = 0 ]; then
  { install -d -m 755 /run/team && : > /run/team/started; } 2>/dev/null || true
fi

# Setup steps: small scripts, one concern each, sourced in order. What each reads and sets (the
# user's -e variables aside) is listed here; a step uses nothing else from the ones before it.
# Plain shell variables are for later steps only; exported ones also reach services.sh, and
# from there Jupyter, or the command.
#   user.sh        exports TEAM_USER_PATH (the PATH the user's processes get back; root's own
#                          PATH holds system folders only)
#   (here)         sets    START_SERVICES: 1 with no command (sshd + JupyterLab), 0 with one
#   10-user.sh     sets    WORKSPACE_MOUNTED (/workspace is a mount), ROOT_READONLY (--read-only),
#                          NONROOT_HOW NONROOT_FIX (a non-root start: how it came, how to undo it)
#                  exports NB_UID NB_GID NB_HOME (the user as remapped, and its writable home)
#   15-cache.sh    reads   WORKSPACE_MOUNTED NB_UID
#                  exports XDG_CACHE_HOME TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
#   20-checks.sh   reads   /usr/share/team-image/versions.json (the build's record)
#                  sets    GPUS_AT_START ("index, name" of each GPU nvidia-smi lists)
#   25-gpu-record.sh reads GPUS_AT_START; writes /run/team/gpus (for the healthcheck)
#   30-ssh.sh      reads   START_SERVICES ROOT_READONLY NONROOT_HOW NONROOT_FIX; exports SSHD_ENABLED (SSHD_OFF_ASKED);
#                          unsets PUBLIC_KEY
#   35-env.sh      reads   ROOT_READONLY ENTRYPOINT_ONLY; writes /etc/team/environment (for SSH
#                          sessions, tmux)
#   40-jupyter.sh  reads   START_SERVICES ROOT_READONLY SSHD_ENABLED
#                  exports JUPYTER_PORT TEAM_JUPYTER_DIR TEAM_JUPYTER_URL; unsets JUPYTER_TOKEN
#                          JUPYTER_PASSWORD_HASH
#   services.sh    reads   SSHD_ENABLED SSHD_OFF_ASKED NB_HOME JUPYTER_PORT TEAM_JUPYTER_DIR TEAM_JUPYTER_URL
# Root-only steps check `id -u` themselves.
# shellcheck disable=SC2034  # read by the sourced steps
START_SERVICES=$(( $# == 0 ))
# What only the entrypoint reads (docs/container.md lists them): unset before the services or
# the command start, so neither Jupyter, its kernels, SSH sessions nor /proc/PID/environ of a
# process of the user holds them (the secrets among them are also unset by their steps).
ENTRYPOINT_ONLY="PUBLIC_KEY PUBLIC_KEY_FILE JUPYTER_TOKEN JUPYTER_TOKEN_FILE JUPYTER_PASSWORD_HASH
  JUPYTER_PASSWORD_HASH_FILE JUPYTER_ALLOW_INSECURE HOST_UID HOST_GID GRANT_SUDO SSH_HOST_KEYS_DIR"
for step in /usr/local/lib/team/entrypoint.d/*.sh; do
  # shellcheck source=/dev/null
  source "$step"
done

# run_hooks DIR: the user's hooks, in name order: *.sh are sourced (so they can export
# variables for what follows), other executables run, the rest ignored. The first hook that
# fails stops the container, named in the log with its exit status: a half-applied setup
# must not start the services as if all were well. `exit` in a sourced hook ends this shell,
# not just the hook: `exit 0` used to end the start quietly with status 0 (no services, no
# error, and --restart on-failure saw a success), so it is a failure too, named with the fix.
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
        trap '_hook_exited "$hook" $?' EXIT
        # shellcheck source=/dev/null
        source "$hook"
        trap - ERR EXIT ;;
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
  trap - EXIT
  log_error "Hook $1 failed (exit status $2); the container stops. Fix: correct or remove it in ${HOOKS_DIR}"
  exit "$2"
}
# The EXIT trap of a sourced hook's `exit N`: the entrypoint is ending inside the hook.
_hook_exited() {
  trap - EXIT
  log_error "Hook $1 ran 'exit $2': *.sh hooks are sourced by the entrypoint, so exit ends the container's start (no services, no command); the container stops. Fix: use 'return $2' instead of 'exit' in it, or make it an executable file without .sh (run as a program)"
  exit $(( $2 == 0 ? 1 : $2 ))
}
HOOKS_DIR=${HOOKS_DIR:-/etc/team/hooks.d}
run_hooks "$HOOKS_DIR"
# shellcheck disable=SC2086  # one name per word
unset $ENTRYPOINT_ONLY ENTRYPOINT_ONLY

if [ $# -gt 0 ]; then
  log_info "Executing: $*"
  if [ "$(id -u)" = 0 ]; then
    as_nb_user --exec env HOME="$NB_HOME" USER="$NB_USER" LOGNAME="$NB_USER" "$@"
  fi
  exec env HOME="$NB_HOME" "$@"
fi
exec /usr/local/lib/team/services.sh
