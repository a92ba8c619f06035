#!/usr/bin/env bash
# Container entrypoint (PID 2, under tini). Minimal first version: run the given command as
# the non-root user. The services (sshd, JupyterLab) arrive with the entrypoint issue.
set -euo pipefail
if [ "$(id -u)" = 0 ] && [ $# -gt 0 ]; then
  exec setpriv --reuid="${NB_USER}" --regid="${NB_USER}" --init-groups \
    env HOME="/home/${NB_USER}" USER="${NB_USER}" "$@"
fi
exec "$@"
