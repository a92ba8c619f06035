#!/usr/bin/env python3
"""Publish a built image to a registry under all its tags, refusing anything untruthful,
then pull it back by digest and check the digest and the labels (`make push` runs this).

Usage: push.py push      --repository REG/NAME --tag TAG [options]   refuse/push/verify/record
       push.py preflight --repository REG/NAME --tag TAG [options]   only the refusal checks
                         (no --image: CI before building, or before tagging --digest D)
       push.py verify    --repository REG/NAME --tag TAG --digest D  check published tags (CI)

Refusals (exit 1, nothing pushed): a dirty work tree; an image whose revision/version labels
are not the work tree's HEAD and the tag; an immutable tag (the descriptive tag, sha-<sha>)
that already names a different image in the registry, unless --force (FORCE=1).
Moving tags (2.6, latest) are moved without asking. Only the docker CLI is needed (and skopeo
for --zstd-level: every tag also as <tag>-zstd, scripts/push_zstd.py; skopeo, containerd and
ctr-remote, as root, for --esgz-level: every tag also as <tag>-esgz, scripts/push_esgz.py).
"""
import argparse
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys

import build_info
import push_esgz
import push_zstd
import reference
import registry_tls
from logline import log

DOCKER = os.environ.get("DOCKER", "docker")
LABEL_REVISION = "org.opencontainers.image.revision"
LABEL_VERSION = "org.opencontainers.image.version"


def refuse(message):
    log("ERROR", message)
    sys.exit(1)


