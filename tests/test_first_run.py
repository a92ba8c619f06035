"""The first run as a new user meets it: root with a root-owned checkout, the ready line with
the host's ports, an SSH login into tmux in /workspace that logs out cleanly, and what make run
hands the container (ports, stop grace). Containers are fresh per test and removed after."""
import os
import pathlib
import re
import subprocess

import pytest
from conftest import READY, host_port, require_tool, wait_for_log, wait_until
from test_make_ssh import env_without_agent, make_key

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKSPACE_ERROR = re.compile(r"^ERROR .*/workspace.*", re.MULTILINE)


def ready_line(logs):
    return next((ln for ln in logs.splitlines() if "==> READY" in ln), "")


def root_owned_dir(tmp_path):
    """A checkout as root makes it on a cloud VM: root:root, mode 755."""
    d = tmp_path / "checkout"
    d.mkdir()
    os.chown(d, 0, 0)
    d.chmod(0o755)
    return d


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a root-owned checkout and set its ACL")
def test_root_owned_checkout_gets_one_host_step_and_then_saves(start_container, tmp_path):
    """Root's own checkout on /workspace: the start should name one host step that works (not
    HOST_UID=$(id -u), which is 0 and refused), READY should warn until then, and after that one
    step dev should save into /workspace with a clean READY."""
    d = root_owned_dir(tmp_path)
    c = start_container(volumes={str(d): {"bind": "/workspace", "mode": "rw"}})
    logs = wait_for_log(c, READY, 120)
    error = WORKSPACE_ERROR.search(logs)
    assert error and "setfacl -R -m u:1000:rwX -m d:u:1000:rwX" in error.group(0), logs[-3000:]
    assert "HOST_UID" not in error.group(0), f"HOST_UID=$(id -u) is 0 for root, refused: a loop\n{error.group(0)}"
    assert ready_line(logs).startswith("WARN") and "not writable" in ready_line(logs), ready_line(logs)

    # The step as the message gives it, on the host.
    step = re.search(r"setfacl [^(]+<dir>", error.group(0)).group(0).replace("<dir>", str(d))
    subprocess.run([require_tool("setfacl", "acl"), *step.split()[1:]], check=True)
    c = start_container(volumes={str(d): {"bind": "/workspace", "mode": "rw"}})
    logs = wait_for_log(c, READY, 120)
    assert not WORKSPACE_ERROR.search(logs) and ready_line(logs).startswith("INFO"), logs[-3000:]
    rc, out = c.exec_run(["bash", "-c", "echo saved > /workspace/notebook.ipynb && cat /workspace/notebook.ipynb"],
                         user="dev")
    assert rc == 0 and b"saved" in out, out
    assert d.stat().st_uid == 0, "root should stay the checkout's owner (git refuses a checkout root does not own)"


def test_ready_line_has_the_host_ports_to_paste(start_container, tmp_path):
    """With the host ports make run publishes (HOST_PORT_JUPYTER/HOST_PORT_SSH), the ready
    line's URL and ssh line should use them, not the container's 8888 and 22."""
    _, public = make_key(tmp_path / "keys")
    c = start_container(environment={"PUBLIC_KEY": public, "HOST_PORT_JUPYTER": "18888",
                                     "HOST_PORT_SSH": "12222"})
    line = ready_line(wait_for_log(c, READY, 120))
    assert "http://127.0.0.1:18888/lab?token=" in line, line
    assert "ssh -p 12222 -t dev@localhost tmux new -A -s main" in line, line


def test_ssh_login_starts_tmux_in_workspace_and_logs_out_cleanly(start_container, tmp_path):
    """An SSH login into tmux should start its shell in /workspace (where Jupyter works), and a
    logout should leave no "logout() returned an error" in the logs."""
    private, public = make_key(tmp_path / "keys")
    c = start_container(environment={"PUBLIC_KEY": public}, ports={"22/tcp": ("127.0.0.1", None)})
    wait_for_log(c, READY, 120)
    ssh = [require_tool("ssh", "openssh-client"), "-tt", "-i", str(private), "-o", "IdentitiesOnly=yes",
           "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
           "-o", "LogLevel=ERROR", "-p", str(host_port(c, "22/tcp")), "dev@127.0.0.1"]
    probe = "tmux new -d -s main; sleep 1; tmux display -p -t main '#{pane_current_path}'"
    r = subprocess.run([*ssh, probe], capture_output=True, text=True, timeout=60, check=False,
                       stdin=subprocess.DEVNULL, env=env_without_agent(tmp_path))
    wait_until(lambda: "Disconnected from user dev" in c.logs().decode(errors="replace"), 10,
               "no logout logged", interval=0.5)
    logs = c.logs().decode(errors="replace")
    assert "logout() returned an error" not in logs, logs[-2000:]
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == ["/workspace"], r.stdout + r.stderr


def test_make_run_hands_the_container_its_host_ports_and_stop_grace(tmp_path):
    """make run should publish STOP_TIMEOUT as --stop-timeout and -e STOP_TIMEOUT (the entrypoint
    cannot know docker stop -t), and the host ports for the ready line."""
    docker = tmp_path / "docker"
    docker.write_text('#!/bin/sh\n[ "$1" = image ] && exit 0\necho "ARGS=$*"\n')
    docker.chmod(0o755)
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    r = subprocess.run(["make", "--no-print-directory", "run", "PREFLIGHT=0", f"DOCKER={docker}", "IMAGE=team-dl-fake",
                        "PORT_JUPYTER=18888", "PORT_SSH=12222", "STOP_TIMEOUT=45", "DETACH=0"], cwd=ROOT,
                       env=env_without_agent(tmp_path / "home"), capture_output=True, text=True, timeout=60, check=False)
    args = r.stdout
    for want in ("-p 127.0.0.1:18888:8888", "-p 127.0.0.1:12222:22", "-e HOST_PORT_JUPYTER=18888", "-e HOST_PORT_SSH=12222",
                 "--stop-timeout 45", "-e STOP_TIMEOUT=45"):
        assert want in args, f"{want!r} not in make run's docker run:\n{args}\n{r.stderr}"
