#!/usr/bin/env bash
# Container entrypoint, under tini (PID 1): run the numbered setup steps, then the user's hooks,
# then either the given command (as the non-root user) or the services (sshd + JupyterLab).
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib/team/log.sh
source /usr/local/lib/team/log.sh

# Setup steps: small scripts, one concern each, sourced in order so they can set variables
# for later steps (e.g. SSHD_ENABLED). Root-only steps check `id -u` themselves.
for step in /usr/local/lib/team/entrypoint.d/*.sh; do
  # shellcheck source=/dev/null
  source "$step"
done

# User hooks from a mounted directory: *.sh are sourced, other executables are run.
HOOKS_DIR=${HOOKS_DIR:-/etc/team/hooks.d}
if [ -d "$HOOKS_DIR" ]; then
  for hook in "$HOOKS_DIR"/*; do
    case "$hook" in
      *.sh) log_info "Sourcing hook $hook"; # shellcheck source=/dev/null
            source "$hook" ;;
      *) if [ -f "$hook" ] && [ -x "$hook" ]; then log_info "Running hook $hook"; "$hook"; fi ;;
    esac
  done
fi

if [ $# -gt 0 ]; then
  log_info "Executing: $*"
  if [ "$(id -u)" = 0 ]; then
    exec setpriv --reuid="$NB_USER" --regid="$NB_USER" --init-groups \
      env HOME="/home/$NB_USER" USER="$NB_USER" LOGNAME="$NB_USER" "$@"
  fi
  exec "$@"
fi
exec /usr/local/lib/team/services.sh
