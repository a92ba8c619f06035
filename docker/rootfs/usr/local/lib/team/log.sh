# shellcheck shell=bash
# The one log helper: `LEVEL [UTC time] message` on stderr, colour only on a TTY.
_log() {
  local level=$1 colour=$2; shift 2
  if [ -t 2 ]; then
    printf '\033[%sm%-5s\033[0m [%s] %s\n' "$colour" "$level" "$(date -u +%H:%M:%S)" "$*" >&2
  else
    printf '%-5s [%s] %s\n' "$level" "$(date -u +%H:%M:%S)" "$*" >&2
  fi
}
log_info() { _log INFO 32 "$@"; }
log_warn() { _log WARN 33 "$@"; }
log_error() { _log ERROR 31 "$@"; }
