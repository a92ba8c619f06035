"""The distribution's security fixes at every build: docker/build/apt-install.sh --upgrade (a step
of its own in docker/Dockerfile's system stage) applies the pending updates of what the base
ships and the image installs. Tested on a small image: the stand-in base holding a
package at 1.0 and a local apt repository (a file: source made here) offering 1.1, built by the
product's own script; seconds, not the 7 GB image."""
import datetime
import os
import pathlib
import re
import shutil
import subprocess
import uuid

import build_info
import pytest
import versions
from conftest import ROOT

# The Docker client make build uses (the Makefile's DOCKER: Debian's 20.10 does BuildKit without buildx).
DOCKER = os.environ.get("DOCKER") or ("/usr/bin/docker" if pathlib.Path("/usr/bin/docker").exists() else "docker")
PROBE = "team-os-updates-probe"   # the base holds 1.0; the repository offers 1.1
EXTRA = "team-os-updates-extra"   # only in the repository: what the step installs
# The test's base: the stand-in with the probe at 1.0 and, as its only distribution source, the
# local repository (hermetic and fast: no Debian mirror). The NVIDIA source stays, as on the real
# base, for apt-install.sh to drop. Then the two steps as the system stage runs them: the install,
# then the upgrade keyed by OS_UPDATES; cache mounts for the lists and .debs, the product's
# scripts bind-mounted.
DOCKERFILE = """\
ARG BASE
FROM ${BASE} AS base
COPY probe_1.0_all.deb /tmp/
RUN dpkg -i /tmp/probe_1.0_all.deb && rm /tmp/probe_1.0_all.deb \\
    && echo 'deb [trusted=yes] file:/srv/local-apt ./' > /etc/apt/sources.list

FROM base AS system
RUN --mount=type=cache,id=team-os-updates-test-cache,target=/var/cache/apt,sharing=locked \\
    --mount=type=cache,id=team-os-updates-test-lists,target=/var/lib/apt/lists,sharing=locked \\
    --mount=type=bind,source=repo,target=/srv/local-apt \\
    --mount=type=bind,source=apt-install.sh,target=/build/apt-install.sh \\
    --mount=type=bind,source=mirror-lib.sh,target=/build/mirror-lib.sh \\
    /build/apt-install.sh """ + EXTRA + """
ARG OS_UPDATES=
RUN --mount=type=cache,id=team-os-updates-test-cache,target=/var/cache/apt,sharing=locked \\
    --mount=type=cache,id=team-os-updates-test-lists,target=/var/lib/apt/lists,sharing=locked \\
    --mount=type=bind,source=repo,target=/srv/local-apt \\
    --mount=type=bind,source=apt-install.sh,target=/build/apt-install.sh \\
    --mount=type=bind,source=mirror-lib.sh,target=/build/mirror-lib.sh \\
    OS_UPDATES="${OS_UPDATES}" /build/apt-install.sh --upgrade
"""


def deb(tmp_path, name, version, out):
    """A minimal architecture-all package, built with dpkg-deb."""
    root = tmp_path / f"{name}-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr" / "share" / name).mkdir(parents=True)
    (root / "usr" / "share" / name / "version").write_text(version + "\n")
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: test <test@example.invalid>\n"
        f"Description: stands in for a base package with a pending fix\n")
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
                   check=True, capture_output=True)
    return out


def repository(tmp_path, repo):
    """A flat apt repository (deb file:/srv/local-apt ./): the .debs and their Packages index."""
    repo.mkdir()
    stanzas = []
    for name in (PROBE, EXTRA):
        path = deb(tmp_path, name, "1.1", repo / f"{name}_1.1_all.deb")
        fields = subprocess.run(["dpkg-deb", "-f", str(path)], check=True, capture_output=True, text=True).stdout
        size = path.stat().st_size
        sha = subprocess.run(["sha256sum", str(path)], check=True, capture_output=True, text=True).stdout.split()[0]
        stanzas.append(f"{fields.strip()}\nFilename: ./{path.name}\nSize: {size}\nSHA256: {sha}\n")
    (repo / "Packages").write_text("\n".join(stanzas))


