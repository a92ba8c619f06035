# shellcheck shell=bash
# Setup step (sourced, as root): give $NB_USER the UID/GID of the host user who owns a
# bind-mounted /workspace (or HOST_UID/HOST_GID; NB_UID/NB_GID are the defaults), so files it
# writes there belong to that user. On a non-root start it sets NONROOT_HOW/NONROOT_FIX.
# Sets WORKSPACE_MOUNTED (1 when /workspace is a mount; read by 15-cache.sh), ROOT_READONLY
# (1 under docker run --read-only; read by 30-ssh.sh, 35-env.sh, 40-jupyter.sh) and exports
# NB_UID/NB_GID and NB_HOME (the home Jupyter, SSH sessions and commands get).

# Field 5 of mountinfo is the mount point, field 6 its options ("rw,..." or "ro,...").
WORKSPACE_MOUNTED=0 ROOT_READONLY=0 _ws_opts=""
_ws_opts=$(awk '$5 == "/workspace" { print $6 }' /proc/self/mountinfo | tail -n 1)
[ -z "$_ws_opts" ] || WORKSPACE_MOUNTED=1
case ",$(awk '$5 == "/" { print $6 }' /proc/self/mountinfo | tail -n 1)," in
  *,ro,*) ROOT_READONLY=1 ;;
esac

# _acl_support: "yes" when /workspace's filesystem has POSIX ACLs, "no" when it has none (btrfs
# -o noacl, NFSv4, many NFSv3 exports: setfacl fails there with "Operation not supported"), ""
# when that cannot be told. Only reads: such a filesystem refuses even to look up the ACL
# attribute (EOPNOTSUPP), one with ACLs says there is none (ENODATA). /usr/bin/python3 -I -S:
# the system interpreter without site-packages, so nothing dev can write runs as root.
_acl_support() {
  /usr/bin/python3 -I -S -c '
import errno, os, sys
try:
    os.getxattr("/workspace", "system.posix_acl_access")
except OSError as e:
    sys.exit(3 if e.errno == errno.EOPNOTSUPP else 0 if e.errno == errno.ENODATA else 4)
' 2>/dev/null
  case $? in 0) echo yes ;; 3) echo no ;; *) echo "" ;; esac
}

# _root_owned_fix UID GID: the host step that lets UID write root's own checkout while root stays
# its owner (HOST_UID=$(id -u) would be 0, refused; chown to UID makes root's git refuse the
# checkout as "dubious ownership"): an ACL, or where the filesystem has none, group write.
_root_owned_fix() {
  local acl="setfacl -R -m u:$1:rwX -m d:u:$1:rwX <dir> (apt-get install acl)"
  local group="chgrp -R $2 <dir> && chmod -R g+rwX <dir> && find <dir> -type d -exec chmod g+s {} + (GID $2 is $NB_USER's group; root stays the owner)"
  local owner="chown -R $1:$2 <dir> (root's git then needs: git config --global --add safe.directory <dir>)"
  case $(_acl_support) in
    yes) echo "one step on the host as root (root stays the owner): $acl, then start the container again" ;;
    no) echo "this filesystem has no ACLs (setfacl fails on it: NFS, btrfs -o noacl), so on the host as root give $NB_USER's group write: $group; or hand the checkout over: $owner. Then start the container again" ;;
    *) echo "one step on the host as root (root stays the owner): $acl, then start the container again; where the filesystem has no ACLs (setfacl: Operation not supported), give $NB_USER's group write instead: $group" ;;
  esac
}

