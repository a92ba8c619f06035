"""make run / make stop around the container, read through `make -n` and a fake docker: in the
background until READY, ports on 127.0.0.1, SSH host keys kept across restarts, WORKSPACE, and a
make stop that gives the container the stop timeout it was started with and says when it killed.
Host-side: no image, no container (the fake docker answers as Docker's CLI does)."""
import json
import os
import shlex
import subprocess
import sys

import pytest
from test_publish import LEAKY, ROOT

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

NAME = "team-dl-maketest"

FAKE = """#!{python}
import json, sys, time
args = sys.argv[1:]
open({log!r}, "a").write(json.dumps(args) + "\\n")
spec = json.load(open({spec!r}))
cmd = args[0] if args else ""
if cmd in ("container", "inspect"):
    if spec.get("inspect") is None:
        sys.exit(1)
    print(json.dumps([spec["inspect"]]))
elif cmd == "image":
    sys.exit(0 if spec.get("image") else 1)
elif cmd == "logs":
    print(spec.get("logs", ""))
elif cmd == "wait":
    time.sleep(0.2)
    print(spec.get("exit", 143))
elif cmd == "info":
    print("{{}}")
"""


@pytest.fixture
def docker(tmp_path):
    """fake(spec) -> (env, calls()): a docker answering from spec (inspect: the container's
    inspect dict or None; image: True when REF is here; logs; exit: what docker wait prints)."""
    log, spec_file = tmp_path / "calls.jsonl", tmp_path / "spec.json"

    def fake(spec):
        spec_file.write_text(json.dumps(spec))
        script = tmp_path / "docker"
        script.write_text(FAKE.format(python=sys.executable, log=str(log), spec=str(spec_file)))
        script.chmod(0o755)
        log.write_text("")
        env = {"DOCKER": str(script), "LOCAL_MK": str(tmp_path / "local.mk")}
        return env, lambda: [json.loads(line) for line in log.read_text().splitlines()]
    return fake


def make(*args, env):
    run_env = {k: v for k, v in os.environ.items() if k not in (*LEAKY, "STOP_TIMEOUT")}
    run_env.update(env)
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True,
                          env=run_env, check=False, timeout=120)


def docker_run(stdout):
    """The words of make -n run's docker run command, as the shell reads them."""
    words = shlex.split(stdout.replace("\\\n", " "))
    return words[words.index("run", words.index("--") + 1):]


def pairs(words):
    return [words[i:i + 2] for i in range(len(words) - 1)]


def test_make_run_starts_in_the_background_and_waits_for_ready(docker):
    """make run: docker run -d (no --rm: a crash keeps its log for make logs), then waits for
    READY; DETACH=0: in the terminal, --rm, as before."""
    env, _ = docker({"image": True})
    dry = make("-n", "run", f"CONTAINER={NAME}", env=env)
    words = docker_run(dry.stdout)
    assert "-d" in words and "--rm" not in words, dry.stdout
    assert "make_container.py ready" in dry.stdout, dry.stdout
    fg = docker_run(make("-n", "run", f"CONTAINER={NAME}", "DETACH=0", env=env).stdout)
    assert "--rm" in fg and "-d" not in fg, fg


def test_make_run_publishes_its_ports_on_localhost_unless_bind_says_otherwise(docker):
    """Ports on 127.0.0.1 by default (Docker's published ports pass ufw/firewalld by); BIND opens them."""
    env, _ = docker({"image": True})
    words = docker_run(make("-n", "run", "PORT_JUPYTER=18888", "PORT_SSH=12222", env=env).stdout)
    assert ["-p", "127.0.0.1:18888:8888"] in pairs(words) and ["-p", "127.0.0.1:12222:22"] in pairs(words), words
    words = docker_run(make("-n", "run", "BIND=0.0.0.0", env=env).stdout)
    assert ["-p", "0.0.0.0:8888:8888"] in pairs(words), words


