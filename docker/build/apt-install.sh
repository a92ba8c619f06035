#!/usr/bin/env bash
# apt-get install for Dockerfile RUN steps (bind-mounted at build time, never in a layer); with
# --upgrade first, the distribution's pending updates before the packages named (if any).
# Trusts the BuildKit secret ca_bundle when given (TLS-inspecting proxy); keeps no lists (a
# cache mount holds them).
# Usage: apt-install.sh [--upgrade] [PACKAGE...]
set -euo pipefail
upgrade=0
if [ "${1:-}" = --upgrade ]; then upgrade=1; shift; fi
ca=/run/secrets/ca_bundle
opts=(-o Dpkg::Use-Pty=0)
if [ -s "$ca" ]; then opts+=(-o "Acquire::https::CAInfo=$ca"); fi
# Keep downloaded .debs in the cache mount instead of deleting them (Docker's default).
rm -f /etc/apt/apt.conf.d/docker-clean
# nvidia/cuda bases ship NVIDIA's apt source (cuda-keyring's sources.list.d/cuda-*.list). Nothing
# here installs from it, and behind a mirror or proxy that allows only the distribution's archive
# `apt-get update` fails on it: drop it first. The keyring stays, harmless: only that source
# named it (signed-by), so it vouches for nothing now.
mapfile -t nvidia_sources < <(grep -rl -e 'developer\.download\.nvidia\.com' /etc/apt/sources.list.d/ 2>/dev/null || true)
if [ ${#nvidia_sources[@]} -gt 0 ]; then rm -f -- "${nvidia_sources[@]}"; fi
# APT_MIRROR (a BuildKit secret, make build APT_MIRROR=...): scheme://host[:port][/prefix] that
# replaces scheme://host of every source, for this build only: apt reads rewritten copies in a
# temporary folder, so the image keeps the distribution's own sources.
if [ -s /run/secrets/APT_MIRROR ]; then
  # shellcheck source=docker/build/mirror-lib.sh
  . "$(dirname "$0")/mirror-lib.sh"
  mirror=$(apt_mirror)
  build_sources=$(mktemp -d)
  mkdir "$build_sources/parts"
  if [ -f /etc/apt/sources.list ]; then rewrite_sources "$mirror" </etc/apt/sources.list >"$build_sources/sources.list"; fi
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    if [ -f "$f" ]; then rewrite_sources "$mirror" <"$f" >"$build_sources/parts/${f##*/}"; fi
  done
  opts+=(-o "Dir::Etc::SourceList=$build_sources/sources.list" -o "Dir::Etc::SourceParts=$build_sources/parts")
  trap 'rm -rf "$build_sources"' EXIT
fi
# --error-on=any: an index that fails to download is an error, not a warning after which the
# install would run from stale or missing lists.
apt-get "${opts[@]}" update -qq --error-on=any
# The distribution's pending updates for what the base ships (libc6, libssl3, openssl, perl-base,
# tar, ...): the pinned base keeps the versions of the day NVIDIA built it. All of the image's own
# sources, not the security pocket alone: Ubuntu and Debian publish some CVE fixes (low and
# medium priority ones, as stable release updates) to -updates only, and a scanner counts a
# finding as fixed by the archive's version, wherever it is. upgrade, not dist-upgrade: nothing is
# removed; --with-new-pkgs installs a new dependency a fix needs instead of holding the fix back.
# The base's configuration files stay (confdef/confold: no prompt). docs/building.md: OS updates.
if [ "$upgrade" = 1 ]; then
  apt-get "${opts[@]}" upgrade -y -qq --with-new-pkgs --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold >/dev/null
fi
if [ $# -gt 0 ]; then apt-get "${opts[@]}" install -y -qq --no-install-recommends "$@" >/dev/null; fi
