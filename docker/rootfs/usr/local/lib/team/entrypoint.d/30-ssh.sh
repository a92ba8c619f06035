# shellcheck shell=bash
# Step 30: SSH. Installs the user's public keys (PUBLIC_KEY, PUBLIC_KEY_FILE, /etc/team/authorized_keys)
# once each, makes per-container host keys (kept in SSH_HOST_KEYS_DIR if set), decides SSHD_ENABLED.

# Keys mounted here (read-only is fine) are merged into the user's authorized_keys.
_SSH_MOUNTED_KEYS=/etc/team/authorized_keys
# shellcheck disable=SC2016  # printed for the user to paste, not expanded here
_SSH_HOW='-e PUBLIC_KEY="$(cat ~/.ssh/id_ed25519.pub)"'
_SSH_NEW=()         # validated key lines not yet in authorized_keys
_SSH_FPS=" "        # fingerprints already present or queued: each key goes in once
_SSH_HAVE=0         # keys in authorized_keys once merged (_ssh_merge_keys)

# Fails the container with the source's name and the fix; never echoes the rejected value,
# which could be a private key pasted by mistake.
_ssh_die() {
  log_error "$1"
  log_error "Fix: pass your *public* key, one per line, e.g. $_SSH_HOW, or mount a file and set PUBLIC_KEY_FILE."
  exit 1
}

# _ssh_fingerprint LINE: prints the SHA256 fingerprint, or fails if LINE is not a public key
# (authorized_keys options such as from="..." are allowed).
_ssh_fingerprint() {
  local out
  out=$(ssh-keygen -l -f - <<<"$1" 2>/dev/null) || return 1
  printf '%s\n' "${out#* }" | cut -d' ' -f1
}

# _ssh_add SOURCE TEXT: validates every non-blank, non-comment line of TEXT; queues the new ones.
_ssh_add() {
  local source=$1 text=$2 line fp n=0
  if [[ $text == *"PRIVATE KEY"* ]]; then
    _ssh_die "$source holds a PRIVATE key. Never share it: treat it as leaked and use the .pub file."
  fi
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%$'\r'}
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    fp=$(_ssh_fingerprint "$line") \
      || _ssh_die "$source line $n is not a valid SSH public key (ssh-keygen -l rejects it)."
    [[ $_SSH_FPS == *" $fp "* ]] && continue
    _SSH_FPS+="$fp "
    _SSH_NEW+=("$line")
  done <<<"$text"
}

# Host keys: generated at first start, never in the image, so every container has its own;
# with SSH_HOST_KEYS_DIR (a mounted volume) they are reused, so clients see the same host.
_ssh_host_keys() {
  local dir=${SSH_HOST_KEYS_DIR:-/etc/ssh} type key dst pub made="" fps="" bits
  if [ "$dir" != /etc/ssh ]; then
    mkdir -p "$dir" 2>/dev/null || _ssh_die_hostdir "cannot create SSH_HOST_KEYS_DIR=$dir"
    # Private host keys live here: only root may read it (a read-only mount keeps its mode).
    chmod 700 "$dir" 2>/dev/null || true
  fi
  for type in ed25519 ecdsa rsa; do
    key=$dir/ssh_host_${type}_key
    dst=/etc/ssh/ssh_host_${type}_key
    if [ ! -e "$key" ]; then
      bits=(); [ "$type" = rsa ] && bits=(-b 3072)
      ssh-keygen -q -t "$type" "${bits[@]}" -N '' -C "" -f "$key" </dev/null \
        || _ssh_die_hostdir "cannot write $key (is SSH_HOST_KEYS_DIR writable?)"
      made+=" $type"
    fi
    chmod 600 "$key" 2>/dev/null || true   # a read-only mount keeps its mode; the copy is 600
    if [ "$key" != "$dst" ]; then
      install -m 600 -o root -g root "$key" "$dst"
    fi
    pub=$(ssh-keygen -y -f "$dst" 2>/dev/null) \
      || _ssh_die_hostdir "$key is not a usable private key (delete it to make a new one)"
    printf '%s\n' "$pub" >"$dst.pub"
    chmod 644 "$dst.pub"
    # `ssh-keygen -l` prints "bits SHA256:... comment (TYPE)"; keep "TYPE SHA256:...".
    fps+=" $(ssh-keygen -l -f "$dst.pub" | awk '{t = $NF; gsub(/[()]/, "", t); print t " " $2}')"
  done
  if [ -n "$made" ]; then
    log_info "SSH host keys generated in $dir:$made"
  else
    log_info "SSH host keys reused from $dir"
  fi
  log_info "SSH host key fingerprints (compare on first connect):$fps"
}

