"""Values given to make are data: a `'`, `"`, `$(...)` or backquote in any variable reaches the
command as those characters and runs nothing, under `make -n` (make still runs its own $(shell)
probes then) and under a real make with a fake docker. Host-side: no image, no registry."""
import json
import os
import re
import subprocess
import sys

import pytest
from test_publish import LEAKY, ROOT

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

# Shell words by design (flags and lists the recipe splits): the caller quotes inside them.
WORDS = {"LOGS_ARGS", "PYTEST_ARGS", "TESTS", "SMOKE_ARGS", "BUILD_OPTS", "SSH_OPTS", "SSH_ARGS",
         "ROWS_TESTS", "ARM64_TESTS", "MOVING_TAGS"}


def documented(kind):
    """make help's variables (`VAR ?= ...## `) or targets (`target: ## `), from the Makefile."""
    text = (ROOT / "Makefile").read_text()
    if kind == "variables":
        return re.findall(r"^([A-Z][A-Z0-9_]*) *\?=.*## ", text, re.MULTILINE)
    return re.findall(r"^([a-zA-Z0-9_-]+):.*## ", text, re.MULTILINE)


def hostile(marks):
    """A value that breaks out of '...', "..." and runs $(...) and `...` if a recipe lets it."""
    return (f"a';touch {marks}/single;'\"$$(touch {marks}/dollar)\";touch {marks}/double;"
            f"`touch {marks}/back`")


@pytest.fixture
def fake_docker(tmp_path):
    """A docker that logs each call's argv as a JSON line, has no image or container, builds and
    runs nothing."""
    log = tmp_path / "docker-calls.jsonl"
    script = tmp_path / "docker"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                      "sys.exit(1 if sys.argv[1:2] in (['image'], ['container'], ['inspect']) else 0)\n")
    script.chmod(0o755)
    log.touch()
    return script, log


def make(*args, env):
    run_env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    run_env.update(env)
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True,
                          env=run_env, check=False, timeout=300)


@pytest.fixture
def marks(tmp_path):
    d = tmp_path / "marks"
    d.mkdir()
    return d


def test_no_variable_value_runs_as_a_command_under_make_n(marks, fake_docker):
    """Every documented variable but the shell-word ones set to a hostile value, for every target
    under make -n: nothing the value holds is executed (no file appears)."""
    value = hostile(marks)
    assigns = [f"{v}={value}" for v in documented("variables") if v not in WORDS]
    env = {"DOCKER": str(fake_docker[0]), "USER": value.replace("$$", "$")}
    # All targets in one make -k -n (make reads the Makefile once: seconds, not a minute); which
    # target ran it is then found one by one.
    make("-k", "-n", *documented("targets"), *assigns, env=env)
    if not list(marks.iterdir()):
        return
    for p in marks.iterdir():
        p.unlink()
    ran = {}
    for target in documented("targets"):
        make("-n", target, *assigns, env=env)
        if made := sorted(p.name for p in marks.iterdir()):
            ran[target] = made
        for p in marks.iterdir():
            p.unlink()
    pytest.fail(f"make -n ran what a variable's value holds: {ran}")


def test_a_hostile_value_reaches_docker_as_one_argument(marks, fake_docker):
    """A real make run/stop/logs/pull with a hostile CONTAINER and SIGNER_IDENTITY (a fake
    docker): nothing runs, and docker gets the container name intact, as one argument."""
    docker, log = fake_docker
    value = hostile(marks)
    literal = value.replace("$$", "$")
    env = {"DOCKER": str(docker), "HOME": str(marks.parent)}
    for target in ("run", "stop", "logs", "tags", "help"):
        make(target, f"CONTAINER={value}", "PREFLIGHT=0", f"TAG=t{value}", env=env)
    make("pull", "REGISTRY=127.0.0.1:9", f"SIGNER_IDENTITY={value}", env=env)
    assert not list(marks.iterdir()), f"make ran what a value holds: {sorted(p.name for p in marks.iterdir())}"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    run = [c for c in calls if c[:1] == ["run"]]
    assert run and literal in run[0][run[0].index("--name") + 1:][:1], f"docker run got {run}"
    assert any(c[:1] == ["container"] and literal in c for c in calls), calls
