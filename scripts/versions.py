#!/usr/bin/env python3
"""Read versions.json, the single source of truth for the image matrix.

Usage: versions.py get KEY [--row NAME]   print one field of a matrix row (default row)
       versions.py standin KEY             print one field of the stand-in base section
       versions.py rows                    print the row names, one per line (CI matrix)
       versions.py make-vars [--row NAME]  print Makefile assignments (VAR := value)
       versions.py tag [--row NAME] [--python X.Y]
                                           print the descriptive immutable tag of a row
       versions.py tags [--row NAME] [--python X.Y] [--sha SHA]
                                           print every tag of a row: descriptive, sha-<sha>,
                                           then the moving ones (what `make push` pushes)
       versions.py moving-tags [--row NAME]  print the moving tags of a row, space-separated
       versions.py sha-tag [--row NAME] [--sha SHA]
                                           print the row's per-commit tag: sha-<sha> for the
                                           default row, sha-<sha>-<row name> for the others
       versions.py flavour [--row NAME]    print the row name, or nothing for the default row
       versions.py build-args [--row NAME] [--python X.Y] [--source URL]
                                           print KEY=VALUE build args, as `make build` passes
                                           them (for docker/build-push-action in CI)
       versions.py ci-tags --event EVENT --ref REF [--row NAME] [--date YYYYMMDD] [--sha SHA]
                                           print `immutable=...` and `moving=...` (GitHub
                                           outputs): which tags a release workflow run pushes
       versions.py matrix                  print the rows as compact JSON for a CI matrix
       versions.py base-image [--row NAME] [--require-digest]
                                           print the base a build uses, base_image@base_image_digest
                                           (--require-digest: fail when the digest is missing, as
                                           the release workflow does)
"""
import json
import pathlib
import re
import subprocess
import sys

DATA = json.loads((pathlib.Path(__file__).resolve().parent.parent / "versions.json").read_text())


def row(name=None):
    name = name or DATA["default"]
    for r in DATA["matrix"]:
        if r["name"] == name:
            return r
    sys.exit(f"versions.py: no matrix row named {name!r}; rows: {[r['name'] for r in DATA['matrix']]}")


def tag(r, python=None):
    """The descriptive tag; the Makefile's TAG spells the same (tests/test_publish.py checks)."""
    cudnn_major = r["cudnn"].split(".")[0]
    return f"{r['torch']}-cuda{r['cuda']}-cudnn{cudnn_major}-py{python or r['python']}-runtime"


def sha_tag(r, sha):
    """The per-commit tag. Every row is built from the same commit, so the rows other than the
    default add their name, or their pushes would take each other's sha-<sha> (and `main`)."""
    return f"sha-{sha}" + ("" if r["name"] == DATA["default"] else f"-{r['name']}")


def main_tag(r):
    """The moving tag a main commit pushes: `main` for the default row, main-<row> for the others."""
    return "main" + ("" if r["name"] == DATA["default"] else f"-{r['name']}")


def base_image(r):
    """The base as builds use it: pinned by digest when versions.json has one. Docker resolves
    `name:tag@digest` by the digest alone; the tag stays for people reading it."""
    digest = r.get("base_image_digest", "")
    return f"{r['base_image']}@{digest}" if digest else r["base_image"]


def nvidia_require_cuda(r):
    """The image's NVIDIA_REQUIRE_CUDA, checked by the NVIDIA Container Toolkit before start (its
    syntax: a space separates alternatives, a comma joins conditions). PyTorch's CUDA wheels run
    on any driver of the same CUDA major (minor-version compatibility), from min_driver on; the
    image removes the forward-compat libraries, so older drivers cannot work and are refused."""
    return f"cuda>={r['cuda'].split('.')[0]}.0,driver>={r['min_driver']}"


def git_sha():
    # As the Makefile's GIT_SHA: 12 hex digits, "-dirty" when tracked files differ from HEAD.
    here = pathlib.Path(__file__).resolve().parent
    out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                         text=True, check=False, cwd=here)
    clean = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], check=False, cwd=here)
    return (out.stdout.strip() or "unknown") + ("" if clean.returncode == 0 else "-dirty")


