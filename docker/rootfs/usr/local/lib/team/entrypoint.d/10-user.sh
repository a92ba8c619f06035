# shellcheck shell=bash
# Setup step (sourced, as root): give $NB_USER the UID/GID of the host user who owns a
# bind-mounted /workspace (or HOST_UID/HOST_GID), so files it writes there belong to that user.

# Field 5 of mountinfo is the mount point: a bind mount of a host directory shows up there.
# A plain shell variable (not exported): later steps read it too (15-cache.sh).
WORKSPACE_MOUNTED=0
if awk '$5 == "/workspace" { found = 1 } END { exit !found }' /proc/self/mountinfo; then
  WORKSPACE_MOUNTED=1
fi

[ "$(id -u)" = 0 ] || return 0   # started with --user: nothing to remap, we run as given

_user_step() {
  local want_uid want_gid old_uid old_gid ws_uid ws_gid home
  old_uid=$(id -u "$NB_USER"); old_gid=$(id -g "$NB_USER")
  home=$(getent passwd "$NB_USER" | cut -d: -f6)
  ws_uid=$(stat -c %u /workspace); ws_gid=$(stat -c %g /workspace)

  want_uid=${HOST_UID:-}; want_gid=${HOST_GID:-}
  # A root-owned mount (Docker Desktop, a directory Docker created) says nothing about the
  # host user, and following it would make Jupyter run as root: keep the image's UID then.
  if [ -z "$want_uid" ] && [ "$WORKSPACE_MOUNTED" = 1 ] && [ "$ws_uid" != 0 ]; then
    want_uid=$ws_uid; want_gid=${want_gid:-$ws_gid}
  fi
  want_uid=${want_uid:-$old_uid}; want_gid=${want_gid:-$old_gid}
  case "$want_uid$want_gid" in
    *[!0-9]*) log_error "HOST_UID/HOST_GID must be numbers (got '$want_uid'/'$want_gid'). Fix: -e HOST_UID=\$(id -u) -e HOST_GID=\$(id -g)"; exit 64 ;;
  esac
  if [ "$want_uid" = 0 ] || [ "$want_gid" = 0 ]; then
    log_error "HOST_UID/HOST_GID=0 would run JupyterLab and SSH sessions as root; refused. Fix: -e HOST_UID=\$(id -u) -e HOST_GID=\$(id -g), or GRANT_SUDO=1 for root access"
    exit 64
  fi

  if [ "$want_gid" != "$old_gid" ]; then
    # -o: the host GID may already name a group in the image (e.g. 100 "users").
    groupmod -o -g "$want_gid" "$NB_USER"
  fi
  if [ "$want_uid" != "$old_uid" ]; then
    usermod -o -u "$want_uid" "$NB_USER"
  fi
  if [ "$want_uid" != "$old_uid" ] || [ "$want_gid" != "$old_gid" ]; then
    # Only what the old IDs owned: quick on a fresh home, and a mounted home's other files stay.
    find "$home" -xdev \( -uid "$old_uid" -o -gid "$old_gid" \) -exec chown -h "$want_uid:$want_gid" {} +
    if [ "$WORKSPACE_MOUNTED" = 0 ]; then chown "$want_uid:$want_gid" /workspace; fi
    log_info "User $NB_USER is now UID $want_uid, GID $want_gid (was $old_uid:$old_gid)"
  fi

  if [ "${GRANT_SUDO:-0}" = 1 ]; then
    printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$NB_USER" > /etc/sudoers.d/90-team-nb-user
    chmod 0440 /etc/sudoers.d/90-team-nb-user
    log_info "GRANT_SUDO=1: $NB_USER has passwordless sudo"
  else
    rm -f /etc/sudoers.d/90-team-nb-user
  fi

  if ! setpriv --reuid="$NB_USER" --regid="$NB_USER" --init-groups test -w /workspace; then
    log_error "/workspace (owner $(stat -c %u:%g /workspace), mode $(stat -c %a /workspace)) is not writable by $NB_USER (UID $want_uid): notebooks and files cannot be saved. Fix: -e HOST_UID=\$(id -u) -e HOST_GID=\$(id -g), or on the host: chown \$(id -u):\$(id -g) <dir>"
  fi
  export NB_UID=$want_uid NB_GID=$want_gid
}
_user_step
unset -f _user_step
