"""make push ESGZ=1: every tag also as <tag>-esgz, the same image with eStargz layers, which a node
with the stargz snapshotter pulls lazily (it starts before the download ends: docs/distributing.md#lazy-pulls-estargz)
and every other runtime, Docker 20.10 included, pulls and runs as an ordinary gzip image.

Neither Docker 20.10 nor skopeo writes eStargz, so Debian's `ctr-remote` (package stargz-snapshotter)
converts, in a throw-away containerd (root only; its own root, state and socket, removed after):
skopeo copies the local Docker image in, `ctr-remote image convert --estargz` puts the files a
start reads (scripts/lazy/first-work.jsonl: recorded by `ctr-remote image optimize` running the
entrypoint, sshd and Jupyter's start; see benchmarks/bench_start.py) first in each layer, before
its prefetch landmark, and skopeo pushes the result unchanged (--preserve-digests), with the registry
credentials it and Docker share. Then each tag is read back: every layer must carry its
table-of-contents digest, the config the local image's labels.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import registry
from push_zstd import served, skopeo

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "lazy"))
import node
import toc

SUFFIX = "-esgz"
RECORD = pathlib.Path(__file__).resolve().parent / "lazy" / "first-work.jsonl"
TOC_ANNOTATION = "containerd.io/snapshot/stargz/toc.digest"


def esgz_tags(tags):
    return [t + SUFFIX for t in tags]


def tools():
    """Everything ESGZ=1 needs, checked before anything is pushed."""
    skopeo()
    missing = [n for n in ("containerd", os.environ.get("CTR_REMOTE", "ctr-remote")) if not shutil.which(n)]
    if missing:
        raise RuntimeError(f"ESGZ=1 needs {' and '.join(missing)} (apt-get install containerd stargz-snapshotter): "
                           "ctr-remote converts to eStargz in a throw-away containerd")
    if not RECORD.is_file():
        raise RuntimeError(f"{RECORD} is missing: it lists the files to put first (benchmarks/bench_start.py makes it)")
    if os.geteuid() != 0:
        raise RuntimeError("ESGZ=1 runs a throw-away containerd to convert, which needs root: run make push as root")


def toc_digests(manifest):
    """Each layer's table-of-contents digest annotation ('' where it has none)."""
    return [layer.get("annotations", {}).get(TOC_ANNOTATION, "") for layer in manifest.get("layers", [])]


def check_immutable(repository, immutable, labels, force, log):
    """An immutable -esgz tag may already hold this image (same labels: a re-push), never another one.
    eStargz layers differ from the gzip ones by design, so the labels (version, revision) identify it."""
    for tag in esgz_tags(immutable):
        ref = f"{repository}:{tag}"
        found = served(ref)
        if found is None or (found[2].get("config", {}).get("Labels") or {}) == labels:
            log("INFO", f"{ref} is {'new' if found is None else 'already this image'}")
        elif force:
            log("WARN", f"FORCE: overwriting immutable {ref}")
        else:
            raise RuntimeError(f"{ref} already holds another image; immutable tags are never moved. "
                               "Bump the version, or FORCE=1 if you really mean to replace it")


def convert(image_id, archive, level, work, log):
    """The local Docker image -> an OCI archive with eStargz layers (a throw-away containerd)."""
    source, target = work / "source.tar", "team-dl-esgz:converted"
    subprocess.run([skopeo(), "copy", "--quiet", f"docker-daemon:{image_id}", f"oci-archive:{source}:source"],
                   check=True, capture_output=True, text=True)
    with node.containerd_node(work / "containerd", stargz=False) as n:
        n.ctr("images", "import", "--no-unpack", "--base-name", "team-dl-esgz", str(source))
        source.unlink()
        log("INFO", f"converting to eStargz (level {level}; files first: {RECORD.name})")
        n.ctr("images", "convert", "--oci", "--estargz", "--estargz-compression-level", str(level),
              "--estargz-record-in", str(RECORD), "team-dl-esgz:source", target, timeout=7200)
        n.ctr("images", "export", str(archive), target)


def push(image_id, repository, tags, level, insecure, labels, log):
    """Convert the local image, push it to every <tag>-esgz; read each back and check it.
    -> the one digest of all -esgz tags."""
    names = [f"{repository}:{t}" for t in esgz_tags(tags)]
    work = pathlib.Path(tempfile.mkdtemp(prefix="team-dl-esgz-", dir=os.environ.get("ESGZ_WORK", "/var/tmp")))
    try:
        archive = work / "esgz.tar"
        convert(image_id, archive, level, work, log)
        log("INFO", f"pushing {names[0]} (eStargz, skopeo)")
        for name in names:
            args = [skopeo(), "copy", "--quiet", "--preserve-digests"] + (["--dest-tls-verify=false"] if insecure else [])
            proc = subprocess.run([*args, f"oci-archive:{archive}", f"docker://{name}"],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"skopeo copy to {name} failed: {proc.stderr.strip()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    digests = set()
    for name in names:
        digest, manifest, config = served(name) or (None, {}, {})
        tocs = toc_digests(manifest)
        if digest is None or not tocs or not all(tocs):
            raise RuntimeError(f"{name}: expected eStargz layers (each with {TOC_ANNOTATION}), got "
                               f"{sum(map(bool, tocs))} of {len(tocs)}")
        client = registry.Client(name)
        for layer in manifest["layers"]:  # the TOC itself, read back as a node reads it (kilobytes)
            try:
                toc.toc_of_remote_layer(client, layer)
            except toc.TOCError as e:
                raise RuntimeError(f"{name}: layer {layer['digest'][:19]}: {e}") from None
        if (config.get("config", {}).get("Labels") or {}) != labels:
            raise RuntimeError(f"{name}'s labels differ from the image pushed ({image_id[:19]})")
        digests.add(digest)
    if len(digests) != 1:
        raise RuntimeError(f"the -esgz tags name different digests: {sorted(digests)}")
    digest = digests.pop()
    log("INFO", f"verified {repository}@{digest}: eStargz layers whose TOCs match their digests, the same labels, "
                f"tags {' '.join(esgz_tags(tags))}")
    return digest


def record_paths():
    """The paths first-work.jsonl lists, in order (what --estargz-record-in reads)."""
    return [json.loads(line)["path"] for line in RECORD.read_text().splitlines() if line.strip()]


__all__ = ["check_immutable", "esgz_tags", "push", "record_paths", "registry", "tools"]