# _workspace_unwritable_reason UID: why that user cannot write /workspace, with the fix.
_workspace_unwritable_reason() {
  case ",$_ws_opts," in
    *,ro,*) echo "/workspace is mounted read-only (:ro), so notebooks and files cannot be saved there. Fix: mount it read-write (drop :ro), or mount your data read-only elsewhere (-v DIR:/data:ro) and keep /workspace writable"; return ;;
  esac
  if [ "$WORKSPACE_MOUNTED" = 0 ] && [ "$ROOT_READONLY" = 1 ]; then
    echo "/workspace is on a read-only root filesystem (--read-only). Fix: mount a directory or volume there, e.g. -v \"\$PWD\":/workspace"; return
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "/workspace (owner $(stat -c %u:%g /workspace)) is not writable by UID $1 from --user: notebooks and files cannot be saved. Fix: --user \$(stat -c %u:%g <dir>) to match the directory's owner, or drop --user (the entrypoint then maps $NB_USER to the owner of the mounted /workspace)"; return
  fi
  if [ "$(stat -c %u /workspace)" = 0 ]; then
    # A root-owned checkout (root on a cloud VM): HOST_UID=$(id -u) would be 0, which is refused,
    # and a chown to $1 makes git refuse the checkout to root ("dubious ownership"). An ACL
    # lets UID $1 write while root stays the owner.
    echo "/workspace belongs to root (mode $(stat -c %a /workspace)) and $NB_USER (UID $1) cannot write it: notebooks and files cannot be saved. Fix, $(_root_owned_fix "$1" "$(id -g "$NB_USER")")"; return
  fi
  echo "/workspace (owner $(stat -c %u:%g /workspace), mode $(stat -c %a /workspace)) is not writable by UID $1: notebooks and files cannot be saved. Fix: -e HOST_UID=\$(id -u) -e HOST_GID=\$(id -g), or on the host: chown \$(id -u):\$(id -g) <dir>"
}

# _workspace_check_readable UID: JupyterLab serves /workspace and commands start in it; one its
# user cannot list (mode 000, or 700 and another owner) gave a wrong fix and hundreds of lines
# of Jupyter tracebacks. Stop at once, with the fix that matches the cause.
_workspace_check_readable() {
  local uid=$1 owner mode fix
  as_nb_user test -r /workspace -a -x /workspace && return 0
  owner=$(stat -c %u /workspace); mode=$(stat -c %a /workspace)
  if [ "$owner" = "$uid" ]; then
    fix="on the host, give the owner access back: chmod u+rwx <dir>"
  elif [ "$owner" = 0 ] && [ "$(id -u)" = 0 ]; then
    # Root's own checkout (cloned with umask 077): chown to 0, HOST_UID=0 and o+rx cannot help.
    fix=$(_root_owned_fix "$uid" "$(id -g "$NB_USER")")
  elif [ "$(id -u)" != 0 ]; then
    fix="--user \$(stat -c %u:%g <dir>) to match the directory's owner, or on the host: chmod o+rx <dir>"
  else
    fix="on the host, chmod o+rx <dir> (read only) or chown \$(id -u):\$(id -g) <dir>, or -e HOST_UID=<the owner's UID>"
  fi
  log_error "/workspace (owner $owner, mode $mode) cannot be listed by UID $uid: JupyterLab and commands cannot open it. Fix: $fix"
  exit 64
}

# _pick_home DIR WHO: DIR when WHO can write it, else a private folder in /tmp (a read-only
# root filesystem, or a --user UID with no home of its own). Exports NB_HOME.
_pick_home() {
  local dir=$1 who=$2
  if [ -n "$dir" ] && as_nb_user test -w "$dir" 2>/dev/null; then
    export NB_HOME=$dir; return 0
  fi
  if ! NB_HOME=$(as_nb_user mktemp -d "/tmp/home-$(as_nb_user id -u).XXXXXX" 2>/dev/null); then
    log_error "$who has no writable home (${dir:-none}) and /tmp is not writable either: Jupyter and Python need somewhere to write. Fix: add --tmpfs /tmp (with --read-only), or drop --read-only"
    exit 64
  fi
  export NB_HOME
  if [ "$ROOT_READONLY" = 1 ]; then
    log_info "The root filesystem is read-only: $who's home is $NB_HOME, lost with the container (keep work in /workspace)"
  else
    log_warn "UID $(id -u) (from --user) has no writable home: using $NB_HOME, lost with the container. Fix: drop --user and set HOST_UID/HOST_GID instead"
  fi
}

