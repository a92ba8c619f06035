# shellcheck shell=bash
# Root runs nothing user dev can write. /opt/venv is group-writable for dev by design (pip
# install), and the image's PATH holds /opt/venv/bin, where dev can put a file named `id`,
# `setpriv` or `curl`: found there by root's PATH search, it would run as root at the next
# start or health check. So a root shell of the image (entrypoint, its steps, services.sh, the
# healthcheck) searches the system's root-owned folders only, and what runs as the user gets
# the PATH it was given back (as_nb_user): TEAM_USER_PATH keeps it, for services.sh and
# 35-env.sh too.
TEAM_ROOT_PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "$(/usr/bin/id -u)" = 0 ]; then
  export TEAM_USER_PATH=${TEAM_USER_PATH:-$PATH}
  PATH=$TEAM_ROOT_PATH
fi

# The one way the entrypoint, its steps and services.sh drop privileges:
#   as_nb_user [--exec] CMD...
# runs CMD as $NB_USER (UID/GID as remapped by 10-user.sh, with its groups) when we are root,
# and as ourselves after a --user start. --exec replaces the calling shell with CMD.
as_nb_user() {
  local prefix=()
  # As root: the user's PATH back (see above), by env's absolute path, not searched for.
  [ "$(id -u)" = 0 ] && prefix=(setpriv --reuid="$NB_USER" --regid="$NB_USER" --init-groups
    /usr/bin/env -u TEAM_USER_PATH PATH="${TEAM_USER_PATH:-$PATH}")
  if [ "${1:-}" = --exec ]; then
    shift
    exec "${prefix[@]}" "$@"
  fi
  "${prefix[@]}" "$@"
}