@pytest.fixture(scope="module")
def os_updated_image(tmp_path_factory, docker_client):
    """The small image built by the product's apt step over the local repository; always removed."""
    base = versions.DATA["standin"]["image"]
    try:
        docker_client.images.get(base)
    except Exception:  # noqa: BLE001  (docker.errors.ImageNotFound, without importing it here)
        pytest.fail(f"the stand-in base {base} is missing: make base-standin")
    ctx = tmp_path_factory.mktemp("os-updates")
    for script in ("apt-install.sh", "mirror-lib.sh"):
        shutil.copy2(ROOT / "docker" / "build" / script, ctx / script)
    deb(ctx, PROBE, "1.0", ctx / "probe_1.0_all.deb")
    repository(ctx, ctx / "repo")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    tag = f"team-dl-test-os-updates:{uuid.uuid4().hex[:12]}"
    build = subprocess.run([DOCKER, "build", "-q", "--build-arg", f"BASE={base}", "--build-arg", "OS_UPDATES=test",
                            "-t", tag, str(ctx)], capture_output=True, text=True, timeout=300, check=False,
                           env={**os.environ, "DOCKER_BUILDKIT": "1"})
    assert build.returncode == 0, build.stderr[-3000:]
    try:
        yield tag, ctx / "repo"
    finally:
        subprocess.run([DOCKER, "image", "rm", "-f", tag], capture_output=True, check=False)


def run(image, command, *volumes):
    args = [a for v in volumes for a in ("-v", v)]
    return subprocess.run([DOCKER, "run", "--rm", *args, image, "sh", "-c", command],
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_apt_step_upgrades_a_package_the_base_holds_at_an_older_version(os_updated_image):
    """Container should carry the repository's 1.1 of a package the base shipped at 1.0, and what the step installs."""
    image, _ = os_updated_image
    r = run(image, f"dpkg-query -W -f '${{Package}}=${{Version}}\\n' {PROBE} {EXTRA}")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted([f"{EXTRA}=1.1", f"{PROBE}=1.1"]), \
        f"the base's {PROBE} 1.0 was not upgraded: {r.stdout}"


def test_nothing_is_left_to_upgrade_against_the_builds_sources_and_no_lists_are_in_the_layer(os_updated_image):
    """Container should hold no apt lists, and apt list --upgradable against the build's repository be empty."""
    image, repo = os_updated_image
    r = run(image, "find /var/lib/apt/lists -type f | grep -v '/lock$'; echo ---; "
                   "apt-get update -qq && apt list --upgradable 2>/dev/null | grep -v '^Listing'",
            f"{repo}:/srv/local-apt:ro")
    lists, upgradable = r.stdout.split("---", 1)
    assert lists.strip() == "", f"apt lists were left in the image: {lists}"
    assert upgradable.strip() == "", f"still upgradable after the build: {upgradable} {r.stderr}"


@pytest.mark.host
def test_every_apt_step_of_the_dockerfile_applies_the_updates_keyed_by_the_week():
    """The system stage should upgrade in a step of its own keyed by OS_UPDATES, above a package step that is not."""
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    system = dockerfile[dockerfile.index(" AS system\n"):dockerfile.index(" AS python\n")]
    code = "\n".join(line for line in system.splitlines() if not line.lstrip().startswith("#"))
    steps = [s for s in re.split(r"\n(?=RUN |FROM |COPY |ARG |ENV )", code) if s.startswith("RUN ")]
    apt_steps = [s for s in steps if "apt-install.sh" in s]
    assert len(apt_steps) == 2, f"the system stage should install, then upgrade: {apt_steps}"
    install, upgrade = apt_steps
    assert "OS_UPDATES" not in install and "ca-certificates" in install, f"the package step is keyed:\n{install}"
    assert 'OS_UPDATES="${OS_UPDATES}" /build/apt-install.sh --upgrade' in upgrade, upgrade
    assert "rm -f /etc/ssh/ssh_host_*" in upgrade, "an upgraded openssh-server makes host keys: remove them"
    pybase = dockerfile[dockerfile.index(" AS pybase\n"):dockerfile.index(" AS builder\n")]
    assert "OS_UPDATES" not in pybase, "a weekly key in pybase would reinstall torch in the builder every week"
    assert build_info.os_updates_week(datetime.date(2026, 12, 7)) == "2026-W50"
    assert build_info.os_updates_week(datetime.date(2027, 1, 1)) == "2026-W53", "ISO week-numbering year"
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "build"], capture_output=True, text=True, timeout=60, check=False)
    this_week = build_info.os_updates_week()
    assert f"OS_UPDATES={this_week}" in dry.stdout, dry.stdout[-2000:]
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "build", "OS_UPDATES=now-1"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert "OS_UPDATES=now-1" in dry.stdout, dry.stdout[-2000:]