# _nonroot_how: sets NONROOT_HOW and NONROOT_FIX (read by 30-ssh.sh) for a start that is not
# root: docker run --user, or the image's USER line (a derived image's `USER dev`). No process
# sees which, but Docker gives a user named without a group (USER dev, USER 1000) the
# supplementary groups /etc/group lists for it (dev: users), and a UID:GID (--user
# $(id -u):$(id -g), what the docs show) none: that tells the usual two apart.
_nonroot_how() {
  local name listed have
  name=$(id -un 2>/dev/null) || name=""
  listed=$( [ -z "$name" ] || id -G "$name" 2>/dev/null | tr ' ' '\n' | sort -n | paste -sd' ')
  have=$(id -G | tr ' ' '\n' | sort -n | paste -sd' ')
  local image_fix="end the derived image's Dockerfile with USER root (the entrypoint drops to $NB_USER itself; docs/extending.md)"
  local run_fix="Remove --user (the entrypoint maps $NB_USER to your IDs itself: -e HOST_UID=\$(id -u) -e HOST_GID=\$(id -g))"
  if [ -n "$name" ] && [ "$listed" != "$(id -g)" ] && [ "$have" = "$listed" ]; then
    NONROOT_HOW="the image's USER line, e.g. a derived image's USER $name, or --user $name"
    NONROOT_FIX="$image_fix (or, had you passed --user $name, drop it)"
  elif [ -n "$name" ] && [ "$listed" != "$(id -g)" ]; then
    NONROOT_HOW="docker run --user $(id -u):$(id -g)"
    NONROOT_FIX=$run_fix
  else
    NONROOT_HOW="docker run --user, or the image's USER line"
    NONROOT_FIX="$run_fix; if the image sets USER (docker inspect -f '{{.Config.User}}' IMAGE), $image_fix"
  fi
}

# A non-root start (--user, or the image's USER): nothing to remap (no root), but say so now
# if saving will fail, and that NB_UID/NB_GID cannot be applied.
if [ "$(id -u)" != 0 ]; then
  _nonroot_how
  if [ "${NB_UID:-$(id -u)}" != "$(id -u)" ] || [ "${NB_GID:-$(id -g)}" != "$(id -g)" ]; then
    log_warn "${NB_UID:+NB_UID=$NB_UID }${NB_GID:+NB_GID=$NB_GID }cannot be applied: the container started as UID $(id -u):$(id -g) ($NONROOT_HOW), and only a root start can change $NB_USER's IDs. Fix: $NONROOT_FIX"
  fi
  export NB_UID NB_GID
  NB_UID=$(id -u) NB_GID=$(id -g)
  _pick_home "${HOME:-}" "UID $(id -u)"
  _workspace_check_readable "$(id -u)"
  if [ ! -w /workspace ]; then
    log_error "$(_workspace_unwritable_reason "$(id -u)")"
  fi
  unset _ws_opts; unset -f _workspace_unwritable_reason _pick_home _workspace_check_readable _nonroot_how \
    _acl_support _root_owned_fix
  return 0
fi