def run(*args, check=True):
    """Run a command; return its CompletedProcess (stdout/stderr as text)."""
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        refuse(f"`{' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def stream(*args):
    """Run a long command (docker push of GBs), echoing its lines to stderr; return its stdout."""
    lines = []
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            lines.append(line)
            print(f"  {line.rstrip()}", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        refuse(f"`{' '.join(args)}` failed ({proc.returncode})")
    return "".join(lines)


def git(worktree, *args):
    return run("git", "-C", str(worktree), *args).stdout


def check_clean(worktree):
    dirty = git(worktree, "status", "--porcelain", "--untracked-files=normal").splitlines()
    if dirty:
        shown = "\n  ".join(dirty[:10]) + ("\n  ..." if len(dirty) > 10 else "")
        refuse(f"work tree {worktree} is dirty; commit or stash first, so sha-<sha> names "
               f"what was built:\n  {shown}")


def local_image(candidates):
    """The local image to publish: (ref, image id, labels). Candidates that exist must agree,
    or a stale registry-qualified tag could be pushed instead of the fresh build."""
    found = {}
    for ref in candidates:
        proc = run(DOCKER, "image", "inspect", ref, check=False)
        if proc.returncode == 0:
            found[ref] = json.loads(proc.stdout)[0]
    if not found:
        refuse(f"no local image {' or '.join(candidates)}: run `make build` first")
    if len({a["Id"] for a in found.values()}) > 1:
        refuse("these local tags name different images; remove the stale one: "
               + ", ".join(f"{r} ({a['Id'][:19]})" for r, a in found.items()))
    ref, attrs = next(iter(found.items()))
    return ref, attrs["Id"], attrs["Config"].get("Labels") or {}


def ask_registry(ref, insecure):
    """What the registry holds under ref, as `docker manifest inspect -v` reports it: (entries,
    is_index), one entry per platform image; None when the tag is absent. The one place this
    script asks a registry about a tag."""
    args = [DOCKER, "manifest", "inspect", "-v"] + (["--insecure"] if insecure else []) + [ref]
    proc = run(*args, check=False)
    if proc.returncode != 0:
        if re.search(r"no such manifest|manifest unknown|not found", proc.stderr, re.IGNORECASE):
            return None
        refuse(f"cannot read {ref} from the registry: {proc.stderr.strip()}")
    entries = json.loads(proc.stdout)
    return (entries, True) if isinstance(entries, list) else ([entries], False)


def remote_config_digest(ref, insecure):
    """The config digest (= image id) the registry has under ref; None when the tag is absent.
    For a multi-platform index, the linux/amd64 image's."""
    found = ask_registry(ref, insecure)
    if found is None:
        return None
    for entry in found[0]:
        platform = entry.get("Descriptor", {}).get("platform", {})
        if platform.get("os", "linux") == "linux" and platform.get("architecture", "amd64") == "amd64":
            manifest = entry.get("SchemaV2Manifest") or entry.get("OCIManifest") or {}
            if "config" in manifest:
                return manifest["config"]["digest"]
    refuse(f"{ref} exists but has no linux/amd64 image; inspect it by hand")


def check_immutable(repository, tags, image_id, force, insecure):
    """Refuse when an immutable tag already names a different image (unless forced)."""
    for tag in tags:
        existing = remote_config_digest(f"{repository}:{tag}", insecure)
        if existing is None:
            log("INFO", f"{repository}:{tag} is new")
        elif existing == image_id:
            log("INFO", f"{repository}:{tag} already names this image ({image_id[:19]})")
        elif force:
            log("WARN", f"FORCE: overwriting immutable {repository}:{tag} ({existing[:19]} -> "
                        f"{image_id[:19]})")
        else:
            refuse(f"{repository}:{tag} already names another image ({existing[:19]}, this is "
                   f"{image_id[:19]}); immutable tags are never moved. Bump the version, or "
                   f"FORCE=1 if you really mean to replace it")


def check_labels(labels, sha, tag):
    """The tag must say what the image says it is: built from HEAD, versioned as the tag."""
    if labels.get(LABEL_REVISION) != sha:
        refuse(f"image label {LABEL_REVISION}={labels.get(LABEL_REVISION)!r} but the work tree "
               f"is at {sha}: rebuild (make build) from this commit")
    if labels.get(LABEL_VERSION) != tag:
        refuse(f"image label {LABEL_VERSION}={labels.get(LABEL_VERSION)!r} but the tag is "
               f"{tag!r}: rebuild with this TAG")


def push_tags(source, repository, tags):
    """Tag and push; return the manifest digest the registry reported (the same for all).
    The registry-qualified tags made here are removed again, so a later build under the plain
    name is never shadowed by an old qualified tag."""
    digests = set()
    try:
        for tag in tags:
            ref = f"{repository}:{tag}"
            run(DOCKER, "tag", source, ref)
            log("INFO", f"pushing {ref}")
            out = stream(DOCKER, "push", ref)
            match = re.search(r"digest: (sha256:[0-9a-f]{64})", out)
            if not match:
                refuse(f"`docker push {ref}` printed no digest:\n{out}")
            digests.add(match.group(1))
    finally:
        for tag in tags:
            if f"{repository}:{tag}" != source:
                run(DOCKER, "image", "rm", f"{repository}:{tag}", check=False)
    if len(digests) != 1:
        refuse(f"the tags were pushed with different digests: {sorted(digests)}")
    return digests.pop()


def platforms(ref, insecure):
    """The platforms of ref's images ("linux/arm64", ...), attestation manifests (buildx lists
    them as unknown/unknown) left out; [None] for a single image (pulled as this host's)."""
    entries, is_index = ask_registry(ref, insecure) or ([], False)
    if not is_index:
        return [None]
    found = {f"{p.get('os')}/{p.get('architecture')}" for p in
             (e.get("Descriptor", {}).get("platform") or {} for e in entries)}
    return sorted(found - {"unknown/unknown", "None/None"})


def pull_back(pinned, platform, expected_id, expected_labels):
    """Pull one platform's image of pinned (None: this host's); check its labels (and its id, for
    make push's own image); return its labels."""
    log("INFO", f"pulling back {pinned}" + (f" for {platform}" if platform else ""))
    run(DOCKER, "pull", "-q", *(["--platform", platform] if platform else []), pinned)
    attrs = json.loads(run(DOCKER, "image", "inspect", pinned).stdout)[0]
    if expected_id or platform:
        # Drop only the digest reference the pull added: the source keeps its tags, and the next
        # platform's pull of the same index digest is not refused ("Cannot overwrite digest").
        run(DOCKER, "image", "rm", pinned, check=False)
    if expected_id and attrs["Id"] != expected_id:
        refuse(f"{pinned} is image {attrs['Id']}, not the one built ({expected_id})")
    if platform and f"{attrs.get('Os')}/{attrs.get('Architecture')}" != platform:
        refuse(f"{pinned} gave a {attrs.get('Os')}/{attrs.get('Architecture')} image when asked for {platform}")
    labels = attrs["Config"].get("Labels") or {}
    wrong = {k: (labels.get(k), v) for k, v in expected_labels.items() if labels.get(k) != v}
    if wrong:
        refuse(f"{pinned} {platform or ''} labels differ from what was built (got, expected): {wrong}")
    return labels


def verify(repository, tags, digest, expected_id, expected_labels, insecure):
    """Pull back by digest: the registry must serve the image we built, under every tag; from a
    multi-platform index (the release workflow's), every platform's image, each checked."""
    pinned = f"{repository}@{digest}"
    if expected_id:  # make push: the one local image, this host's platform
        labels = pull_back(pinned, None, expected_id, expected_labels)
    else:
        checked = [pull_back(pinned, p, None, expected_labels) for p in platforms(pinned, insecure)]
        labels = checked[0]
    for tag in tags:
        served = served_digest(f"{repository}:{tag}", insecure)
        if served != digest:
            refuse(f"{repository}:{tag} resolves to {served}, not {digest}")
    log("INFO", f"verified {pinned}: digest, image id and {len(expected_labels)} labels match; "
                f"tags {' '.join(tags)} resolve to it")
    return labels


def served_digest(ref, insecure, must_exist=True):
    """The manifest digest the registry serves for ref (the index's, for a multi-platform
    image); None when the tag is absent and must_exist is false. `docker manifest inspect`
    lists an index's images but not the index's own digest: buildx imagetools gives it, and
    without buildx (the Debian 20.10 client) a pull does."""
    found = ask_registry(ref, insecure)
    if found is None:
        if must_exist:
            refuse(f"{ref} is not in the registry")
        return None
    entries, is_index = found
    if not is_index:
        return entries[0]["Descriptor"]["digest"]
    if run(DOCKER, "buildx", "version", check=False).returncode == 0:
        out = run(DOCKER, "buildx", "imagetools", "inspect", ref, "--format", "{{json .Manifest}}").stdout
        return json.loads(out)["digest"]
    run(DOCKER, "pull", "-q", ref)
    repo = ref.rsplit(":", 1)[0]
    attrs = json.loads(run(DOCKER, "image", "inspect", ref).stdout)[0]
    return next((d.split("@", 1)[1] for d in attrs.get("RepoDigests", [])
                 if d.startswith(repo + "@")), None)


# Options whose value may start with '-' (TAG=-x): argparse would take `--tag -x` for two options.
VALUE_OPTIONS = ("--repository", "--tag", "--moving", "--extra-immutable", "--flavour", "--image", "--digest")


def values_joined(argv):
    """`--tag -x` -> `--tag=-x`, so a value is never mistaken for an option."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in VALUE_OPTIONS and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def check_reference(args):
    """REGISTRY, IMAGE and TAG as typed (make's variables), then --repository and --tag, against
    Docker's grammar: one line naming what is wrong, before git or Docker is asked anything."""
    bad = reference.make_vars_problem()
    if not bad:
        bad = reference.ref_problem(f"{args.repository}:{args.tag}") if args else None
    if bad:
        refuse(bad)


def parse_args(argv):
    check_reference(None)  # make's TAG='Bad Tag' reaches argv split in two: check it whole first
    argv = values_joined(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["push", "preflight", "verify"])
    ap.add_argument("--repository", required=True, help="REGISTRY/IMAGE, e.g. ghcr.io/acme/team-dl")
    ap.add_argument("--tag", required=True, help="the descriptive immutable tag")
    ap.add_argument("--moving", default="", help="space-separated moving tags, e.g. '2.6 latest'")
    ap.add_argument("--extra-immutable", default="", help="more immutable tags (space-separated)")
    ap.add_argument("--no-sha-tag", action="store_true", help="do not add sha-<sha>")
    ap.add_argument("--flavour", default="",
                    help="a non-default versions.json row: its sha tag is sha-<sha>-FLAVOUR")
    ap.add_argument("--image", action="append", default=[],
                    help="local image to publish (repeatable: the first that exists is used)")
    ap.add_argument("--worktree", default=".", help="git work tree the image was built from")
    ap.add_argument("--digest", help="verify: the digest pushed; preflight: the one to be tagged")
    ap.add_argument("--label", action="append", default=[], help="verify: expected KEY=VALUE")
    ap.add_argument("--force", action="store_true", default=os.environ.get("FORCE") == "1",
                    help="replace an immutable tag that names another image (FORCE=1)")
    ap.add_argument("--record", default="artifacts/publish", help="directory for the publish record")
    ap.add_argument("--zstd-level", type=int, default=None,
                    help="also push every tag as <tag>-zstd, zstd layers at this level (make push ZSTD=1)")
    ap.add_argument("--esgz-level", type=int, default=None,
                    help="also push every tag as <tag>-esgz, eStargz layers at this gzip level (make push ESGZ=1)")
    args = ap.parse_args(argv)
    if args.repository.startswith("/") or "/" not in args.repository:
        refuse(f"repository {args.repository!r} names no registry: set REGISTRY (e.g. ghcr.io/acme)")
    check_reference(args)
    return args


def preflight_digest(repository, immutable, digest, force, insecure):
    """CI, before building or promoting: an immutable tag may only name digest (a re-run of the
    same promotion); without one, any existing tag would be replaced."""
    for tag in immutable:
        ref = f"{repository}:{tag}"
        existing = served_digest(ref, insecure, must_exist=False)
        if existing is None or existing == digest:
            log("INFO", f"{ref} is {'new' if existing is None else 'already this digest'}")
        elif force:
            log("WARN", f"FORCE: immutable {ref} ({existing[:19]}) will be replaced")
        else:
            refuse(f"{ref} already exists ({existing[:19]}); immutable tags are never "
                   f"moved (force to replace)")


def main(argv):
    args = parse_args(argv)
    # What dockerd counts as insecure (loopback by default, and daemon.json's insecure-registries):
    # docker manifest inspect needs --insecure for it, as docker pull/push need nothing.
    insecure = registry_tls.docker_says_insecure(args.repository.split("/", 1)[0], DOCKER)
    worktree = pathlib.Path(args.worktree).resolve()
    check_clean(worktree)
    sha = build_info.git_sha(worktree)  # clean: the sha the build wrote into its label
    # Every row is built from the same commit: the sha tag names the row too (build_info.sha_tag).
    sha_tag = build_info.flavoured_sha_tag(sha, args.flavour)
    immutable = [args.tag] + ([] if args.no_sha_tag else [sha_tag]) + args.extra_immutable.split()
    tags = immutable + args.moving.split()

    if args.command == "verify":
        if not args.digest:
            refuse("verify needs --digest")
        expected = dict(kv.split("=", 1) for kv in args.label)
        labels = verify(args.repository, tags, args.digest, None, expected, insecure)
        write_record(args, tags, immutable, args.digest, None, sha, labels)
        return

    if args.command == "preflight" and not args.image:
        preflight_digest(args.repository, immutable, args.digest, args.force, insecure)
        log("INFO", f"preflight passed for {' '.join(tags)}")
        return

    source, image_id, labels = local_image(args.image or [f"{args.repository}:{args.tag}"])
    check_labels(labels, sha, args.tag)
    check_immutable(args.repository, immutable, image_id, args.force, insecure)
    diff_ids = json.loads(run(DOCKER, "image", "inspect", image_id).stdout)[0]["RootFS"]["Layers"]
    if args.zstd_level is not None:
        zstd_step(push_zstd.skopeo)  # missing: refused before anything is pushed
        zstd_step(push_zstd.check_immutable, args.repository, immutable, diff_ids, args.force, log)
    if args.esgz_level is not None:
        zstd_step(push_esgz.tools)  # missing or not root: refused before anything is pushed
        zstd_step(push_esgz.check_immutable, args.repository, immutable, labels, args.force, log)
    if args.command == "preflight":
        log("INFO", f"preflight passed for {source} -> {' '.join(tags)}")
        return

    digest = push_tags(source, args.repository, tags)
    verify(args.repository, tags, digest, image_id, labels, insecure)
    zstd = None
    if args.zstd_level is not None:
        zstd = {"digest": zstd_step(push_zstd.push, image_id, args.repository, tags, args.zstd_level,
                                    insecure, (diff_ids, labels), log),
                "tags": push_zstd.zstd_tags(tags), "level": args.zstd_level}
    esgz = None
    if args.esgz_level is not None:
        esgz = {"digest": zstd_step(push_esgz.push, image_id, args.repository, tags, args.esgz_level,
                                    insecure, labels, log),
                "tags": push_esgz.esgz_tags(tags), "level": args.esgz_level}

    write_record(args, tags, immutable, digest, image_id, sha, labels, zstd, esgz)


def zstd_step(step, *args):
    """A push_zstd or push_esgz step; its failure (a tool missing, a registry error, a check) -> one line."""
    try:
        return step(*args)
    except (RuntimeError, push_zstd.registry.RegistryError) as e:
        refuse(str(e))


def write_record(args, tags, immutable, digest, image_id, sha, labels, zstd=None, esgz=None):
    """The publish record beside the manifest: what was pushed where, and what it says it is."""
    record_dir = pathlib.Path(args.record)
    record_dir.mkdir(parents=True, exist_ok=True)
    record = {"repository": args.repository, "digest": digest, "image_id": image_id,
              "tags": tags, "immutable_tags": immutable, "revision": sha, "labels": labels,
              "pushed": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    if zstd:
        record["zstd"] = zstd
    if esgz:
        record["esgz"] = esgz
    path = record_dir / f"{args.tag}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    log("INFO", f"published {args.repository}@{digest} as {' '.join(tags)}; record in {path}")
    print(f"{args.repository}@{digest}")


if __name__ == "__main__":
    main(sys.argv[1:])
