#!/usr/bin/env bash
# Make a stand-in for the nvidia/cuda base image on hosts that cannot pull it (air-gapped
# sites, this project's CI): a Debian minbase from debootstrap that looks like the real base
# where the image's build and tests can tell: the same Env, Labels and Cmd, the same cuda-*
# packages and files (forward-compat libcuda, a second libcudart, /usr/local/cuda links, loader
# configuration, NVIDIA's apt source pointing at an unresolvable host) and the Ubuntu 22.04 bits
# the Dockerfile deals with (dynamic MOTD, /etc/legal, a setgid helper, HOME_MODE 0750). All of
# that comes from one pinned file, versions.json's base_facts (tests/test_base.py checks the
# result against it). It is an explicit choice, never a fallback.
#
# Usage: scripts/make-standin-base.sh [IMAGE_NAME]   (FORCE=1 rebuilds an existing one)
#   PLATFORM=linux/arm64: a stand-in of that platform (debootstrap --arch; another CPU's runs
#   under QEMU: qemu-user-static + binfmt-support with the F flag), named <image>-arm64 unless
#   IMAGE_NAME is given (Docker 20.10 keeps one image per name, whatever its platform).
#   The facts are the amd64 base's (NVARCH=x86_64, targets/x86_64-linux): a stand-in, not sbsa.
# Needs: root, debootstrap, docker, a Debian mirror (MIRROR=...).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
versions() { python3 "$here/versions.py" "$@"; }
host_arch=$(dpkg --print-architecture)
platform=${PLATFORM:-linux/$host_arch}
arch=${platform#linux/}
image=${1:-$(versions standin image)$([ "$arch" = "$host_arch" ] || echo "-$arch")}
suite=${SUITE:-$(versions standin suite)}
mirror=${MIRROR:-http://deb.debian.org/debian}
facts=$here/../$(versions get base_facts)

log() { printf '%s [%s] %s\n' "$1" "$(date -u +%H:%M:%S)" "$2" >&2; }

# What the stand-in is made from: an existing one made from anything else is made again, so a
# warm Docker cache (CI) never keeps a stand-in that differs from the pinned facts.
recipe=$({ cat "$facts" "$here/base_facts.py" "$0"; echo "$arch"; } | sha256sum | cut -c1-16)
if [ "${FORCE:-0}" != 1 ] \
  && [ "$(docker image inspect --format '{{index .Config.Labels "team.base.standin.recipe"}}' "$image" 2>/dev/null)" = "$recipe" ]; then
  log INFO "stand-in base $image already exists, made from this recipe (FORCE=1 to rebuild)"
  exit 0
fi
for tool in debootstrap docker dpkg-deb; do
  command -v "$tool" >/dev/null || { log ERROR "$tool not found: apt-get install debootstrap docker.io dpkg"; exit 1; }
done
[ "$(id -u)" = 0 ] || { log ERROR "debootstrap needs root: sudo $0 $*"; exit 1; }

root=$(mktemp -d /tmp/standin.XXXXXX)
trap 'rm -rf "$root"' EXIT
log INFO "debootstrap $suite ($arch) from $mirror into $root"
debootstrap --variant=minbase --arch="$arch" "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; log ERROR "debootstrap failed (full log: $root.log)"; exit 1; }
rm -f "$root.log"
# The real base's files: plain ones straight into the tree, package-owned ones as .deb files
# named like NVIDIA's, installed with dpkg so that their maintainer scripts make the
# /etc/alternatives links and `dpkg --purge` removes them as it does on the real base.
log INFO "adding the real base's files and packages from $(basename "$facts")"
python3 "$here/base_facts.py" standin-root "$facts" "$root" "$root/tmp/standin-debs" "$arch"
chroot "$root" sh -c 'dpkg -i /tmp/standin-debs/*.deb >/dev/null && rm -rf /tmp/standin-debs && ldconfig'
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin

log INFO "importing as $image"
python3 "$here/base_facts.py" import-changes "$facts" >"$root.changes"
standin_label="LABEL team.base.standin=true team.base.standin.suite=$suite team.base.standin.recipe=$recipe"
if [ "$arch" = "$host_arch" ]; then
  changes=()
  while IFS= read -r -d '' change; do changes+=(--change "$change"); done <"$root.changes"
  tar -C "$root" --numeric-owner -c . | docker import "${changes[@]}" --change "$standin_label" - "$image" >/dev/null
else
  # `docker import --platform` is ignored by a non-experimental 20.10 daemon (the image says
  # amd64): the same tree and changes as a FROM scratch build, which runs nothing, so no QEMU.
  ctx=$(mktemp -d /tmp/standin-ctx.XXXXXX)
  tar -C "$root" --numeric-owner -cf "$ctx/rootfs.tar" .
  { printf 'FROM scratch\nADD rootfs.tar /\n'; tr '\0' '\n' <"$root.changes"; echo "$standin_label"; } >"$ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q --platform "$platform" -t "$image" "$ctx" >/dev/null \
    || { rm -rf "$ctx"; log ERROR "docker build of the $platform stand-in failed"; exit 1; }
  rm -rf "$ctx"
fi
rm -f "$root.changes"
log INFO "stand-in base ready: $image, $platform (build with BASE_IMAGE=$image PYTHON_VERSION=$(versions standin python)$([ "$arch" = "$host_arch" ] || echo " PLATFORM=$platform"))"
