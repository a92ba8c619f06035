#!/usr/bin/env bash
# make build KEEP_MIRRORS=1: the image's users get the build's mirrors too. Without it (the
# default) the mirrors serve the build only and the image keeps the distribution's apt sources
# and pip's defaults. With it, what the secrets hold is written into a layer: use it for mirrors
# whose URLs hold no password.
#   APT_MIRROR       -> /etc/apt's sources rewritten in place (the same rewrite as the build's)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST
#                    -> /opt/venv/pip.conf (pip's site config for the image's virtual
#                       environment; /etc/pip.conf keeps its version constraint)
set -euo pipefail
# shellcheck source=docker/build/mirror-lib.sh
. "$(dirname "$0")/mirror-lib.sh"
kept=()
if [ -s /run/secrets/APT_MIRROR ]; then
  mirror=$(apt_mirror)
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    if [ -f "$f" ]; then rewrite_sources "$mirror" <"$f" >"$f.new" && mv "$f.new" "$f"; fi
  done
  kept+=(APT_MIRROR)
fi
conf=""
for pair in index-url:PIP_INDEX_URL extra-index-url:PIP_EXTRA_INDEX_URL trusted-host:PIP_TRUSTED_HOST; do
  if [ -s "/run/secrets/${pair#*:}" ]; then
    conf+="${pair%%:*} = $(tr '\n' ' ' <"/run/secrets/${pair#*:}")"$'\n'
    kept+=("${pair#*:}")
  fi
done
# Written before the venv is copied in (the Dockerfile says why): the copy keeps this file.
if [ -n "$conf" ]; then mkdir -p /opt/venv && printf '[global]\n%s' "$conf" >/opt/venv/pip.conf; fi
# Names only: the values may be URLs the build log should not show.
echo "keep-mirrors.sh: the image keeps ${kept[*]:-no mirror (none was given)}"
