#!/usr/bin/env python3
"""What a build is called and built with: its tags (the tag policy), the git revision it comes
from and the docker build args, all from a versions.json row. The one place that computes
them: the Makefile, push.py and the workflows ask it.

Usage: build_info.py make-vars [--row NAME] [--python X.Y]
                         print Makefile assignments (V_<FIELD>:=value; V_TAG, V_GIT_SHA, ...)
       build_info.py build-args [--row NAME] [--python X.Y] [--base REF] [--tag TAG]
                                [--source URL] [--pypi-as-of TIME] [--os-updates KEY] [--docker]
                         print KEY=VALUE build args (docker/build-push-action), or with
                         --docker the `--build-arg KEY=VALUE` words `make build` passes;
                         --pypi-as-of: PyPI as of TIME ("": the newest), else versions.json's;
                         --os-updates: the apt layers' cache key (default: this ISO week)
       build_info.py moving-tags [--row NAME]
                         print the moving tags of a row, space-separated
       build_info.py sha-tag [--row NAME] [--sha SHA]
                         print the row's per-commit tag: sha-<sha> for the default row,
                         sha-<sha>-<row name> for the others
       build_info.py platforms [--row NAME] [--check PLATFORM]
                         print the Docker platforms the row publishes, comma-separated
                         (check_wheels.py checks each); --check: fail unless the row publishes
                         PLATFORM (make build PLATFORM=...; empty passes)
       build_info.py flavour [--row NAME]
                         print the row name, or nothing for the default row (push.py --flavour)
       build_info.py ci-tags --event EVENT --ref REF [--row NAME] [--date YYYYMMDD] [--sha SHA]
                         print `immutable=...` and `moving=...` (GitHub outputs): which tags
                         a release workflow run pushes
       build_info.py git-sha [--worktree DIR]
                         print the revision: 12 hex digits, "-dirty" when tracked files changed
       build_info.py labels [--row NAME] [--sha SHA]
                         print the KEY=VALUE labels a published image must carry
"""
import datetime
import pathlib
import shlex
import subprocess
import sys

import versions

HERE = pathlib.Path(__file__).resolve().parent


def tag(r, python=None):
    """The descriptive immutable tag: 2.6.0-cuda12.4-cudnn9-py3.10-runtime."""
    cudnn_major = r["cudnn"].split(".")[0]
    return f"{r['torch']}-cuda{r['cuda']}-cudnn{cudnn_major}-py{python or r['python']}-runtime"


def flavour(r):
    """Empty for the default row, else the row name. Every row is built from the same commit, so
    the other rows add their name to the per-commit tags, or their pushes would take each
    other's sha-<sha> (and `main`)."""
    return "" if r["name"] == versions.DATA["default"] else r["name"]


def sha_tag(r, sha):
    """The per-commit tag: sha-<sha>, or sha-<sha>-<row> for the rows other than the default."""
    return flavoured_sha_tag(sha, flavour(r))


def flavoured_sha_tag(sha, flavour_name):
    """sha-<sha>[-<flavour>]: for callers that know the flavour but not the row (push.py)."""
    return f"sha-{sha}" + (f"-{flavour_name}" if flavour_name else "")


def main_tag(r):
    """The moving tag a main commit pushes: `main`, or main-<row> for the other rows."""
    return "main" + (f"-{flavour(r)}" if flavour(r) else "")


def _git(worktree, *args):
    return subprocess.run(["git", "-C", str(worktree), *args], capture_output=True, text=True,
                          check=False)


def git_sha(worktree=HERE):
    """The revision label and the sha-<sha> tag: 12 hex digits, "-dirty" when tracked files
    differ from HEAD (so an image built from uncommitted changes never claims a commit)."""
    sha = _git(worktree, "rev-parse", "--short=12", "HEAD").stdout.strip() or "unknown"
    dirty = _git(worktree, "diff", "--quiet", "HEAD", "--").returncode != 0
    return sha + ("-dirty" if dirty else "")


def git_created(worktree=HERE):
    """The commit's time, not the clock: rebuilding the same commit keeps the layer cache."""
    return _git(worktree, "log", "-1", "--format=%cI").stdout.strip() or "unknown"


def git_source(worktree=HERE):
    return _git(worktree, "config", "--get", "remote.origin.url").stdout.strip() or "local"


def os_updates_week(today=None):
    """The ISO week (2026-W50) whose distribution updates a build applies: the apt layers' cache key,
    so they are rebuilt, with the fixes published since, at the first build of each week."""
    year, week, _ = (today or datetime.datetime.now(datetime.UTC).date()).isocalendar()
    return f"{year}-W{week:02d}"