def git_created():
    # The commit's time, as the Makefile's CREATED: rebuilding a commit keeps the layer cache.
    out = subprocess.run(["git", "log", "-1", "--format=%cI"], capture_output=True, text=True,
                         check=False, cwd=pathlib.Path(__file__).resolve().parent)
    return out.stdout.strip() or "unknown"


def build_args(r, python=None, source=None):
    return {
        "BASE_IMAGE": base_image(r), "TORCH_VERSION": r["torch"],
        "TORCHVISION_VERSION": r["torchvision"], "TORCHAUDIO_VERSION": r["torchaudio"],
        "CUDA": r["cuda"], "CUDNN": r["cudnn"], "NCCL": r["nccl"],
        "PYTHON_VERSION": python or r["python"], "VERSION": tag(r, python),
        "REVISION": git_sha(), "CREATED": git_created(), "SOURCE": source or "local",
        "NVIDIA_REQUIRE_CUDA": nvidia_require_cuda(r),
    }


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
    name = None
    if "--row" in args:
        i = args.index("--row")
        name = args[i + 1]
        del args[i:i + 2]
    if cmd == "get":
        print(row(name)[args[0]])
    elif cmd == "standin":
        print(DATA["standin"][args[0]])
    elif cmd == "rows":
        print("\n".join(r["name"] for r in DATA["matrix"]))
    elif cmd == "make-vars":
        for k, v in row(name).items():
            if isinstance(v, str):
                print(f"V_{k.upper()}:={v}")
        print(f"V_BASE_IMAGE_REF:={base_image(row(name))}")
        print(f"V_NVIDIA_REQUIRE_CUDA:={nvidia_require_cuda(row(name))}")
    elif cmd in ("tag", "tags"):
        r, python = row(name), option(args, "--python")
        tags = [tag(r, python)]
        if cmd == "tags":
            tags += [sha_tag(r, option(args, "--sha") or git_sha())] + r.get("moving_tags", [])
        print("\n".join(tags))
    elif cmd == "build-args":
        python, source = option(args, "--python"), option(args, "--source")
        for k, v in build_args(row(name), python, source).items():
            print(f"{k}={v}")
    elif cmd == "ci-tags":
        r, event, ref = row(name), option(args, "--event"), option(args, "--ref")
        date, sha = option(args, "--date"), option(args, "--sha") or git_sha()
        if event == "schedule":
            # Weekly security rebuild: a new dated immutable tag; the moving tags follow it.
            immutable, moving = [f"{tag(r)}-{date}"], r.get("moving_tags", [])
        elif ref.startswith("refs/tags/v"):
            # A release promotes the digest main built for this commit (sha-<sha>, already
            # there) to the descriptive tag; nothing is rebuilt.
            immutable, moving = [tag(r)], r.get("moving_tags", [])
        else:
            # A main commit is not a release: its own sha tag and the moving `main` only.
            immutable, moving = [sha_tag(r, sha)], [main_tag(r)]
        print(f"immutable={' '.join(immutable)}\nmoving={' '.join(moving)}")
    elif cmd == "sha-tag":
        print(sha_tag(row(name), option(args, "--sha") or git_sha()))
    elif cmd == "flavour":
        # push.py --flavour: empty for the default row, else the row name (see sha_tag).
        print("" if row(name)["name"] == DATA["default"] else row(name)["name"])
    elif cmd == "moving-tags":
        print(" ".join(row(name).get("moving_tags", [])))
    elif cmd == "base-image":
        r = row(name)
        digest = r.get("base_image_digest", "")
        if "--require-digest" in args and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            sys.exit(f"versions.py: row {r['name']!r} has no valid base_image_digest ({digest!r}): "
                     f"pin {r['base_image']} by digest in versions.json first (README: Pinning the base)")
        print(base_image(r))
    elif cmd == "matrix":
        print(json.dumps({"row": [r["name"] for r in DATA["matrix"]]}, separators=(",", ":")))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
