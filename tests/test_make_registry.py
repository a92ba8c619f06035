"""The team member's make targets with REGISTRY set, read through `make -n` (what make would run)
with a fake docker: pull first, never ask for the build base a pull does not need. Host-side: no
image, no registry (make -n prints the recipes; the fake docker answers the few probes make
itself runs while reading the Makefile)."""
import os
import re
import subprocess

import pytest
from test_publish import LEAKY, ROOT

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

REGISTRY = "registry.example:5000/team"


@pytest.fixture
def fake_docker(tmp_path):
    """A docker that has no image (image inspect fails) and no NVIDIA runtime, and logs its calls."""
    log = tmp_path / "docker-calls.log"
    script = tmp_path / "docker"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\ncase "$1" in image|container|inspect) exit 1;; esac\n'
                      'echo "{}"\n')
    script.chmod(0o755)
    log.touch()
    return script


def make(*args, env=None, cwd=ROOT):
    run_env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    run_env.update(env or {})
    return subprocess.run(["make", "-s", "-C", str(cwd), *args], capture_output=True, text=True,
                          env=run_env, check=False, timeout=120)


def lines(text, word):
    return [ln for ln in text.replace("\\\n", " ").splitlines() if word in ln]


@pytest.mark.parametrize("target", ["run", "shell", "smoke"])
def test_with_a_registry_run_shell_and_smoke_pull_and_never_build(fake_docker, target):
    """make run/shell/smoke REGISTRY=... (BUILD unset): the image is pulled (scripts/pull.py
    ensure), the pre-flight knows it (--pull-first: no build base asked for), nothing is built."""
    r = make("-n", target, f"REGISTRY={REGISTRY}", env={"DOCKER": str(fake_docker)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert lines(r.stdout, "scripts/pull.py ensure"), f"make {target} does not pull first:\n{r.stdout}"
    preflight = lines(r.stdout, "doctor.py preflight")
    assert all("--pull-first" in ln for ln in preflight), f"pre-flight without --pull-first:\n{r.stdout}"
    if target == "run":
        assert preflight, f"make run has no pre-flight:\n{r.stdout}"
    assert not re.search(r"\bbuild\b.*-f docker/Dockerfile", r.stdout), f"make {target} builds:\n{r.stdout}"


def test_make_doctor_with_a_registry_checks_for_a_pull(fake_docker):
    """make doctor REGISTRY=... checks what a pull needs, not the build base (--pull-first)."""
    r = make("-n", "doctor", f"REGISTRY={REGISTRY}", env={"DOCKER": str(fake_docker)})
    doctor = lines(r.stdout, "doctor.py doctor")
    assert r.returncode == 0 and doctor and "--pull-first" in doctor[0], r.stdout + r.stderr


def test_build_1_builds_and_its_preflight_checks_the_base(fake_docker):
    """make run REGISTRY=... BUILD=1: built here, so the pre-flight checks the base (no --pull-first)."""
    r = make("-n", "run", f"REGISTRY={REGISTRY}", "BUILD=1", env={"DOCKER": str(fake_docker)})
    preflight = lines(r.stdout, "doctor.py preflight")
    assert preflight and not any("--pull-first" in ln for ln in preflight), r.stdout + r.stderr
    assert not lines(r.stdout, "scripts/pull.py ensure"), r.stdout
