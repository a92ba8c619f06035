#!/usr/bin/env python3
"""The release workflow's join: the images each platform's native build pushed by digest become
one index (manifest list) that signing, attestation and tagging then treat as one image.

Usage: join_index.py REPOSITORY ROW DIGESTS_DIR [SUFFIX]
  SUFFIX (e.g. -zstd: the zstd-layered builds) goes on the staging tag, so the two joins of a row
  do not share one.
  DIGESTS_DIR holds one file per platform, named by its architecture (amd64, arm64), holding the
  digest that platform's build pushed (an index of its image and its SBOM/provenance). Every
  platform versions.json gives the row must be there. The sources are joined with
  `docker buildx imagetools create` under the moving tag staging-<row> (buildx pushes nothing
  without a tag; like buildcache-<row>, never a tag to pull: the published tags come after the
  signature), then the joined index is read back: each platform's image must be the one its
  build pushed (another run's join under the same staging tag would fail this). Prints the
  index's digest on stdout.
Exit status: 0 joined and checked; 1 refused (the reason on stderr).
"""
import json
import os
import pathlib
import subprocess
import sys

import versions

DOCKER = os.environ.get("DOCKER", "docker")


def refuse(message):
    sys.exit(f"join_index: REFUSED: {message}")


def docker(*args):
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        refuse(f"docker {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def images(ref):
    """{"linux/arm64": image manifest digest, ...} of ref, attestation manifests left out (buildx
    lists them as platform unknown/unknown)."""
    entries = json.loads(docker("manifest", "inspect", "-v", ref))
    out = {}
    for entry in entries if isinstance(entries, list) else [entries]:
        platform = entry.get("Descriptor", {}).get("platform", {})
        name = f"{platform.get('os')}/{platform.get('architecture')}"
        if name != "unknown/unknown":
            out[name] = entry["Descriptor"]["digest"]
    return out


def sources(repository, row, folder):
    """{platform: repository@digest} of each platform's build; refuses when one is missing."""
    out, missing = {}, []
    for platform in versions.row(row)["platforms"]:
        path = pathlib.Path(folder, platform.split("/", 1)[1])
        digest = path.read_text().strip() if path.is_file() else ""
        if not digest.startswith("sha256:"):
            missing.append(f"{platform} (no digest in {path})")
        out[platform] = f"{repository}@{digest}"
    if missing:
        refuse(f"row {row}: no build for {', '.join(missing)}: every platform in versions.json is joined, or none")
    return out


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    repository, row, folder = argv[:3]
    built = sources(repository, row, folder)
    staging = f"{repository}:staging-{row}{argv[3] if len(argv) == 4 else ''}"
    docker("buildx", "imagetools", "create", "-t", staging, *built.values())
    # The digest first, then everything read by digest: the tag may move under us, a digest not.
    digest = json.loads(docker("buildx", "imagetools", "inspect", staging, "--format", "{{json .Manifest}}"))["digest"]
    joined = images(f"{repository}@{digest}")
    for platform, ref in built.items():
        want = images(ref).get(platform)
        if joined.get(platform) != want:
            refuse(f"the joined index {digest} holds {joined.get(platform)} for {platform}, its build pushed {want} ({ref})")
    if set(joined) != set(built):
        refuse(f"the joined index {digest} has platforms {sorted(joined)}, versions.json says {sorted(built)}")
    print(f"join_index: {staging} = {digest}: " + ", ".join(f"{p} {d}" for p, d in sorted(joined.items())),
          file=sys.stderr)
    print(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
