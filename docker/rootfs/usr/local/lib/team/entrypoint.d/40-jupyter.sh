# shellcheck shell=bash
# Setup step (sourced): JupyterLab's auth and settings, written to a config file only $NB_USER
# can read, so the token is never in argv (`ps`) nor in the environment kernels inherit.

# `docker run IMAGE <command>` starts no Jupyter: nothing to configure (and nothing to refuse).
# A sourced file sees the entrypoint's arguments.
[ $# -eq 0 ] || return 0

_jupyter_step() {
  local port=${JUPYTER_PORT:-8888} token="" hash="" kind dir=/run/team/jupyter owner
  # The config dir is 0700 and its files 0600, owned by the user Jupyter runs as.
  owner=$(id -u "$NB_USER"):$(id -g "$NB_USER")
  [ "$(id -u)" = 0 ] || { dir=${TMPDIR:-/tmp}/team-jupyter-$(id -u); owner=$(id -u):$(id -g); }
  case "$port" in
    ''|*[!0-9]*) log_error "JUPYTER_PORT='$port' is not a port number. Fix: -e JUPYTER_PORT=8888"; exit 64 ;;
  esac
  if [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    log_error "JUPYTER_PORT=$port is out of range. Fix: -e JUPYTER_PORT=8888"; exit 64
  fi

  local given=0
  [ -z "${JUPYTER_TOKEN+set}" ] || given=$((given + 1))
  [ -z "${JUPYTER_TOKEN_FILE:-}" ] || given=$((given + 1))
  [ -z "${JUPYTER_PASSWORD_HASH:-}" ] || given=$((given + 1))
  if [ "$given" -gt 1 ]; then
    log_error "Set only one of JUPYTER_TOKEN, JUPYTER_TOKEN_FILE and JUPYTER_PASSWORD_HASH."
    exit 64
  fi

  if [ -n "${JUPYTER_PASSWORD_HASH:-}" ]; then
    case "$JUPYTER_PASSWORD_HASH" in
      argon2:*|sha1:*) hash=$JUPYTER_PASSWORD_HASH; kind=password ;;
      *) log_error "JUPYTER_PASSWORD_HASH must be a hash ('argon2:...' or 'sha1:...'), not a password. Fix: docker run --rm IMAGE python -c 'from jupyter_server.auth import passwd; print(passwd())'"
         exit 64 ;;
    esac
  elif [ -n "${JUPYTER_TOKEN_FILE:-}" ]; then
    if [ ! -r "$JUPYTER_TOKEN_FILE" ]; then
      log_error "JUPYTER_TOKEN_FILE=$JUPYTER_TOKEN_FILE cannot be read. Fix: mount it, e.g. -v \$PWD/token:/run/secrets/jupyter_token:ro"
      exit 64
    fi
    # First line only, without a trailing newline or CR.
    IFS= read -r token < "$JUPYTER_TOKEN_FILE" || true
    token=${token%$'\r'}; kind=token
  elif [ -n "${JUPYTER_TOKEN+set}" ]; then
    token=$JUPYTER_TOKEN; kind=token
  else
    kind=generated
    # Kept for this container's next start (docker restart, --restart after a crash), so open
    # browser tabs keep working; a new container gets a new token.
    if [ -s "$dir/generated_token" ]; then
      token=$(< "$dir/generated_token")
    else
      token=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
    fi
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
  if [ "$kind" = generated ]; then (umask 077 && printf '%s\n' "$token" > "$dir/generated_token"); fi
  (umask 077 && JT="$token" JH="$hash" JP="$port" python3 -I -S -c '
import json, os, sys
cfg = {
    "ServerApp": {
        "ip": "0.0.0.0", "port": int(os.environ["JP"]),
        "port_retries": 0,            # a busy port is an error, not a silent move to another one
        "open_browser": False, "allow_root": False, "root_dir": "/workspace",
        "terminado_settings": {"shell_command": ["/bin/bash", "-l"]},
        # jupyter_server pairs a 30 s ping with a 90 s timeout, which tornado >= 6.5 cuts to 30 s
        # with a WARN on every websocket: ask for the 30 s it ends up with anyway.
        "tornado_settings": {"ws_ping_timeout": 30000},
    },
    "IdentityProvider": {"token": os.environ["JT"]},
    # Kernels on unix sockets (mode 700 runtime dir), not localhost TCP ports that any process
    # in the container can reach; also ends ipykernel'"'"'s "running over TCP" WARNING per kernel.
    "KernelManager": {"transport": "ipc"},
}
if os.environ["JH"]:
    cfg["PasswordIdentityProvider"] = {"hashed_password": os.environ["JH"]}
json.dump(cfg, open(sys.argv[1], "w"), indent=1)' "$dir/jupyter_server_config.json")
  chown -R "$owner" "$dir"

  # A token we made is shown once, in the ready line; one you chose is not repeated in the logs
  # (Jupyter masks it too), since logs travel further than the container.
  local url="http://127.0.0.1:$port/lab"
  case "$kind" in
    generated) url="$url?token=$token" ;;
    token) url="$url?token=<your token> (from ${JUPYTER_TOKEN_FILE:-JUPYTER_TOKEN})" ;;
    password) url="$url (log in with your password)" ;;
  esac
  export JUPYTER_PORT=$port TEAM_JUPYTER_CONFIG="$dir/jupyter_server_config.json" TEAM_JUPYTER_URL="$url"
  # Secrets stop here: hooks, Jupyter, its kernels and terminals don't inherit them.
  unset JUPYTER_TOKEN JUPYTER_PASSWORD_HASH
}
_jupyter_step
unset -f _jupyter_step
