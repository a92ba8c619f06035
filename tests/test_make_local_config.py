"""REGISTRY said once: make run/pull REGISTRY=... remember it (local.mk, here a file of the test's),
every later target uses it, REGISTRY= forgets it, and a build nobody named is announced first.
Host-side: a fake docker, no image, no registry."""
import os
import subprocess

import pytest
from test_publish import LEAKY, ROOT

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

REGISTRY = "127.0.0.1:9/team"  # nothing listens on port 9: a pull fails at once, after remembering


@pytest.fixture
def env(tmp_path):
    """make's environment: a fake docker (no image; build and run log and succeed) and LOCAL_MK."""
    log = tmp_path / "docker-calls.log"
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\necho "$@" >> {log}\ncase "$1" in image|container|inspect) exit 1;; esac\n')
    docker.chmod(0o755)
    return {"DOCKER": str(docker), "LOCAL_MK": str(tmp_path / "local.mk"), "PREFLIGHT": "0"}


def make(*args, env):
    run_env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    run_env.update(env)
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True,
                          env=run_env, check=False, timeout=120)


def test_a_registry_given_once_is_used_by_every_later_target(env):
    """make pull REGISTRY=... once: a bare make -n smoke/shell/run/doctor then pull from it
    (scripts/pull.py ensure on REGISTRY/IMAGE:TAG), none builds; REGISTRY= forgets it."""
    first = make("pull", f"REGISTRY={REGISTRY}", env=env)
    assert "remembered in local.mk" in first.stderr, first.stderr
    for target in ("smoke", "shell", "run"):
        dry = make("-n", target, env=env)
        assert f"--ref '{REGISTRY}/team-dl:" in dry.stdout, f"make {target} forgot REGISTRY:\n{dry.stdout}"
    assert "--pull-first" in make("-n", "doctor", env=env).stdout
    forget = make("pull", "REGISTRY=", env=env)
    assert "forgotten" in forget.stderr and "pull.py ensure" not in make("-n", "smoke", env=env).stdout


def test_the_command_line_and_environment_come_before_the_remembered_registry(env):
    """A remembered REGISTRY is the default only: REGISTRY in the environment or on make's command
    line wins (and make -n remembers nothing)."""
    make("pull", f"REGISTRY={REGISTRY}", env=env)
    other = "127.0.0.1:9/other"
    assert f"--ref '{other}/" in make("-n", "smoke", env={**env, "REGISTRY": other}).stdout
    assert f"--ref '{other}/" in make("-n", "smoke", f"REGISTRY={other}", env=env).stdout
    assert f"--ref '{REGISTRY}/" in make("-n", "smoke", env=env).stdout, "make -n changed the remembered one"


def test_a_registry_that_cannot_be_one_is_refused_and_not_remembered(env, tmp_path):
    """make pull REGISTRY='a b$x': one ERROR line, nothing pulled, local.mk not written."""
    r = make("pull", "REGISTRY=a b#$$x", env=env)
    assert r.returncode != 0 and "cannot be a registry" in r.stderr, r.stderr
    assert not (tmp_path / "local.mk").exists()


def test_a_build_without_a_registry_is_announced_before_it_starts(env, tmp_path):
    """No REGISTRY and no image here: make smoke says which image it builds and why, then builds."""
    r = make("smoke", env=env)
    said = r.stderr.find("is not here and REGISTRY is not set")
    calls = (tmp_path / "docker-calls.log").read_text()
    assert said >= 0 and "team-dl:" in r.stderr[:said], r.stderr
    assert "build " in calls, f"it did not build:\n{calls}"
