"""make push ZSTD=1: every tag also as <tag>-zstd, the same image with zstd-compressed layers
(docs/distributing.md: 26% fewer bytes than gzip at level 7 and faster to unpack, for the
clients that read zstd; the plain tags stay gzip for the rest).

Docker's 20.10 client cannot push zstd, so skopeo does (Debian's 1.9 has --dest-compress-format
zstd): one copy from the local Docker image, then registry-to-registry copies for the other tags
(no recompression, so every -zstd tag names one digest). Then each tag is read back: every layer
must be zstd, and its config must hold the local image's layers (diff IDs) and labels.
"""
import json
import os
import shutil
import subprocess

import registry

SUFFIX = "-zstd"


def zstd_tags(tags):
    return [t + SUFFIX for t in tags]


def skopeo():
    path = shutil.which(os.environ.get("SKOPEO", "skopeo"))  # SKOPEO: another one, or none (tests)
    if not path:
        raise RuntimeError("ZSTD=1 needs skopeo (apt-get install skopeo; 1.9 or newer): Docker 20.10 "
                           "cannot push zstd layers")
    return path


def copy(source, dest, insecure, level=None):
    """skopeo copy; level given: recompress every layer with zstd at that level."""
    args = [skopeo(), "copy", "--quiet"]
    if insecure:
        args += ["--src-tls-verify=false"] if source.startswith("docker://") else []
        args += ["--dest-tls-verify=false"]
    if level is not None:
        args += ["--dest-compress-format", "zstd", "--dest-compress-level", str(level)]
    proc = subprocess.run([*args, source, dest], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"skopeo copy {source} {dest} failed: {proc.stderr.strip()}")


def served(ref):
    """(digest, config) of the image a tag names; None when the tag is absent."""
    client = registry.Client(ref)
    try:
        digest, manifest = client.image_manifest()
    except registry.RegistryError as e:
        if e.status == 404:
            return None
        raise
    return digest, manifest, json.loads(client.blob(manifest["config"]["digest"]))


def check_immutable(repository, immutable, diff_ids, force, log):
    """An immutable -zstd tag may already hold these layers (a re-push), never other ones."""
    for tag in zstd_tags(immutable):
        ref = f"{repository}:{tag}"
        found = served(ref)
        if found is None or found[2]["rootfs"]["diff_ids"] == diff_ids:
            log("INFO", f"{ref} is {'new' if found is None else 'already these layers'}")
        elif force:
            log("WARN", f"FORCE: overwriting immutable {ref}")
        else:
            raise RuntimeError(f"{ref} already holds other layers; immutable tags are never moved. "
                               "Bump the version, or FORCE=1 if you really mean to replace it")


def push(image_id, repository, tags, level, insecure, expected, log):
    """Copy the local image to every <tag>-zstd; read each back and check it. `expected`: the local
    image's (diff IDs, labels). -> the one digest of all -zstd tags."""
    names = [f"{repository}:{t}" for t in zstd_tags(tags)]
    log("INFO", f"pushing {names[0]} (zstd level {level}, skopeo)")
    # docker-daemon:<image id> names exactly the image the gzip tags were pushed from.
    copy(f"docker-daemon:{image_id}", f"docker://{names[0]}", insecure, level)
    for name in names[1:]:
        copy(f"docker://{names[0]}", f"docker://{name}", insecure)
    digests = set()
    for name in names:
        digest, manifest, config = served(name) or (None, {}, {})
        not_zstd = [media for _, _, media in registry.layers(manifest) if not media.endswith("+zstd")]
        if digest is None or not_zstd or not registry.layers(manifest):
            raise RuntimeError(f"{name}: expected only zstd layers, got {not_zstd or 'none'}")
        if config["rootfs"]["diff_ids"] != expected[0]:
            raise RuntimeError(f"{name} holds other layers than the image pushed ({image_id[:19]})")
        labels = config.get("config", {}).get("Labels") or {}
        if labels != expected[1]:
            raise RuntimeError(f"{name}'s labels differ from the image pushed")
        digests.add(digest)
    if len(digests) != 1:
        raise RuntimeError(f"the -zstd tags name different digests: {sorted(digests)}")
    digest = digests.pop()
    log("INFO", f"verified {repository}@{digest}: zstd layers, the same layers and labels, tags "
                f"{' '.join(zstd_tags(tags))}")
    return digest