def test_make_run_keeps_the_ssh_host_keys_across_restarts(docker):
    """make run mounts a named volume for the host keys (SSH_HOST_KEYS_DIR): the printed plain ssh
    line keeps working after make stop / make run; HOSTKEYS_VOLUME= gives new keys each start."""
    env, _ = docker({"image": True})
    words = docker_run(make("-n", "run", f"CONTAINER={NAME}", env=env).stdout)
    assert ["-v", f"{NAME}-ssh-hostkeys:/etc/team/ssh-host-keys"] in pairs(words), words
    assert ["-e", "SSH_HOST_KEYS_DIR=/etc/team/ssh-host-keys"] in pairs(words), words
    words = docker_run(make("-n", "run", f"CONTAINER={NAME}", "HOSTKEYS_VOLUME=", env=env).stdout)
    assert "SSH_HOST_KEYS_DIR=/etc/team/ssh-host-keys" not in words, words


def test_workspace_chooses_the_folder_on_workspace_and_must_exist(docker, tmp_path):
    """WORKSPACE=DIR is what make run and make shell mount on /workspace; a folder that is not
    there stops make run with one line before Docker makes it (owned by root)."""
    env, calls = docker({"image": True})
    for target in ("run", "shell"):
        words = docker_run(make("-n", target, f"WORKSPACE={tmp_path}", env=env).stdout) if target == "run" else \
            shlex.split(make("-n", target, f"WORKSPACE={tmp_path}", env=env).stdout)
        assert ["-v", f"{tmp_path}:/workspace"] in pairs(words), (target, words)
    missing = make("run", f"WORKSPACE={tmp_path}/absent", "PREFLIGHT=0", env=env)
    assert missing.returncode != 0 and "WORKSPACE=" in missing.stderr and "mkdir -p" in missing.stderr, missing.stderr
    assert not [c for c in calls() if c[:1] == ["run"]], calls()


@pytest.mark.parametrize(("logs", "running", "rc", "says"), [
    ("INFO start\nINFO ==> READY  JupyterLab: http://localhost:8888/lab?token=x", True, 0, "runs in the background"),
    ("ERROR no GPU", False, 1, "stopped before it was ready")])
def test_make_run_waits_for_ready_or_says_the_container_stopped(docker, logs, running, rc, says):
    """make_container.py ready (make run's last step): prints the log up to READY and how to reach
    the container; a container that exited first is an ERROR with its log."""
    env, _ = docker({"inspect": {"State": {"Running": running, "ExitCode": 0 if running else 3}}, "logs": logs})
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_container.py"), "ready", "--container", NAME,
                        "--docker", env["DOCKER"], "--timeout", "20"], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == rc and says in r.stderr and logs.splitlines()[-1] in r.stderr, r.stderr


def container(stop_timeout):
    return {"State": {"Running": True, "ExitCode": 0}, "Config": {"StopTimeout": stop_timeout,
                                                                  "Env": [f"STOP_TIMEOUT={stop_timeout}"]}}


def test_make_stop_gives_the_container_its_own_stop_timeout(docker):
    """make run STOP_TIMEOUT=120, then a plain make stop: docker stop -t 120 (what the entrypoint
    told the jobs), not the Makefile's default; STOP_TIMEOUT given to make stop wins."""
    env, calls = docker({"inspect": container(120), "exit": 0})
    r = make("stop", f"CONTAINER={NAME}", env=env)
    stops = [c for c in calls() if c[:1] == ["stop"]]
    assert r.returncode == 0 and stops == [["stop", "-t", "120", NAME]], (stops, r.stderr)
    assert f"stopped {NAME}" in r.stdout, r.stdout
    make("stop", f"CONTAINER={NAME}", "STOP_TIMEOUT=7", env=env)
    assert [c for c in calls() if c[:1] == ["stop"]][-1] == ["stop", "-t", "7", NAME], calls()


def test_make_stop_says_killed_when_docker_had_to_kill_the_job(docker):
    """A container that did not stop in time exits 137 (SIGKILL): make stop says killed, names the
    longer STOP_TIMEOUT to give, fails, and never says "stopped"."""
    env, _ = docker({"inspect": container(30), "exit": 137})
    r = make("stop", f"CONTAINER={NAME}", env=env)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "killed" in out and "STOP_TIMEOUT=60" in out, out
    assert f"stopped {NAME}" not in out, out
