# shellcheck shell=bash
# Setup step (sourced): check JupyterLab's port and auth settings (refusing what cannot work,
# with the fix) and put the token and password hash in files only $NB_USER can read, in
# TEAM_JUPYTER_DIR. /etc/jupyter/jupyter_server_config.py reads them when Jupyter starts, so the
# token is never in argv (`ps`) nor in the environment kernels inherit.

# `docker run IMAGE <command>` starts no Jupyter: nothing to configure (and nothing to refuse).
[ "$START_SERVICES" = 1 ] || return 0

# _jupyter_check_port PORT: a number from 1 to 65535, and not sshd's port while SSH is on.
_jupyter_check_port() {
  local port=$1
  case "$port" in
    ''|*[!0-9]*) log_error "JUPYTER_PORT='$port' is not a port number. Fix: -e JUPYTER_PORT=8888"; exit 64 ;;
  esac
  if [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    log_error "JUPYTER_PORT=$port is out of range. Fix: -e JUPYTER_PORT=8888"; exit 64
  fi
  if [ "$port" = 22 ] && [ "${SSHD_ENABLED:-0}" = 1 ]; then
    log_error "JUPYTER_PORT=22 is sshd's port (SSH is on). Fix: -e JUPYTER_PORT=8888 (publish it with -p HOSTPORT:8888), or -e SSHD_ENABLED=0"
    exit 64
  fi
}

# _jupyter_check_hash HASH: a password hash some password can match. A hash that is not one
# would start Jupyter "ready" and answer every login with HTTP 500: parse it the way Jupyter
# will (argon2's own parser; sha1:salt:40 hex digits), in jupyter-hash-check.
_jupyter_check_hash() {
  local hash=$1 how="docker run --rm -it IMAGE python -c 'from jupyter_server.auth import passwd; print(passwd())'"
  case "$hash" in
    argon2:*|sha1:*) ;;
    *) log_error "JUPYTER_PASSWORD_HASH must be a hash ('argon2:...' or 'sha1:...'), not a password. Fix: $how"
       exit 64 ;;
  esac
  # As the user: it imports argon2 from the venv, whose code dev can write (a .pth file runs
  # at every start of its Python): as root, that would make dev root at the next start.
  if ! as_nb_user env JH="$hash" python3 -I /usr/local/lib/team/jupyter-hash-check 2>/dev/null; then
    log_error "JUPYTER_PASSWORD_HASH is not a valid ${hash%%:*} hash (cut short or mangled by shell quoting?), so no password would ever log in. Fix: make a new one with $how and pass it in single quotes (-e 'JUPYTER_PASSWORD_HASH=argon2:...')"
    exit 64
  fi
}

# _jupyter_check_secret_file VAR FILE NAME: FILE (from VAR) is a readable file (docker run -v
# makes a directory when the host path does not exist); NAME is the example's file name.
_jupyter_check_secret_file() {
  local var=$1 file=$2 name=$3
  if [ -d "$file" ]; then
    log_error "$var=$file is a directory, not a file (docker run -v makes one when the host path does not exist). Fix: point it at the file itself, e.g. -v \$PWD/${name#jupyter_}:/run/secrets/$name:ro -e $var=/run/secrets/$name"
    exit 64
  fi
  if [ ! -f "$file" ] || [ ! -r "$file" ]; then
    log_error "$var=$file cannot be read. Fix: mount it, e.g. -v \$PWD/${name#jupyter_}:/run/secrets/$name:ro"
    exit 64
  fi
}