_ssh_die_hostdir() {
  log_error "SSH host keys: $1."
  log_error "Fix: mount a writable directory, e.g. -v team-ssh-hostkeys:/etc/team/ssh-host-keys -e SSH_HOST_KEYS_DIR=/etc/team/ssh-host-keys"
  exit 1
}

# _ssh_collect_keys: validates and queues the keys from PUBLIC_KEY, PUBLIC_KEY_FILE and the
# mounted authorized_keys file.
_ssh_collect_keys() {
  if [ -n "${PUBLIC_KEY:-}" ]; then
    _ssh_add PUBLIC_KEY "$PUBLIC_KEY"
  fi
  if [ -n "${PUBLIC_KEY_FILE:-}" ]; then
    # The fix names a path of its own: mounting the key on PUBLIC_KEY_FILE itself would put a
    # file over a directory such as /etc or /home/dev, or over a system file.
    if [ -d "$PUBLIC_KEY_FILE" ]; then
      _ssh_die "PUBLIC_KEY_FILE=$PUBLIC_KEY_FILE is a directory, not a key file (docker run -v makes one when the host path does not exist). Mount the .pub file itself and point at it: -v ~/.ssh/id_ed25519.pub:/run/secrets/ssh_public_key:ro -e PUBLIC_KEY_FILE=/run/secrets/ssh_public_key"
    fi
    [ -f "$PUBLIC_KEY_FILE" ] && [ -r "$PUBLIC_KEY_FILE" ] \
      || _ssh_die "PUBLIC_KEY_FILE=$PUBLIC_KEY_FILE is not a readable file in the container. Mount the .pub file and point at it: -v ~/.ssh/id_ed25519.pub:/run/secrets/ssh_public_key:ro -e PUBLIC_KEY_FILE=/run/secrets/ssh_public_key"
    _ssh_add "PUBLIC_KEY_FILE ($PUBLIC_KEY_FILE)" "$(cat "$PUBLIC_KEY_FILE")"
    grep -qvE '^[[:space:]]*(#|$)' "$PUBLIC_KEY_FILE" \
      || _ssh_die "PUBLIC_KEY_FILE=$PUBLIC_KEY_FILE contains no key."
  fi
  if [ -f "$_SSH_MOUNTED_KEYS" ]; then
    _ssh_add "$_SSH_MOUNTED_KEYS" "$(cat "$_SSH_MOUNTED_KEYS")"
  fi
}

