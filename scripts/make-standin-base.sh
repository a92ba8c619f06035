#!/usr/bin/env bash
# Make a stand-in for the nvidia/cuda base image on hosts that cannot pull it (air-gapped
# sites, this project's CI): a Debian minbase from debootstrap, imported with the same
# environment nvidia/cuda:*-base sets, so the NVIDIA Container Toolkit still injects the
# driver and the image still works on a GPU host. It is an explicit choice, never a fallback.
#
# Usage: scripts/make-standin-base.sh [IMAGE_NAME]   (FORCE=1 rebuilds an existing one)
# Needs: root, debootstrap, docker, a Debian mirror (MIRROR=...).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
versions() { python3 "$here/versions.py" "$@"; }
image=${1:-$(versions standin image)}
suite=${SUITE:-$(versions standin suite)}
mirror=${MIRROR:-http://deb.debian.org/debian}
cuda_full=$(versions get cuda_full)
cuda=$(versions get cuda)

log() { printf '%s [%s] %s\n' "$1" "$(date -u +%H:%M:%S)" "$2" >&2; }

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
  log INFO "stand-in base $image already exists (FORCE=1 to rebuild)"
  exit 0
fi
for tool in debootstrap docker; do
  command -v "$tool" >/dev/null || { log ERROR "$tool not found: apt-get install debootstrap docker.io"; exit 1; }
done
[ "$(id -u)" = 0 ] || { log ERROR "debootstrap needs root: sudo $0 $*"; exit 1; }

root=$(mktemp -d /tmp/standin.XXXXXX)
trap 'rm -rf "$root"' EXIT
log INFO "debootstrap $suite from $mirror into $root"
debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; log ERROR "debootstrap failed (full log: $root.log)"; exit 1; }
rm -f "$root.log"
# The same loader paths nvidia/cuda:*-base registers, so driver libraries mounted by the
# NVIDIA Container Toolkit under /usr/local/nvidia are found.
printf '/usr/local/nvidia/lib\n/usr/local/nvidia/lib64\n' >"$root/etc/ld.so.conf.d/nvidia.conf"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin

log INFO "importing as $image"
tar -C "$root" --numeric-owner -c . | docker import \
  --change "ENV PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change "ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64" \
  --change "ENV NVIDIA_VISIBLE_DEVICES=all" \
  --change "ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility" \
  --change "ENV NVIDIA_REQUIRE_CUDA=cuda>=$cuda" \
  --change "ENV CUDA_VERSION=$cuda_full" \
  --change "LABEL team.base.standin=true team.base.standin.suite=$suite" \
  --change 'CMD ["/bin/bash"]' \
  - "$image" >/dev/null
log INFO "stand-in base ready: $image (build with BASE_IMAGE=$image PYTHON_VERSION=$(versions standin python))"
