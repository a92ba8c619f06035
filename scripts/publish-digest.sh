#!/usr/bin/env bash
# The release workflow's last step, the same in its publish and promote jobs: point every tag at
# a signed digest, pull it back and check digest, tags and labels, then write the manifest; with
# ZSTD_DIGEST, the same again for the zstd-layered image under every tag + "-zstd", and with
# ESGZ_DIGEST for the eStargz one (lazily pulled) under every tag + "-esgz".
# Usage: scripts/publish-digest.sh REPOSITORY DIGEST ROW [ZSTD_DIGEST [ESGZ_DIGEST]]
#   IMMUTABLE, MOVING: the tags, as `build_info.py ci-tags` prints them; FORCE=1 replaces an
#   immutable tag that already names another digest. SCANS: a folder of <arch>.scan.json (the
#   release scan's counts by severity, scripts/cve_gate.py), copied beside each manifest as
#   <tag>[.<platform>].scan.json and summed up in it. Needs docker buildx and a registry login.
set -euo pipefail
cd "$(dirname "$0")/.."
repository=$1 digest=$2 row=$3 zstd_digest=${4:-} esgz_digest=${5:-}

labels=()
while IFS= read -r kv; do labels+=(--label "$kv"); done < <(python3 scripts/build_info.py labels --row "$row")
IFS=, read -r -a platforms <<< "$(python3 scripts/build_info.py platforms --row "$row")"

publish() {  # DIGEST SUFFIX: every tag + SUFFIX at DIGEST, checked, with its package manifests
  local digest=$1 suffix=$2 fixed=() moves=() targets=()
  for t in $IMMUTABLE; do fixed+=("$t$suffix"); done
  for t in $MOVING; do moves+=("$t$suffix"); done
  local first=${fixed[0]}
  local tag_args=(--repository "$repository" --tag "$first" --extra-immutable "${fixed[*]:1}" --no-sha-tag)

  # An immutable tag may already name this digest (a re-run), never another one.
  python3 scripts/push.py preflight "${tag_args[@]}" --digest "$digest"
  for t in "${fixed[@]}" "${moves[@]}"; do targets+=(-t "$repository:$t"); done
  # One source: a carbon copy of the index, so the digest (and its attestations) stay.
  docker buildx imagetools create "${targets[@]}" "$repository@$digest"

  python3 scripts/push.py verify "${tag_args[@]}" --moving "${moves[*]}" --digest "$digest" "${labels[@]}"
  # One package manifest per platform (each has its own wheels and dpkg list), named
  # <tag>.linux-arm64.manifest.md when the row publishes more than one.
  for platform in "${platforms[@]}"; do
    docker pull -q --platform "$platform" "$repository@$digest" >/dev/null
    name=$first
    [ "${#platforms[@]}" -eq 1 ] || name="$first.${platform//\//-}"
    scan=${SCANS:+$SCANS/${platform#linux/}.scan.json}
    make manifest REF="$repository@$digest" TAG="$name" ${scan:+SCAN="$scan"}
    [ -z "$scan" ] || cp "$scan" "artifacts/publish/$name.scan.json"
    docker image rm "$repository@$digest" >/dev/null  # the next platform's pull of the same digest
  done
}

publish "$digest" ""
# The zstd-layered twin (docs/distributing.md): clients that cannot read zstd keep the plain tags.
[ -z "$zstd_digest" ] || publish "$zstd_digest" -zstd
# The eStargz twin: lazily pulled by a node with the stargz snapshotter, plain gzip to the rest.
[ -z "$esgz_digest" ] || publish "$esgz_digest" -esgz
