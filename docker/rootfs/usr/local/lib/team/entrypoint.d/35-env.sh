# shellcheck shell=bash
# Step 35: write the container's environment (docker run -e and the image's ENV) to
# /etc/team/environment, which SSH sessions and tmux load; secrets are never written.

# Names that SSH/login set per session (or that would be wrong in another process).
_ENV_SESSION=" _ HOME HOSTNAME LOGNAME MAIL OLDPWD PWD SHELL SHLVL TERM USER TMUX TMUX_PANE
  SSH_AUTH_SOCK SSH_CLIENT SSH_CONNECTION SSH_ORIGINAL_COMMAND SSH_TTY BASH_ENV ENV "

# _env_is_secret NAME VALUE: keys, tokens, passwords and the like stay in the container's own
# environment (docker exec still sees them) but never reach a file or an SSH session. By name,
# and by value shape: a URL with a password in it (DATABASE_URL=postgres://u:pass@h/db,
# HTTPS_PROXY=http://u:pass@proxy:3128) is a secret whatever the variable is called.
_env_is_secret() {
  case ${1^^} in
    PUBLIC_KEY*|JUPYTER_TOKEN|JUPYTER_PASSWORD*|*PASSWORD*|*PASSWD*|*TOKEN*|*SECRET*|*CREDENTIAL*|*PRIVATE*|*_KEY|*_KEY_*|KEY) return 0 ;;
  esac
  [[ $2 =~ [A-Za-z][A-Za-z0-9+.-]*://[^/@[:space:]]*:[^/@[:space:]]*@ ]]
}

_env_main() {
  local out=/etc/team/environment tmp name value
  # Only root can write /etc; a non-root start has no sshd to serve anyway, nor has a
  # read-only root filesystem (30-ssh.sh refuses SSH there).
  [ "$(id -u)" = 0 ] && [ "${ROOT_READONLY:-0}" = 0 ] || return 0
  install -d -m 755 /etc/team
  tmp=$(mktemp /etc/team/.environment.XXXXXX)
  {
    echo "# Container environment for SSH sessions and tmux, written at start by 35-env.sh."
    echo "# Secrets (*TOKEN*, *PASSWORD*, *SECRET*, *_KEY, PUBLIC_KEY..., URLs with a password) are left out on purpose."
    # Marks this shell as loaded, so a nested interactive bash keeps e.g. an activated venv.
    echo "export TEAM_ENVIRONMENT='$out'"
    while IFS= read -r name; do
      [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
      [[ $_ENV_SESSION == *[[:space:]]"$name"[[:space:]]* ]] && continue
      value=${!name}
      _env_is_secret "$name" "$value" && continue
      # POSIX single quotes (the file is also read by sh): only ' itself needs escaping.
      printf "export %s='%s'\n" "$name" "${value//\'/\'\\\'\'}"
    done < <(compgen -e | sort)
  } >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$out"
}

_env_main
unset -f _env_main _env_is_secret
unset _ENV_SESSION
