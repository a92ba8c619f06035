#!/usr/bin/env bash
# Copy the pinned base image, by digest, into the team's registry, so that a rebuild never
# depends on the upstream tag still existing (NVIDIA deletes end-of-life CUDA tags from Docker
# Hub). Pull by digest, tag, push, then check the copy is the image that was pulled.
#
# Usage: scripts/mirror-base.sh REGISTRY [SOURCE [DIGEST]]      (make mirror-base REGISTRY=...)
#   SOURCE  repository:tag, default versions.json's base_image
#   DIGEST  sha256:..., default versions.json's base_image_digest
# Prints the mirrored reference: build from it with make build BASE_IMAGE=<that>.
#
# Docker's own client copies the image of this host's platform only, and the copy's manifest is
# written anew, so its digest usually differs from the upstream multi-arch index digest: pin the
# printed one for builds from the mirror. (`docker buildx imagetools create -t MIRROR SOURCE@DIGEST`
# would copy the whole index under the same digest where buildx is available.)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DOCKER=${DOCKER:-docker}
log() { printf '%s [%s] %s\n' "$1" "$(date -u +%H:%M:%S)" "$2" >&2; }
die() { log ERROR "$1"; exit 1; }

registry=${1:-}
# Given but empty (make mirror-base BASE_DIGEST=) is refused below, not replaced by the default.
source=${2-$(python3 "$here/versions.py" get base_image)}
digest=${3-$(python3 "$here/versions.py" get base_image_digest)}
[ -n "$registry" ] || die "no registry: set REGISTRY, e.g. make mirror-base REGISTRY=ghcr.io/acme"
[[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] \
  || die "no valid digest for $source (${digest:-empty}): set base_image_digest in versions.json (docs/building.md: Pinning the base)"

# repository:tag, where the repository may start with host:port.
last=${source##*/}
[[ $last == *:* ]] || die "$source has no tag: give repository:tag"
repo=${source%:*} tag=${last#*:}
# The copy keeps the repository path without the source registry's host: nvidia/cuda stays
# nvidia/cuda under REGISTRY.
path=$repo first=${repo%%/*}
if [[ $repo == */* && ( $first == *.* || $first == *:* || $first == localhost ) ]]; then
  path=${repo#*/}
fi
target=$registry/$path

log INFO "pulling $repo@$digest"
"$DOCKER" pull "$repo@$digest" >/dev/null || die "cannot pull $repo@$digest: is the digest right, and is it still published? (a copy made earlier is in $target)"
id=$("$DOCKER" image inspect --format '{{.Id}}' "$repo@$digest")

log INFO "pushing $target:$tag"
"$DOCKER" tag "$id" "$target:$tag"
out=$("$DOCKER" push "$target:$tag") || die "push of $target:$tag failed: $out"
pushed=$(sed -n 's/.*digest: \(sha256:[0-9a-f]\{64\}\).*/\1/p' <<<"$out" | tail -n 1)
[ -n "$pushed" ] || die "docker push printed no digest for $target:$tag: $out"

# The registry's copy must be the image that was pulled by the pinned digest.
"$DOCKER" image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$id" | grep -qxF "$target@$pushed" \
  || die "$target@$pushed is not recorded for image $id after the push"
if [ "$pushed" != "$digest" ]; then
  log INFO "the mirror's digest ($pushed) differs from the upstream one ($digest): docker copies this platform's image only; pin the mirror's digest for builds from it"
fi
log INFO "mirrored $repo@$digest as $target:$tag, verified"
echo "$target:$tag@$pushed"
