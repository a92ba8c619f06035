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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a root-owned checkout and set its ACL")
def test_root_owned_checkout_with_mode_700_gets_the_acl_step_that_works(run_in_image, tmp_path):
    """Root's checkout cloned with umask 077 (mode 700): the fix is the setfacl step, not chown to
    $(id -u) (0 for root), HOST_UID=<owner> (0, refused) or o+rx (read only); after it, dev saves."""
    d = root_owned_dir(tmp_path)
    d.chmod(0o700)
    mount = {str(d): {"bind": "/workspace", "mode": "rw"}}
    _, out = run_in_image(["true"], volumes=mount)
    error = WORKSPACE_ERROR.search(out)
    assert error and "cannot be listed" in error.group(0), out[-3000:]
    fix = error.group(0).split("Fix:", 1)[1]
    assert "setfacl -R -m u:1000:rwX -m d:u:1000:rwX <dir>" in fix, fix
    assert not any(s in fix for s in ("chown $(id -u)", "HOST_UID", "o+rx")), f"fixes that cannot work as root:\n{fix}"
    step = re.search(r"setfacl [^(]+<dir>", fix).group(0).replace("<dir>", str(d))
    subprocess.run([require_tool("setfacl", "acl"), *step.split()[1:]], check=True)
    rc, out = run_in_image(["bash", "-c", "echo saved as $(id -un) > /workspace/n.txt && cat /workspace/n.txt"],
                           volumes=mount)
    assert rc == 0 and not WORKSPACE_ERROR.search(out) and "saved as dev" in out, out[-3000:]
    assert d.stat().st_uid == 0, "root should stay the checkout's owner"


@pytest.fixture
def volume_without_acls(docker_client):
    """A Docker volume on ramfs, a filesystem without ACLs (like btrfs -o noacl or NFS): root-owned."""
    v = docker_client.volumes.create(f"team-dl-test-noacl-{os.getpid()}", driver="local",
                                     driver_opts={"type": "ramfs", "device": "ramfs"})
    yield v.name
    v.remove(force=True)


def test_root_owned_checkout_without_acls_gets_a_fix_that_works_there(volume_without_acls, start_container,
                                                                      run_in_image):
    """On a filesystem without ACLs, setfacl fails: the fix offered is group write (or chown), and
    that step, run as the message gives it, lets dev save at the next start."""
    mount = {volume_without_acls: {"bind": "/workspace", "mode": "rw,nocopy"}}  # nocopy: root-owned, as a checkout
    # ramfs lives as long as it is mounted: a container holding it keeps the step's effect, and
    # a root shell in it stands for "on the host as root".
    holder = start_container(["600"], entrypoint=["sleep"], volumes=mount)
    _, out = run_in_image(["true"], volumes=mount)
    error = WORKSPACE_ERROR.search(out)
    assert error and "this filesystem has no ACLs" in error.group(0), out[-3000:]
    step = re.search(r"(chgrp -R \d+ <dir> && chmod -R g\+rwX <dir> && find <dir> -type d -exec chmod g\+s \{\} \+)",
                     error.group(0))
    assert step, error.group(0)
    rc, out = holder.exec_run(["bash", "-c", step.group(1).replace("<dir>", "/workspace")], user="root")
    assert rc == 0, out
    rc, out = run_in_image(["bash", "-c", "echo saved as $(id -un) > /workspace/n.txt && cat /workspace/n.txt"],
                           volumes=mount)
    assert rc == 0 and not WORKSPACE_ERROR.search(out) and "saved as dev" in out, out[-3000:]


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
                        "PORT_JUPYTER=18888", "PORT_SSH=12222", "STOP_TIMEOUT=45"], cwd=ROOT,
                       env=env_without_agent(tmp_path / "home"), capture_output=True, text=True, timeout=60, check=False)
    args = r.stdout
    for want in ("-p 18888:8888", "-p 12222:22", "-e HOST_PORT_JUPYTER=18888", "-e HOST_PORT_SSH=12222",
                 "--stop-timeout 45", "-e STOP_TIMEOUT=45"):
        assert want in args, f"{want!r} not in make run's docker run:\n{args}\n{r.stderr}"