def build_args(r, python=None, base=None, version=None, source=None, pypi_as_of=None, os_updates=None):
    """Every --build-arg of docker/Dockerfile. A new build arg is one line here."""
    return {
        "BASE_IMAGE": base or versions.base_image(r),
        "TORCH_VERSION": r["torch"],
        "TORCHVISION_VERSION": r["torchvision"],
        "TORCHAUDIO_VERSION": r["torchaudio"],
        "CUDA": r["cuda"],
        "CUDNN": r["cudnn"],
        "NCCL": r["nccl"],
        "PYTHON_VERSION": python or r["python"],
        "MIN_DRIVER": r["min_driver"],
        "NVIDIA_REQUIRE_CUDA": versions.nvidia_require_cuda(r),
        "VERSIONS_ROW": r["name"],
        "VERSION": version or tag(r, python),
        "REVISION": git_sha(),
        "CREATED": git_created(),
        "SOURCE": source or git_source(),
        # PyPI as it was then (versions.json: pypi_as_of); "" (make build PYPI_AS_OF=): the newest.
        "PYPI_AS_OF": versions.pypi_as_of() if pypi_as_of is None else pypi_as_of,
        # The distribution's updates as of this week (docker/build/apt-install.sh); any other
        # value (make build OS_UPDATES=2026-12-07b) rebuilds the apt layers now.
        "OS_UPDATES": os_updates or os_updates_week(),
        # The row's future, as labels (versions.json legacy, rebuilds_until, new_projects).
        "ROW_LEGACY": str(versions.support(r)["legacy"]).lower(),
        "ROW_REBUILDS_UNTIL": versions.support(r)["rebuilds_until"],
        "ROW_NEW_PROJECTS": versions.support(r)["new_projects"],
    }


def labels(r, sha=None):
    """What the release workflow checks on the pulled-back image."""
    return {"org.opencontainers.image.version": tag(r),
            "org.opencontainers.image.revision": sha or git_sha(),
            "team.torch.version": r["torch"], "team.cuda.version": r["cuda"]}


def ci_tags(r, event, ref, date, sha):
    """(immutable, moving) tags a release workflow run pushes."""
    if event == "schedule":
        # Weekly security rebuild: a new dated immutable tag; the moving tags follow it.
        return [f"{tag(r)}-{date}"], r.get("moving_tags", [])
    if ref.startswith("refs/tags/v"):
        # A release promotes the digest main built for this commit (sha-<sha>, already there)
        # to the descriptive tag; nothing is rebuilt.
        return [tag(r)], r.get("moving_tags", [])
    # A main commit is not a release: its own sha tag and the moving `main` only.
    return [sha_tag(r, sha)], [main_tag(r)]


def main(argv):
    if not argv:
        sys.exit(__doc__)
    cmd, args = argv[0], argv[1:]
    opt = lambda flag: versions.option(args, flag)
    r, python = versions.row(opt("--row")), opt("--python") or None
    if cmd == "make-vars":
        # One word per assignment: $(foreach) in the Makefile splits on spaces.
        for key, value in r.items():
            if isinstance(value, str) and " " not in value:
                print(f"V_{key.upper()}:={value}")
        print(f"V_BASE_IMAGE_REF:={versions.base_image(r)}")
        print(f"V_TAG:={tag(r, python)}\nV_GIT_SHA:={git_sha()}\nV_CREATED:={git_created()}")
        print(f"V_PYPI_AS_OF:={versions.pypi_as_of()}")
    elif cmd == "build-args":
        base, version, source, as_of = opt("--base"), opt("--tag"), opt("--source"), opt("--pypi-as-of")
        items = build_args(r, python, base or None, version or None, source, as_of,
                           opt("--os-updates") or None).items()
        if "--docker" in args:
            print(" ".join(f"--build-arg {shlex.quote(f'{k}={v}')}" for k, v in items))
        else:
            print("\n".join(f"{k}={v}" for k, v in items))
    elif cmd == "moving-tags":
        print(" ".join(r.get("moving_tags", [])))
    elif cmd == "sha-tag":
        print(sha_tag(r, opt("--sha") or git_sha()))
    elif cmd == "platforms":
        wanted = opt("--check")
        if wanted is None:
            print(",".join(r["platforms"]))
        elif wanted and wanted not in r["platforms"]:
            sys.exit(f"build_info.py: row {r['name']} publishes {', '.join(r['platforms'])}, not {wanted} "
                     "(versions.json platforms; make lint checks a platform's wheels once it is added). "
                     f"Fix: PLATFORM={r['platforms'][0]}, or a row that has {wanted}")
    elif cmd == "flavour":
        print(flavour(r))
    elif cmd == "ci-tags":
        event, ref, date, sha = opt("--event"), opt("--ref"), opt("--date"), opt("--sha")
        immutable, moving = ci_tags(r, event, ref, date, sha or git_sha())
        print(f"immutable={' '.join(immutable)}\nmoving={' '.join(moving)}")
    elif cmd == "git-sha":
        print(git_sha(opt("--worktree") or HERE))
    elif cmd == "labels":
        print("\n".join(f"{k}={v}" for k, v in labels(r, opt("--sha")).items()))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
