# shellcheck shell=bash
# The one way the entrypoint, its steps and services.sh drop privileges:
#   as_nb_user [--exec] CMD...
# runs CMD as $NB_USER (UID/GID as remapped by 10-user.sh, with its groups) when we are root,
# and as ourselves after a --user start. --exec replaces the calling shell with CMD.
as_nb_user() {
  local prefix=()
  [ "$(id -u)" = 0 ] && prefix=(setpriv --reuid="$NB_USER" --regid="$NB_USER" --init-groups)
  if [ "${1:-}" = --exec ]; then
    shift
    exec "${prefix[@]}" "$@"
  fi
  "${prefix[@]}" "$@"
}
