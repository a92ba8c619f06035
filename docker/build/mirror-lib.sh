# shellcheck shell=bash
# Sourced by apt-install.sh and keep-mirrors.sh (bind-mounted at build time, never in a layer).

# apt_mirror: the APT_MIRROR secret (scheme://host[:port][/prefix]) without a trailing slash.
apt_mirror() {
  local mirror
  mirror=$(cat /run/secrets/APT_MIRROR)
  printf '%s\n' "${mirror%/}"
}

# rewrite_sources MIRROR < sources > sources: MIRROR replaces scheme://host of every source line,
# in the one-line format (`deb [opts] URI suite ...`) and in deb822 (`URIs: URI`, Ubuntu 24.04 on).
rewrite_sources() {
  local mirror=$1 line
  local one='^(deb(-src)?[[:space:]]+(\[[^]]*\][[:space:]]+)?)[a-z+]+://[^/[:space:]]+(.*)$'
  local deb822='^(URIs:[[:space:]]*)[a-z+]+://[^/[:space:]]+(.*)$'
  while IFS= read -r line || [ -n "$line" ]; do
    if [[ $line =~ $one ]]; then
      printf '%s%s%s\n' "${BASH_REMATCH[1]}" "$mirror" "${BASH_REMATCH[4]}"
    elif [[ $line =~ $deb822 ]]; then
      printf '%s%s%s\n' "${BASH_REMATCH[1]}" "$mirror" "${BASH_REMATCH[2]}"
    else
      printf '%s\n' "$line"
    fi
  done
}
