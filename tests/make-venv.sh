#!/usr/bin/env bash
# make test-deps: the host-side test venv (pip: tests/requirements.txt; npm: NPM_TOOLS) at
# TEST_VENV. With TEST_VENV_CACHE set, the venv is made once per content (this Python, both
# requirements files, the npm tools) in that folder and TEST_VENV becomes a link to it: a fresh
# clone of the same tree (every CI run) links it in milliseconds instead of spending ~30 s of
# CPU in pip and npm. Two checkouts making the same venv at once wait for each other (flock).
set -euo pipefail
venv=${TEST_VENV:?} cache=${TEST_VENV_CACHE:-}
read -r -a npm_tools <<< "${NPM_TOOLS:?}"

make_venv() {
  python3 -m venv "$1"
  "$1/bin/pip" install -q -r tests/requirements.txt
  npm install --prefix "$1/npm" --no-audit --no-fund --silent "${npm_tools[@]}"
  touch "$1/.done"
}

if [ -z "$cache" ]; then
  [ ! -L "$venv" ] || rm -f "$venv"
  make_venv "$venv"
  exit 0
fi
key=$({ python3 -c 'import sys; print(sys.executable, sys.version)'
        cat tests/requirements.txt docker/build/requirements.txt; echo "${npm_tools[*]}"; } | sha256sum | cut -c1-16)
mkdir -p "$cache"
exec 9> "$cache/.lock"
flock 9
if [ ! -f "$cache/$key/.done" ]; then
  rm -rf "${cache:?}/$key"
  make_venv "$cache/$key"
fi
# A venv unused for 14 days (its .done is touched at each use) goes: each is ~400 MB.
find "$cache" -mindepth 2 -maxdepth 2 -name .done -mtime +14 -printf '%h\0' | xargs -0 -r rm -rf
touch "$cache/$key/.done"  # newer than this checkout's Makefile: make sees the venv up to date
flock -u 9
rm -rf "$venv"
ln -s "$cache/$key" "$venv"
