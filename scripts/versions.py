#!/usr/bin/env python3
"""Read versions.json, the one file that declares the image matrix (each row: torch, CUDA,
cuDNN, NCCL, Python, the base image and its digest, the minimum driver, the moving tags).
What a build is called and built with (tags, git revision, build args) is build_info.py's
job; the files that repeat versions are written by generate.py.

Usage: versions.py get KEY [--row NAME]      print one field of a matrix row (default row)
       versions.py standin KEY                print one field of the stand-in base section
       versions.py rows [--platform P]        print the row names, one per line (.ci/run); with
                                              --platform, only the rows that publish P
       versions.py matrix                     print the row names as compact JSON (CI matrix)
       versions.py builds                     print one CI matrix entry per row and platform
                                              (row, platform, arch, the native runner), JSON
       versions.py pypi-as-of                 print versions.json's pypi_as_of (empty: none)
       versions.py min-python                 print the oldest Python of any row (make lint's vermin)
       versions.py base-image [--row NAME] [--require-digest]
                                              print the base a build uses, base_image@digest
                                              (--require-digest: fail when the digest is
                                              missing, as the release workflow does)
"""
import json
import pathlib
import re
import sys

# GitHub-hosted runners of each platform's own CPU: the release workflow builds natively, as
# emulating arm64 on an x86 runner (QEMU) makes the build many times slower.
RUNNERS = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}

PATH = pathlib.Path(__file__).resolve().parent.parent / "versions.json"
DATA = json.loads(PATH.read_text())
# A row that names no platforms publishes linux/amd64 only (torch's CUDA wheels for aarch64 exist
# for recent releases only: scripts/check_wheels.py proves each platform a row adds).
for _r in DATA["matrix"]:
    _r.setdefault("platforms", ["linux/amd64"])


def row(name=None):
    """The matrix row called name (versions.json's default row when None)."""
    name = name or DATA["default"]
    for r in DATA["matrix"]:
        if r["name"] == name:
            return r
    sys.exit(f"versions.py: no matrix row named {name!r}; rows: {[r['name'] for r in DATA['matrix']]}")


def base_image(r):
    """The base as builds use it: pinned by digest when versions.json has one. Docker resolves
    `name:tag@digest` by the digest alone; the tag stays for people reading it."""
    digest = r.get("base_image_digest", "")
    return f"{r['base_image']}@{digest}" if digest else r["base_image"]


def support(r):
    """What a row's users are told about its future (README, docs/support.md, make doctor, labels):
    {legacy, rebuilds_until, new_projects}. A legacy row must say until when it is rebuilt, and the
    row new projects start on must exist and not be legacy."""
    start = DATA.get("new_projects") or DATA["default"]
    if start not in {x["name"] for x in DATA["matrix"]} or row(start).get("legacy"):
        sys.exit(f"versions.py: new_projects {start!r} must name a versions.json row that is not legacy")
    if r.get("legacy") and not r.get("rebuilds_until"):
        sys.exit(f"versions.py: row {r['name']} is legacy but has no rebuilds_until: say until when it is rebuilt")
    return {"legacy": bool(r.get("legacy")), "rebuilds_until": r.get("rebuilds_until", ""), "new_projects": start}


def nvidia_require_cuda(r):
    """The image's NVIDIA_REQUIRE_CUDA, checked by the NVIDIA Container Toolkit before start (its
    syntax: a space separates alternatives, a comma joins conditions). PyTorch's CUDA wheels run
    on any driver of the same CUDA major (minor-version compatibility), from min_driver on; the
    image removes the forward-compat libraries, so older drivers cannot work and are refused."""
    return f"cuda>={r['cuda'].split('.')[0]}.0,driver>={r['min_driver']}"


def pypi_as_of():
    """The time every build installs PyPI as of (pip --uploaded-prior-to); "" for the newest.
    One value for all rows: they share requirements.txt."""
    return DATA.get("pypi_as_of", "")


def require_digest(r):
    digest = r.get("base_image_digest", "")
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        sys.exit(f"versions.py: row {r['name']!r} has no valid base_image_digest ({digest!r}): "
                 f"pin {r['base_image']} by digest in versions.json first (docs/building.md: Pinning the base)")


def option(args, flag):
    """Remove `flag VALUE` from args and return VALUE (None when absent)."""
    if flag not in args:
        return None
    i = args.index(flag)
    value = args[i + 1]
    del args[i:i + 2]
    return value


def main(argv):
    if not argv:
        sys.exit(__doc__)
    cmd, args = argv[0], argv[1:]
    name = option(args, "--row")
    if cmd == "get":
        print(row(name)[args[0]])
    elif cmd == "standin":
        print(DATA["standin"][args[0]])
    elif cmd == "rows":
        platform = option(args, "--platform")
        print("\n".join(r["name"] for r in DATA["matrix"] if platform in (None, *r["platforms"])))
    elif cmd == "matrix":
        print(json.dumps({"row": [r["name"] for r in DATA["matrix"]]}, separators=(",", ":")))
    elif cmd == "builds":
        include = [{"row": r["name"], "platform": p, "arch": p.split("/", 1)[1], "runner": RUNNERS[p]}
                   for r in DATA["matrix"] for p in r["platforms"]]
        print(json.dumps({"include": include}, separators=(",", ":")))
    elif cmd == "min-python":
        print(min((r["python"] for r in DATA["matrix"]), key=lambda v: tuple(map(int, v.split(".")))))
    elif cmd == "pypi-as-of":
        print(pypi_as_of())
    elif cmd == "base-image":
        if "--require-digest" in args:
            require_digest(row(name))
        print(base_image(row(name)))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