_jupyter_step() {
  local port=${JUPYTER_PORT:-8888} token="" hash="" kind dir=/run/team/jupyter owner
  # The secrets' dir is 0700 and its files 0600, owned by the user Jupyter runs as.
  owner=$(id -u "$NB_USER"):$(id -g "$NB_USER")
  [ "$(id -u)" = 0 ] || { dir=${TMPDIR:-/tmp}/team-jupyter-$(id -u); owner=$(id -u):$(id -g); }
  # --read-only: /run is part of the read-only root; /tmp is the tmpfs the user must add.
  [ "${ROOT_READONLY:-0}" = 0 ] || dir=${TMPDIR:-/tmp}/team-jupyter-$(id -u "$NB_USER")
  _jupyter_check_port "$port"

  local given=0
  [ -z "${JUPYTER_TOKEN+set}" ] || given=$((given + 1))
  [ -z "${JUPYTER_TOKEN_FILE:-}" ] || given=$((given + 1))
  [ -z "${JUPYTER_PASSWORD_HASH:-}" ] || given=$((given + 1))
  [ -z "${JUPYTER_PASSWORD_HASH_FILE:-}" ] || given=$((given + 1))
  if [ "$given" -gt 1 ]; then
    log_error "Set only one of JUPYTER_TOKEN, JUPYTER_TOKEN_FILE, JUPYTER_PASSWORD_HASH and JUPYTER_PASSWORD_HASH_FILE."
    exit 64
  fi

  # The hash from a file (a mounted secret: in no environment and not in docker inspect).
  if [ -n "${JUPYTER_PASSWORD_HASH_FILE:-}" ]; then
    _jupyter_check_secret_file JUPYTER_PASSWORD_HASH_FILE "$JUPYTER_PASSWORD_HASH_FILE" jupyter_password_hash
    IFS= read -r hash < "$JUPYTER_PASSWORD_HASH_FILE" || true
    _jupyter_check_hash "${hash%$'\r'}"
    hash=${hash%$'\r'}; kind=password
  elif [ -n "${JUPYTER_PASSWORD_HASH:-}" ]; then
    _jupyter_check_hash "$JUPYTER_PASSWORD_HASH"
    hash=$JUPYTER_PASSWORD_HASH; kind=password
  elif [ -n "${JUPYTER_TOKEN_FILE:-}" ]; then
    _jupyter_check_secret_file JUPYTER_TOKEN_FILE "$JUPYTER_TOKEN_FILE" jupyter_token
    # First line only, without a trailing newline or CR.
    IFS= read -r token < "$JUPYTER_TOKEN_FILE" || true
    token=${token%$'\r'}; kind=token
  elif [ -n "${JUPYTER_TOKEN+set}" ]; then
    token=$JUPYTER_TOKEN; kind=token
  else
    kind=generated
    # Kept for this container's next start (docker restart, --restart after a crash), so open
    # browser tabs keep working; a new container gets a new token.
    if [ -s "$dir/token" ]; then
      token=$(< "$dir/token")
    else
      token=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
    fi
  fi

  # A line break (or another control character) in the token: Jupyter would take it as part of
  # the token, which then can be neither typed nor put in a URL; usually a file's or a
  # compose value's second line pasted in by mistake.
  if [ "$kind" = token ] && [[ $token == *[[:cntrl:]]* ]]; then
    log_error "${JUPYTER_TOKEN_FILE:+The first line of }${JUPYTER_TOKEN_FILE:-JUPYTER_TOKEN} holds a line break or another control character, so no browser could send it. Fix: one line of letters and digits, e.g. -e JUPYTER_TOKEN=\$(openssl rand -hex 24), or put it in a file: -v \$PWD/token:/run/secrets/jupyter_token:ro -e JUPYTER_TOKEN_FILE=/run/secrets/jupyter_token"
    exit 64
  fi
  # A short token: Jupyter checks tokens with no rate limit or lockout, so one a person can
  # remember ("a", "1234", a word) falls to a script in seconds from any host that reaches the
  # port. 16 characters is the floor: 64 bits even as hex digits, years of guessing at
  # thousands of tries a second; Jupyter's own and ours (below) are 48 hex digits (192 bits).
  # Refused, not warned: a WARN in a log nobody reads leaves the port open. A password hash
  # is not measured: it is the way for something a person types (Jupyter's login page).
  if [ "$kind" = token ] && [ -n "$token" ] && [ "${#token}" -lt 16 ]; then
    if [ "${JUPYTER_ALLOW_INSECURE:-0}" != 1 ]; then
      log_error "The Jupyter token from ${JUPYTER_TOKEN_FILE:-JUPYTER_TOKEN} has ${#token} characters, fewer than 16: anyone who reaches port $port can guess it and run code as $NB_USER. Fix: a long random one (-e JUPYTER_TOKEN=\$(openssl rand -hex 24)), remove JUPYTER_TOKEN to get a random one, or use a password: -e JUPYTER_PASSWORD_HASH (docs/container.md); only on a port nobody else can reach: -e JUPYTER_ALLOW_INSECURE=1"
      exit 64
    fi
    log_warn "JUPYTER_ALLOW_INSECURE=1 and a token of ${#token} characters (fewer than 16): anyone who can reach port $port can guess it and run any code as $NB_USER. Publish it on 127.0.0.1 only (-p 127.0.0.1:$port:$port)."
  fi
  if [ "$kind" = token ] && [ -z "$token" ]; then
    if [ "${JUPYTER_ALLOW_INSECURE:-0}" != 1 ]; then
      log_error "The Jupyter token is empty: that would let anyone who reaches port $port run code as $NB_USER. Fix: remove JUPYTER_TOKEN to get a random token, or set one (-e JUPYTER_TOKEN=\$(openssl rand -hex 24)); only on a port nobody else can reach: -e JUPYTER_ALLOW_INSECURE=1"
      exit 64
    fi
    kind=insecure
    log_warn "JUPYTER_ALLOW_INSECURE=1 and an empty token: JupyterLab has NO AUTHENTICATION. Anyone who can reach port $port can run any code as $NB_USER. Publish it on 127.0.0.1 only (-p 127.0.0.1:$port:$port)."
  fi

  install -d -m 0700 "$dir"
  # What jupyter_server_config.py and the log redactor read: the token (empty for a password,
  # or with JUPYTER_ALLOW_INSECURE=1) and the password hash, if any.
  (umask 077 && printf '%s' "$token" > "$dir/token")
  rm -f "$dir/password_hash"
  if [ -n "$hash" ]; then (umask 077 && printf '%s' "$hash" > "$dir/password_hash"); fi
  chown -R "$owner" "$dir"

  # A token we made is shown once, in the ready line; one you chose is not repeated in the logs
  # (Jupyter masks it too), since logs travel further than the container.
  # HOST_PORT_JUPYTER: the host port make run or compose publishes it on (-p HOST:8888).
  local url="http://127.0.0.1:${HOST_PORT_JUPYTER:-$port}/lab"
  case "$kind" in
    generated) url="$url?token=$token" ;;
    token) url="$url?token=<your token> (from ${JUPYTER_TOKEN_FILE:-JUPYTER_TOKEN})" ;;
    password) url="$url (log in with your password)" ;;
  esac
  export JUPYTER_PORT=$port TEAM_JUPYTER_DIR=$dir TEAM_JUPYTER_URL=$url
  # Secrets stop here: hooks, Jupyter, its kernels and terminals don't inherit them.
  unset JUPYTER_TOKEN JUPYTER_PASSWORD_HASH
}
_jupyter_step
unset -f _jupyter_step _jupyter_check_port _jupyter_check_hash _jupyter_check_secret_file
