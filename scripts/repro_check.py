#!/usr/bin/env python3
"""Are the image's layers reproducible? Builds the image twice without build cache, the second
time from a fresh copy of the tree (new mtimes, umask 002: what another clone gives), and
compares the layers' diff IDs from the first Python layer up; names the files that differ.

Usage: repro_check.py --image NAME [--build-arg KEY=VALUE]... [--report FILE] [--keep]
  --build-arg  passed to every build (make repro-check: the reduced build's stand-ins)
  --report     write the measured result as Markdown (benchmarks/results/repro_*.md)
  --keep       keep the two images (NAME:repro-a, NAME:repro-b); by default they are removed
Exit status 0: identical from the Python layers up; 1: they differ; 2: a build failed.
"""
import argparse
import hashlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")


def fresh_copy(dest):
    """The tracked and untracked-but-not-ignored files, copied as a new clone would have them:
    mtime now, and modes from umask 002 (group-writable), which a build must not keep."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    old = os.umask(0o002)
    try:
        for name in filter(None, names):
            src, dst = ROOT / name, pathlib.Path(dest, name)
            if not src.exists() and not src.is_symlink():
                continue  # deleted in the work tree, not yet in git
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                dst.symlink_to(os.readlink(src))
            else:
                shutil.copyfile(src, dst)
                if os.access(src, os.X_OK):
                    dst.chmod(0o775)
    finally:
        os.umask(old)


def make_build(tree, image, tag, build_args, target="runtime", no_cache=True):
    """`make build` of that tree, as a person runs it; BUILD_OPTS is read by a shell: quoted."""
    opts = " ".join(["--no-cache"] * no_cache + [f"--build-arg {shlex.quote(a)}" for a in build_args])
    cmd = ["make", "-s", "-C", str(tree), "build", f"IMAGE={image}", f"TAG={tag}", "PREFLIGHT=0",
           f"TARGET={target}", f"BUILD_OPTS={opts}"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        sys.exit(f"repro_check: `make build` of {image}:{tag} failed (exit {proc.returncode}); its output is above")
    return time.monotonic() - start


def diff_ids(ref):
    out = subprocess.run([DOCKER, "image", "inspect", "-f", "{{json .RootFS.Layers}}", ref],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def layer_entries(ref, indices):
    """{index: {path: (type, mode, uid, gid, mtime, size, link, sha256)}} for those layers of an
    image, read from one streamed `docker save` (no copy of the image on disk)."""
    proc = subprocess.Popen([DOCKER, "save", ref], stdout=subprocess.PIPE)
    by_name, manifest = {}, None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as saved:
        for member in saved:
            if member.name == "manifest.json":
                manifest = json.load(saved.extractfile(member))
            elif member.isfile() and (member.name.endswith("layer.tar") or member.name.startswith("blobs/")):
                by_name[member.name] = _listing(saved.extractfile(member))
    proc.wait()
    order = manifest[0]["Layers"]
    return {i: by_name[order[i]] for i in indices}


def _listing(fileobj):
    entries = {}
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as layer:
            for m in layer:
                digest = ""
                if m.isfile():
                    h, f = hashlib.sha256(), layer.extractfile(m)
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                    digest = h.hexdigest()[:12]
                entries[m.name] = (m.type.decode(), oct(m.mode), m.uid, m.gid, m.mtime, m.size, m.linkname, digest)
    except tarfile.ReadError:
        pass  # an OCI blob that is no tar (the config, an index): not a layer
    return entries


def explain(ea, eb, limit=15):
    """What differs between two listings of a layer, entry by entry."""
    lines = [f"    {name}: {ea.get(name, 'absent')} vs {eb.get(name, 'absent')}"
             for name in sorted(set(ea) | set(eb)) if ea.get(name) != eb.get(name)]
    more = f"\n    ... and {len(lines) - limit} more" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


def compare(a, b, below):
    """(indices of the layers at or above `below` that differ, what differs in them)."""
    la, lb = diff_ids(a), diff_ids(b)
    if len(la) != len(lb):
        return list(range(below, max(len(la), len(lb)))), f"  {a} has {len(la)} layers, {b} {len(lb)}"
    differ = [i for i in range(below, len(la)) if la[i] != lb[i]]
    if not differ:
        return differ, ""
    ea, eb = layer_entries(a, differ), layer_entries(b, differ)
    return differ, "\n".join(f"  layer {i + 1} ({la[i][7:19]} vs {lb[i][7:19]}):\n{explain(ea[i], eb[i])}"
                             for i in differ)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", required=True)
    p.add_argument("--build-arg", action="append", default=[])
    p.add_argument("--report")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    a, b = f"{args.image}:repro-a", f"{args.image}:repro-b"
    try:
        seconds_a = make_build(ROOT, args.image, "repro-a", args.build_arg)
        with tempfile.TemporaryDirectory(prefix="repro-clone-") as clone:
            fresh_copy(clone)
            seconds_b = make_build(clone, args.image, "repro-b", args.build_arg)
            # The layers below the Python ones (base, apt, user) are the system stage's: cached now.
            make_build(clone, args.image, "repro-system", args.build_arg, target="system", no_cache=False)
        below = len(diff_ids(f"{args.image}:repro-system"))
        la, lb = diff_ids(a), diff_ids(b)
        differ, details = compare(a, b, below)
        low = sum(x != y for x, y in zip(la[:below], lb[:below]))
        summary = (f"{len(la) - below} layers from the first Python layer up (layers {below + 1}-{len(la)} "
                   f"of {len(la)}): {len(la) - below - len(differ)} identical, {len(differ)} differ; "
                   f"below them {low} of {below} differ (base, apt, user: not required). "
                   f"Builds: {seconds_a:.0f} s and {seconds_b:.0f} s without cache.")
        print(f"repro_check: {'FAIL' if differ else 'OK'}: {summary}")
        if differ:
            print(details)
            print("repro_check: normalize what differs in the stage that makes that tree "
                  "(docker/build/layer-trees.py normalize): mtimes, modes, owners, dates in files")
        if args.report:
            write_report(args.report, summary, la, lb, below, details if differ else "")
        return 1 if differ else 0
    finally:
        if not args.keep:
            subprocess.run([DOCKER, "image", "rm", a, b, f"{args.image}:repro-system"],
                           capture_output=True, check=False)


def write_report(path, summary, la, lb, below, details):
    rows = "\n".join(f"| {i + 1} | {'Python and up' if i >= below else 'below'} | `{x[7:19]}` | `{y[7:19]}` | "
                     f"{'same' if x == y else 'DIFFERENT'} |" for i, (x, y) in enumerate(zip(la, lb)))
    pathlib.Path(path).write_text(
        f"# Reproducible layers: two builds without cache ({time.strftime('%Y-%m-%d')})\n\n"
        f"`scripts/repro_check.py` (make repro-check-full): {summary}\n\n"
        "| Layer | Part | Diff ID, build A | Diff ID, build B | |\n|---|---|---|---|---|\n"
        f"{rows}\n" + (f"\n```\n{details}\n```\n" if details else ""))


if __name__ == "__main__":
    sys.exit(main())
