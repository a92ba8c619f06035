#!/usr/bin/env bash
# The release workflow's last step, the same in its publish and promote jobs: point every tag at
# a signed digest, pull it back and check digest, tags and labels, then write the manifest.
# Usage: scripts/publish-digest.sh REPOSITORY DIGEST ROW
#   IMMUTABLE, MOVING: the tags, as `build_info.py ci-tags` prints them; FORCE=1 replaces an
#   immutable tag that already names another digest. Needs docker buildx and a registry login.
set -euo pipefail
cd "$(dirname "$0")/.."
repository=$1 digest=$2 row=$3
read -r first rest <<< "$IMMUTABLE"
tag_args=(--repository "$repository" --tag "$first" --extra-immutable "$rest" --no-sha-tag)

# An immutable tag may already name this digest (a re-run), never another one.
python3 scripts/push.py preflight "${tag_args[@]}" --digest "$digest"
targets=()
for t in $IMMUTABLE $MOVING; do targets+=(-t "$repository:$t"); done
# One source: a carbon copy of the index, so the digest (and its attestations) stay.
docker buildx imagetools create "${targets[@]}" "$repository@$digest"

labels=()
while IFS= read -r kv; do labels+=(--label "$kv"); done < <(python3 scripts/build_info.py labels --row "$row")
python3 scripts/push.py verify "${tag_args[@]}" --moving "$MOVING" --digest "$digest" "${labels[@]}"
# One package manifest per platform (each has its own wheels and dpkg list), named
# <tag>.linux-arm64.manifest.md when the row publishes more than one.
IFS=, read -r -a platforms <<< "$(python3 scripts/build_info.py platforms --row "$row")"
for platform in "${platforms[@]}"; do
  docker pull -q --platform "$platform" "$repository@$digest" >/dev/null
  name=$first
  [ "${#platforms[@]}" -eq 1 ] || name="$first.${platform//\//-}"
  make manifest REF="$repository@$digest" TAG="$name"
  docker image rm "$repository@$digest" >/dev/null  # the next platform's pull of the same digest
done