# _ssh_merge_keys AK UID GID: appends the queued keys AK does not hold yet and sets _SSH_HAVE
# to the number of keys it then holds. Keys already there (persisted home, or a restart)
# count and are not added again.
_ssh_merge_keys() {
  local ak=$1 uid=$2 gid=$3 line fp existing=" " queued=()
  _SSH_HAVE=0
  if [ -f "$ak" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
      [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
      fp=$(_ssh_fingerprint "$line") || continue
      existing+="$fp "
      _SSH_HAVE=$((_SSH_HAVE + 1))
    done <"$ak"
    queued=("${_SSH_NEW[@]}")
    _SSH_NEW=()
    for line in "${queued[@]}"; do
      fp=$(_ssh_fingerprint "$line")
      [[ $existing == *" $fp "* ]] || _SSH_NEW+=("$line")
    done
  fi

  if [ "${#_SSH_NEW[@]}" -gt 0 ]; then
    if [ -e "$ak" ] && [ ! -w "$ak" ]; then
      _ssh_die "$ak is read-only, so PUBLIC_KEY/PUBLIC_KEY_FILE cannot be added; mount your keys at $_SSH_MOUNTED_KEYS instead."
    fi
    # Keep the last existing line intact when the file does not end in a newline.
    if [ -s "$ak" ] && [ -n "$(tail -c1 "$ak")" ]; then echo >>"$ak"; fi
    printf '%s\n' "${_SSH_NEW[@]}" >>"$ak"
    log_info "SSH: added ${#_SSH_NEW[@]} public key(s) to $ak"
  fi
  if [ -w "$ak" ]; then
    chown "$uid:$gid" "$ak" && chmod 600 "$ak"
  fi
  _SSH_HAVE=$((_SSH_HAVE + ${#_SSH_NEW[@]}))
}

_ssh_main() {
  local requested=${SSHD_ENABLED:-} home uid gid ak

  if [ "$(id -u)" != 0 ]; then
    SSHD_ENABLED=0
    if [ -n "${PUBLIC_KEY:-}${PUBLIC_KEY_FILE:-}" ]; then
      log_warn "SSH is off: sshd needs the container to start as root (the entrypoint drops to the user itself), and it started as UID $(id -u) ($NONROOT_HOW). To use PUBLIC_KEY/PUBLIC_KEY_FILE: $NONROOT_FIX"
    fi
    return 0
  fi

  _ssh_collect_keys

  # The user's UID/GID may have been remapped by step 10; ask the passwd database.
  home=$(getent passwd "$NB_USER" | cut -d: -f6)
  uid=$(id -u "$NB_USER"); gid=$(id -g "$NB_USER")
  ak=$home/.ssh/authorized_keys

  # sshd writes host keys to /etc/ssh and reads keys from the home: neither on --read-only.
  if [ "$requested" != 0 ] && [ "${ROOT_READONLY:-0}" = 1 ] && { [ "${#_SSH_NEW[@]}" -gt 0 ] || [ -s "$ak" ]; }; then
    log_error "SSH cannot start on a read-only root filesystem (--read-only): sshd needs to write its host keys and $ak. Fix: drop --read-only, or start without PUBLIC_KEY/PUBLIC_KEY_FILE (or -e SSHD_ENABLED=0) and use docker exec"
    exit 64
  fi
  [ "${#_SSH_NEW[@]}" -eq 0 ] || install -d -m 700 -o "$uid" -g "$gid" "$home/.ssh"

  _ssh_merge_keys "$ak" "$uid" "$gid"

  if [ "$requested" = 0 ]; then
    SSHD_ENABLED=0
    # services.sh's READY line then offers no key fix: off was asked for (make run without a
    # key asks, and prints the one fix itself).
    export SSHD_OFF_ASKED=1
    log_info "SSH is off (SSHD_ENABLED=0)."
  elif [ "$_SSH_HAVE" -eq 0 ]; then
    SSHD_ENABLED=0
    log_info "SSH is off: no public key given. To enable it, start the container with $_SSH_HOW -p 2222:22"
  else
    SSHD_ENABLED=1
    _ssh_host_keys
    # Privilege-separation directory: sshd refuses to start without it (and /run may be fresh).
    install -d -m 755 -o root -g root /run/sshd
    local check
    check=$(/usr/sbin/sshd -t 2>&1) || { log_error "sshd -t failed: $check"; exit 1; }
    log_info "SSH: $_SSH_HAVE authorized key(s) for $NB_USER; sshd will listen on port 22"
  fi
}

if [ "$START_SERVICES" = 0 ]; then
  # `docker run IMAGE <command>` runs that command, not sshd: no host keys to make, nothing to
  # say unless a key was given.
  SSHD_ENABLED=0
  if [ -n "${PUBLIC_KEY:-}${PUBLIC_KEY_FILE:-}" ]; then
    log_info "SSH: not started, because a command was given (sshd runs only when the container starts without one)."
  fi
else
  _ssh_main
fi
export SSHD_ENABLED
# The key has been installed; later steps, Jupyter and user commands do not need to see it.
unset PUBLIC_KEY
unset -f _ssh_die _ssh_die_hostdir _ssh_fingerprint _ssh_add _ssh_host_keys _ssh_main \
  _ssh_collect_keys _ssh_merge_keys
unset _SSH_MOUNTED_KEYS _SSH_HOW _SSH_NEW _SSH_FPS _SSH_HAVE
