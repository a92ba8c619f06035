#!/usr/bin/env python3
"""Fetch the team's published image and check that what arrived is what the tag names (make pull;
make run/shell/smoke through `ensure`). REF is tagged only after every check passed.

Usage: pull.py pull   --ref REF [--digest D] [--identity ID [--issuer URL]]
       pull.py ensure --ref REF [same options]   REF here: nothing; else pull it; exit 3 when
                                                 nothing is published (the caller builds then)

Steps: ask the registry what REF names (the manifest's own sha256 must be the digest the registry
claims, and --digest when pinned); the signature (cosign, when --identity is given); free disk;
`docker pull NAME@DIGEST` (Docker then checks every byte against that digest); only then
`docker tag` REF. A failure prints one line (what happened, what to do) and tags nothing.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import reference
import registry
import registry_tls
import tag_labels
from logline import log

NOT_PUBLISHED = 3  # `ensure`'s exit status when the registry has no such tag: build instead
# A pull needs the compressed download and the unpacked layers on disk at once: the default row
# is 3.6 GB gzip and 7.0 GB unpacked, so 3x the compressed size, with room to spare.
DISK_FACTOR = 3


class Refused(Exception):
    pass


def docker(o, *args, check=True):
    proc = subprocess.run([o.docker, *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise Refused(f"`docker {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def local_present(o, ref):
    return docker(o, "image", "inspect", ref, check=False).returncode == 0


def server_major(o):
    out = docker(o, "version", "--format", "{{.Server.Version}}", check=False).stdout.strip()
    match = re.match(r"(\d+)\.", out)
    return int(match.group(1)) if match else None


def check_zstd(o, ref, manifest):
    """Docker before 23.0 downloads zstd layers and then fails to unpack them ("invalid tar
    header"): say so before downloading gigabytes."""
    major = server_major(o)
    if registry.is_zstd(manifest) and major is not None and major < 23:
        raise Refused(f"{ref.text} has zstd layers, which this Docker ({major}.x; 23.0 or newer reads "
                      "them) cannot unpack: pull the gzip tag (the same name without -zstd), or use "
                      "podman, or a newer Docker")


def check_signature(o, ref, digest):
    """cosign verify of the digest, when the caller names the signer (the release signs keylessly
    in GitHub Actions: the identity is its workflow file); otherwise say it was not checked."""
    if not o.identity:
        log("INFO", "signature not checked: no SIGNER_IDENTITY given (the release signs with cosign; "
                    "docs/distributing.md says how to require it)")
        return
    cosign = shutil.which("cosign")
    if not cosign:
        raise Refused("SIGNER_IDENTITY is set but cosign is not installed: install cosign "
                      "(github.com/sigstore/cosign releases), or unset SIGNER_IDENTITY to skip the check")
    proc = subprocess.run([cosign, "verify", ref.at(digest), "--certificate-identity", o.identity,
                           "--certificate-oidc-issuer", o.issuer], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise Refused(f"{ref.at(digest)} is not signed by {o.identity} ({last}): do not use it; "
                      "ask the release's maintainers")
    log("INFO", f"signature verified: {ref.at(digest)} signed by {o.identity}")


def check_disk(o, ref, manifest):
    """Refuse before downloading when Docker's disk cannot hold the image (the compressed
    download and the unpacked layers). Skipped when Docker's data is not on this machine."""
    root = docker(o, "info", "--format", "{{.DockerRootDir}}", check=False).stdout.strip()
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return
    need = DISK_FACTOR * sum(size for _, size, _ in registry.layers(manifest))
    if free < need:
        raise Refused(f"{ref.text} needs about {need / 1e9:.1f} GB free in {root} (3x its "
                      f"{need / DISK_FACTOR / 1e9:.1f} GB download); {free / 1e9:.1f} GB are free: "
                      "free some (docker image prune, docker system df), then run make pull again")


# docker pull's own failures, as the one line to print: (pattern in its output, message).
PULL_FAILURES = [
    (r"no space left on device", ("the disk filled up during the pull ({detail}): free space in Docker's "
     "data directory (docker image prune, docker system df), then run make pull again; layers already "
     "downloaded are kept, and nothing was tagged")),
    (r"invalid tar header|unsupported compression|zstd", ("Docker could not unpack a layer ({detail}): the "
     "image may have zstd layers (Docker 23.0 or newer reads them): pull the gzip tag instead")),
    (r"unauthorized|authentication required|denied", ("the registry refused the download ({detail}): "
     "docker login {host}, then run make pull again")),
    (r"connection refused|no such host|i/o timeout|TLS handshake|dial tcp|connection reset",
     ("the download from {host} broke off ({detail}): check the network, then run make pull again "
     "(layers already downloaded are kept)")),
]


def docker_pull(o, ref, digest):
    """docker pull NAME@DIGEST, its progress shown; a failure -> Refused with one line."""
    pinned = ref.at(digest)
    log("INFO", f"pulling {pinned}")
    lines = []
    with subprocess.Popen([o.docker, "pull", pinned], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout:
            lines.append(line.rstrip())
            print(f"  {line.rstrip()}", file=sys.stderr, flush=True)
    if proc.returncode == 0:
        return
    output = "\n".join(lines[-20:])
    detail = (lines or ["no output"])[-1].strip()
    if proc.returncode < 0 or proc.returncode in (130, 137, 143):
        raise Refused(f"the pull of {pinned} was stopped (signal): run make pull again; layers already "
                      "downloaded are kept, and nothing was tagged")
    for pattern, message in PULL_FAILURES:
        if re.search(pattern, output, re.IGNORECASE):
            raise Refused(message.format(detail=detail, host=ref.host))
    raise Refused(f"docker pull {pinned} failed ({detail}): run make pull again; nothing was tagged")


def pull(o):
    """Resolve, check, download, check again, tag. -> the digest."""
    ref = registry.Ref(o.ref)
    client = registry.Client(ref, insecure=registry_tls.docker_says_insecure(ref.host, o.docker))
    digest, _, _ = client.manifest()
    if o.digest and o.digest != digest:
        raise Refused(f"{ref.text} names {digest} in the registry, not the pinned DIGEST {o.digest}: "
                      "the tag was moved or the pin is stale; nothing was pulled")
    _, manifest = client.image_manifest(digest)
    log("INFO", f"{ref.text} is {digest} ({len(registry.layers(manifest))} layers, "
                f"{sum(s for _, s, _ in registry.layers(manifest)) / 1e9:.2f} GB compressed)")
    check_zstd(o, ref, manifest)
    check_signature(o, ref, digest)
    check_disk(o, ref, manifest)
    docker_pull(o, ref, digest)
    # What arrived must be recorded under the digest asked for: then REF may name it.
    attrs = json.loads(docker(o, "image", "inspect", ref.at(digest)).stdout)[0]
    if ref.at(digest) not in attrs.get("RepoDigests", []):
        raise Refused(f"after the pull, {ref.at(digest)} is not among the image's digests "
                      f"({attrs.get('RepoDigests')}): nothing was tagged; report this")
    contradiction = tag_labels.contradiction(ref.tag, (attrs.get("Config") or {}).get("Labels") or {})
    if contradiction:
        raise Refused(f"{ref.text} is not what its tag says: {contradiction}; nothing was tagged "
                      "(a mis-tagged push): use the digest of the image you want, and tell its publisher")
    if not ref.digest:
        docker(o, "tag", attrs["Id"], ref.text)
    log("INFO", f"pulled and verified {ref.text} ({digest}); it is image {attrs['Id'][:19]}")
    return digest


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("pull", "ensure"))
    ap.add_argument("--ref", required=True, help="REGISTRY/IMAGE:TAG (or @sha256:...)")
    ap.add_argument("--docker", default=os.environ.get("DOCKER", "docker"))
    ap.add_argument("--digest", default="", help="the digest the tag must name (a pin you trust)")
    ap.add_argument("--identity", default="", help="cosign certificate identity the signature must carry")
    ap.add_argument("--issuer", default="https://token.actions.githubusercontent.com",
                    help="cosign certificate OIDC issuer (GitHub Actions')")
    o = ap.parse_args(argv)
    if o.digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", o.digest):
        log("ERROR", f"DIGEST={o.digest!r} is not a digest: give sha256: and 64 hex digits")
        return 2
    bad = reference.problem(o.ref)
    if bad:  # before any request: Docker would refuse it too, and a 404 would only mislead
        log("ERROR", bad)
        return 2
    if o.command == "ensure" and local_present(o, o.ref):
        return 0
    try:
        pull(o)
    except registry.RegistryError as e:
        if o.command == "ensure" and e.status == 404:
            log("INFO", f"{o.ref} is not published: building it locally (make build)")
            return NOT_PUBLISHED
        log("ERROR", str(e))
        return 1
    except Refused as e:
        log("ERROR", str(e))
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        # Ctrl-C reaches docker pull too (one process group); the layers it finished are kept.
        log("ERROR", "make pull stopped (Ctrl-C): nothing was tagged; run it again (layers already "
                     "downloaded are kept)")
        sys.exit(130)