# _need_caps: root without CAP_SETUID/CAP_SETGID (e.g. --cap-drop ALL) cannot switch to the
# non-root user, and Jupyter never runs as root: refuse with the two ways that work.
_need_caps() {
  local eff missing=() cap bit
  eff=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
  for cap in CHOWN:0 DAC_OVERRIDE:1 FOWNER:3 SETGID:6 SETUID:7; do
    bit=${cap#*:}
    (( (16#$eff >> bit) & 1 )) || missing+=("${cap%:*}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log_error "The container runs as root without the capabilities the entrypoint needs to switch to $NB_USER (missing: ${missing[*]}; e.g. --cap-drop ALL). Jupyter never runs as root. Fix: start it as the user instead, --user 1000:1000 (SSH is then off), or add them back: $(printf -- '--cap-add %s ' "${missing[@]}")(and --cap-add SYS_CHROOT for SSH)"
  exit 64
}

# _id_from WHAT VALUE VAR: stores VALUE in VAR as a plain decimal number (1..4294967294, Linux's
# range without -1), or exits naming where it came from. Leading zeros are dropped (01000 is
# 1000, 00 is 0) and everything is compared as that number: compared as strings, "00" passed
# the root check and usermod made dev UID 0. Only digits: -0, +5, 0x10 are refused, not guessed.
_id_from() {
  local what=$1 value=$2 digits
  digits=${value#"${value%%[!0]*}"}
  if ! [[ $value =~ ^[0-9]+$ ]] || [ "${#digits}" -gt 10 ] || (( 10#${digits:-0} > 4294967294 )); then
    log_error "$what='$value' is not a valid ID (a decimal number from 1 to 4294967294). Fix: -e HOST_UID=\$(id -u) -e HOST_GID=\$(id -g)"
    exit 64
  fi
  printf -v "$3" '%d' "$((10#${digits:-0}))"
}

# Groups whose members read or change what an ordinary user must not: /etc/shadow (shadow),
# sudo, logs (adm), raw disks and memory (disk, kmem), terminals and login records (tty,
# utmp), /usr/local (Debian's staff), mail spools, ssh-agent's setgid group (_ssh), wheel.
_PRIVILEGED_GROUPS=" root adm disk kmem mail shadow staff sudo tty utmp _ssh wheel "

# _id_taken uid|gid ID: true when ID is another account's UID in the image (root, sshd's
# privilege separation user, nobody, ...), or the GID of a privileged group or of another
# account's own group (daemon, nogroup, ...); _TAKEN then says whose, for the message. dev
# would silently become that account, or read what that group guards.
_id_taken() {
  local name group account
  if [ "$1" = uid ]; then
    name=$(getent passwd "$2" | cut -d: -f1)
    _TAKEN="the UID of the image's '$name' account"
    [ -n "$name" ] && [ "$name" != "$NB_USER" ]
    return
  fi
  group=$(getent group "$2" | cut -d: -f1)
  _TAKEN="the GID of the privileged group '$group'"
  [ -n "$group" ] && [[ $_PRIVILEGED_GROUPS == *" $group "* ]] && return 0
  account=$(getent passwd | awk -F: -v gid="$2" -v me="$NB_USER" '$4 == gid && $1 != me { print $1; exit }')
  _TAKEN="the GID of '${group:-?}', the image's '$account' account's group"
  [ -n "$account" ]
}

_user_step() {
  local want_uid want_gid old_uid old_gid ws_uid ws_gid home uid_from gid_from
  _need_caps
  old_uid=$(id -u "$NB_USER"); old_gid=$(id -g "$NB_USER")
  home=$(getent passwd "$NB_USER" | cut -d: -f6)
  ws_uid=$(stat -c %u /workspace); ws_gid=$(stat -c %g /workspace)

  want_uid=${HOST_UID:-}; want_gid=${HOST_GID:-}
  uid_from=HOST_UID gid_from=HOST_GID
  # A root-owned mount (Docker Desktop, a directory Docker created) says nothing about the
  # host user, and following it would make Jupyter run as root: keep the image's UID then.
  # A root *group* alone (4242:0, common for dirs made by root with a user's UID) keeps the
  # image's GID the same way, rather than refusing a variable the user never set. Another
  # account's UID (sshd's 100, nobody's 65534) or a privileged group is not followed either.
  if [ -z "$want_uid" ] && [ "$WORKSPACE_MOUNTED" = 1 ]; then
    if ! _id_taken uid "$ws_uid"; then
      want_uid=$ws_uid uid_from="the owner of the mounted /workspace"
      if [ -z "$want_gid" ] && ! _id_taken gid "$ws_gid"; then
        want_gid=$ws_gid gid_from="the group of the mounted /workspace"
      elif [ -z "$want_gid" ] && [ "$ws_gid" -ne 0 ]; then
        log_info "The mounted /workspace's group $ws_gid is $_TAKEN: $NB_USER keeps GID $old_gid (-e HOST_GID=\$(id -g) sets it)"
      fi
    elif [ "$ws_uid" -ne 0 ]; then
      log_info "The mounted /workspace belongs to UID $ws_uid, $_TAKEN: $NB_USER keeps UID $old_uid (-e HOST_UID=\$(id -u) -e HOST_GID=\$(id -g) sets it)"
    fi
  fi
  # NB_UID/NB_GID (docker-stacks' names: a derived image's ENV NB_UID=3000, or -e NB_UID): the
  # user's default IDs, as a derived image's usermod would set them. HOST_UID/HOST_GID and a
  # mounted /workspace's owner still win, as over the image's own default.
  if [ -n "${NB_UID:-}" ]; then
    if [ -z "$want_uid" ]; then want_uid=$NB_UID uid_from=NB_UID
    else log_info "NB_UID=$NB_UID is the default; $uid_from ($want_uid) overrides it"; fi
  fi
  if [ -n "${NB_GID:-}" ]; then
    if [ -z "$want_gid" ]; then want_gid=$NB_GID gid_from=NB_GID
    else log_info "NB_GID=$NB_GID is the default; $gid_from ($want_gid) overrides it"; fi
  fi
  want_uid=${want_uid:-$old_uid}; want_gid=${want_gid:-$old_gid}
  _id_from "$uid_from" "$want_uid" want_uid
  _id_from "$gid_from" "$want_gid" want_gid
  if [ "$want_uid" -eq 0 ]; then
    log_error "$uid_from=0 would run JupyterLab and SSH sessions as root; refused. Fix: -e HOST_UID=\$(id -u) -e HOST_GID=\$(id -g), or GRANT_SUDO=1 for root access"
    exit 64
  fi
  if [ "$want_gid" -eq 0 ]; then
    log_error "$gid_from=0 would give JupyterLab and SSH sessions the root group; refused. Fix: -e HOST_GID=\$(id -g), or leave HOST_GID unset"
    exit 64
  fi
  if _id_taken uid "$want_uid"; then
    log_error "$uid_from=$want_uid is $_TAKEN: $NB_USER would silently share it (and its files and processes); refused. Fix: -e HOST_UID=\$(id -u) with your own UID (the image's system accounts are below 1000, and nobody is 65534), or leave HOST_UID unset"
    exit 64
  fi
  if _id_taken gid "$want_gid"; then
    log_error "$gid_from=$want_gid is $_TAKEN: $NB_USER would share what it guards; refused. Fix: -e HOST_GID=\$(id -g) with your own group, or leave HOST_GID unset"
    exit 64
  fi

  if [ "$want_uid" -ne "$old_uid" ] || [ "$want_gid" -ne "$old_gid" ] || [ "${GRANT_SUDO:-0}" = 1 ]; then
    if [ "$ROOT_READONLY" = 1 ]; then
      log_error "Cannot make $NB_USER UID $want_uid:$want_gid (from $uid_from) or grant sudo: the root filesystem is read-only (--read-only). Fix: --user $want_uid:$want_gid instead of HOST_UID/HOST_GID (no sudo), or drop --read-only"
      exit 64
    fi
  fi
  if [ "$want_gid" -ne "$old_gid" ]; then
    # -o: the host GID may already name a group in the image (e.g. 100 "users").
    groupmod -o -g "$want_gid" "$NB_USER"
  fi
  if [ "$want_uid" -ne "$old_uid" ]; then
    usermod -o -u "$want_uid" "$NB_USER"
  fi
  if [ "$want_uid" -ne "$old_uid" ] || [ "$want_gid" -ne "$old_gid" ]; then
    # Only what the old IDs owned: quick on a fresh home, and a mounted home's other files stay.
    find "$home" -xdev \( -uid "$old_uid" -o -gid "$old_gid" \) -exec chown -h "$want_uid:$want_gid" {} +
    if [ "$WORKSPACE_MOUNTED" = 0 ]; then chown "$want_uid:$want_gid" /workspace; fi
    log_info "User $NB_USER is now UID $want_uid, GID $want_gid (was $old_uid:$old_gid)"
  fi

  if [ "${GRANT_SUDO:-0}" = 1 ]; then
    printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$NB_USER" > /etc/sudoers.d/90-team-nb-user
    chmod 0440 /etc/sudoers.d/90-team-nb-user
    # --security-opt no-new-privileges makes the kernel ignore sudo's setuid bit: say so now,
    # not when the user's first sudo fails.
    if grep -Eq '^NoNewPrivs:[[:space:]]*1' /proc/self/status; then
      log_warn "GRANT_SUDO=1, but the container runs with no-new-privileges (--security-opt no-new-privileges), under which sudo cannot work: the kernel ignores its setuid bit. Fix: drop --security-opt no-new-privileges, or run root commands with docker exec -u root CONTAINER ..."
    else
      log_info "GRANT_SUDO=1: $NB_USER has passwordless sudo"
    fi
  elif [ -e /etc/sudoers.d/90-team-nb-user ]; then
    rm -f /etc/sudoers.d/90-team-nb-user
  fi

  _workspace_check_readable "$want_uid"
  if ! as_nb_user test -w /workspace; then
    log_error "$(_workspace_unwritable_reason "$want_uid")"
  fi
  export NB_UID=$want_uid NB_GID=$want_gid
  _pick_home "$home" "$NB_USER"
}
_user_step
unset _ws_opts _PRIVILEGED_GROUPS _TAKEN
unset -f _user_step _need_caps _id_from _id_taken _workspace_unwritable_reason _pick_home \
  _workspace_check_readable _nonroot_how _acl_support _root_owned_fix
