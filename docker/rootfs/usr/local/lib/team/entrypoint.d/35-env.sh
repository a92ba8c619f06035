# shellcheck shell=bash
# Step 35: write the container's environment (docker run -e and the image's ENV) to
# /etc/team/environment (root's, readable by dev's group only), which SSH sessions and tmux
# load; secrets and what only the entrypoint reads (ENTRYPOINT_ONLY) are never written.
# What the filter is for (docs/security.md: Secrets): keeping secrets out of a file in the
# container's writable layer (docker commit/cp/export carry it) and out of every shell's `env`.
# It is no wall between dev and its secrets: every process of dev can read /proc/PID/environ
# of dev's others (JupyterLab's included). File-based secrets (/run/secrets, *_FILE) are.

# Names that SSH/login set per session (or that would be wrong in another process).
_ENV_SESSION=" _ HOME HOSTNAME LOGNAME MAIL OLDPWD PWD SHELL SHLVL TERM USER TMUX TMUX_PANE
  SSH_AUTH_SOCK SSH_CLIENT SSH_CONNECTION SSH_ORIGINAL_COMMAND SSH_TTY BASH_ENV ENV "

# _env_is_secret NAME VALUE: keys, tokens, passwords and the like stay in the container's own
# environment (docker exec still sees them) but never reach a file or an SSH session. By name,
# and by value shape: a URL with a password in it (DATABASE_URL=postgres://u:pass@h/db,
# HTTPS_PROXY=http://u:pass@proxy:3128) is a secret whatever the variable is called.
# Besides the obvious words, the names common tools use: GitHub/GitLab personal access tokens
# (GH_PAT, *_PAT), npm and Docker auth (NPM_AUTH, NPM_CONFIG__AUTH, DOCKER_AUTH_CONFIG), Sentry
# DSNs (SENTRY_DSN), MySQL's MYSQL_PWD, *_PASS/*_PASSPHRASE, *_CREDS, *APIKEY, *_KEYS, bearer
# tokens, webhook URLs (*WEBHOOK*, *HOOK_URL) and cookies. Not *AUTH* alone: GIT_AUTHOR_NAME/EMAIL
# belong in SSH sessions. By value also: a private key (PEM/OpenSSH "PRIVATE KEY" block) and an
# HTTP credential ("Bearer ...", "Basic ...").
_env_is_secret() {
  case ${1^^} in
    PUBLIC_KEY*|JUPYTER_TOKEN|JUPYTER_PASSWORD*|*PASSWORD*|*PASSWD*|*TOKEN*|*SECRET*|*CREDENTIAL*|*PRIVATE*|*_KEY|*_KEY_*|KEY|*_KEYS|KEYS) return 0 ;;
    *_PAT|*_PAT_*|PAT|AUTH|*_AUTH|*_AUTH_*|AUTH_*|*AUTHORIZATION*|*BEARER*|*_DSN|DSN|*_PWD|*_PASS|*PASSPHRASE*|*_CRED|*_CREDS|*APIKEY*|*WEBHOOK*|*HOOK_URL*|*COOKIE*) return 0 ;;
  esac
  [[ $2 == *"PRIVATE KEY"* ]] && return 0
  [[ $2 =~ ^[[:space:]]*([Bb]earer|[Bb]asic)[[:space:]]+[^[:space:]]{8,} ]] && return 0
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
    echo "# Secrets (*TOKEN*, *PASSWORD*, *SECRET*, *_KEY(S), *_PAT, *AUTH, *BEARER*, *_DSN, *HOOK_URL, PUBLIC_KEY..., URLs with a password, private keys) are left out on purpose."
    # Marks this shell as loaded, so a nested interactive bash keeps e.g. an activated venv.
    echo "export TEAM_ENVIRONMENT='$out'"
    while IFS= read -r name; do
      [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
      [[ $_ENV_SESSION == *[[:space:]]"$name"[[:space:]]* ]] && continue
      [[ " ${ENTRYPOINT_ONLY//$'\n'/ } " == *" $name "* ]] && continue
      value=${!name}
      # Root's steps search only system folders (user.sh): the file gets the user's PATH.
      case $name in
        TEAM_USER_PATH) continue ;;
        PATH) value=${TEAM_USER_PATH:-$PATH} ;;
      esac
      _env_is_secret "$name" "$value" && continue
      # POSIX single quotes (the file is also read by sh): only ' itself needs escaping.
      printf "export %s='%s'\n" "$name" "${value//\'/\'\\\'\'}"
    done < <(compgen -e | sort)
  } >"$tmp"
  # Only dev (and root) read it: a variable the filter above misses must not be readable by
  # every account in the container. dev's UID/GID are final here (10-user.sh ran first). Root
  # keeps it: SSH logins of dev source it, and dev must not be able to change what they run
  # (01-team-environment.sh: root sources it never, dev only when root owns it).
  chown "0:$(id -g "$NB_USER")" "$tmp"
  chmod 640 "$tmp"
  mv -f "$tmp" "$out"
}

_env_main
unset -f _env_main _env_is_secret
unset _ENV_SESSION
