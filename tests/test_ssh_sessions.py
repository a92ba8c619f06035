"""What SSH sessions see: the container's environment in every kind of session (command,
login shell, tmux) with secrets filtered out, tmux auto-attach and jobs that outlive the
connection, nvidia-smi on a GPU host."""
import json
import secrets
import socket

import pytest
from conftest import READY, hook_mount, wait_for_log, wait_until
from ssh_client import (
    exec_in,
    shell_send_and_wait,
    ssh_connect,
    ssh_run,
    start_with_ssh,
)

import docker

# The script each SSH mode runs to report what it sees: its environment and which python runs.
# The script each SSH mode runs to report what it sees: its environment and which python runs.
DUMP_ENV = (
    "import json, os, shutil, sys\n"
    "d = dict(os.environ)\n"
    "d['__python__'] = sys.executable\n"
    "d['__nvidia_smi_dir_on_path__'] = str(any(p in ('/usr/local/nvidia/bin', '/usr/bin')"
    " for p in os.environ['PATH'].split(':')))\n"
    "json.dump(d, open(sys.argv[1], 'w'))\n"
)

# --- environment in SSH sessions ----------------------------------------------------------

NASTY = "a b \"c\" $HOME 'd' `e` \\f"
SECRET_VARS = ("JUPYTER_TOKEN", "HF_TOKEN", "DB_PASSWORD", "MY_SECRET", "WANDB_API_KEY",
               "AWS_SECRET_ACCESS_KEY")
# Set per session by sshd/login/tmux, so they may differ from the container's.
SESSION_VARS = {"HOME", "HOSTNAME", "PATH", "TERM", "USER", "LOGNAME", "SHELL", "PWD", "SHLVL"}


def _dump_env(client, mode):
    """What a `mode` SSH session sees: its environment as a dict (and which python it runs)."""
    target = f"/tmp/env-{mode}.json"
    rc, _, err = ssh_run(client, f"cat > /tmp/dump_env.py <<'PY'\n{DUMP_ENV}PY")
    assert rc == 0, f"could not write the env script: {err}"
    if mode == "exec":
        rc, _, err = ssh_run(client, f"python /tmp/dump_env.py {target}")
        assert rc == 0, f"non-interactive `python -c` over SSH failed: {err}"
    elif mode == "login":
        channel = client.invoke_shell(term="xterm-256color", width=200, height=50)
        shell_send_and_wait(channel, f"python /tmp/dump_env.py {target}; echo DONE-$((40+2))", "DONE-42")
        channel.close()
    elif mode == "tmux":
        rc, _, err = ssh_run(client, "tmux new-session -d -s envtest -x 200 -y 50")
        assert rc == 0, f"tmux did not start: {err}"
        rc, _, err = ssh_run(client, f"tmux send-keys -t envtest 'python /tmp/dump_env.py {target}' Enter")
        assert rc == 0, f"tmux send-keys failed: {err}"
    wait_until(lambda: ssh_run(client, f"test -s {target}")[0] == 0, 30,
               f"the {mode} session did not write its environment")
    rc, out, err = ssh_run(client, f"cat {target}")
    return json.loads(out)


@pytest.mark.parametrize("mode", ["exec", "login", "tmux"])
def test_ssh_sessions_see_the_container_environment(start_container, key, mode):
    """Container should give every SSH session (command, login shell, tmux) the container env."""
    env = {"TEAM_TEST_VALUE": NASTY, "NVIDIA_VISIBLE_DEVICES": "all",
           **{name: secrets.token_hex(16) for name in SECRET_VARS}}
    c = start_with_ssh(start_container, key.public, environment=env)
    client = ssh_connect(c, key.pkey)
    seen = _dump_env(client, mode)
    client.close()

    c.reload()
    container_env = dict(item.split("=", 1) for item in c.attrs["Config"]["Env"])
    assert seen.get("TEAM_TEST_VALUE") == NASTY, f"a -e value with quotes/$/spaces: {seen.get('TEAM_TEST_VALUE')!r}"
    assert seen["__python__"].startswith("/opt/venv/"), f"`python` should be the venv's: {seen['__python__']}"
    assert container_env["PATH"] in seen["PATH"], f"PATH lost entries: {seen['PATH']!r}"
    for name in ("LD_LIBRARY_PATH", "VIRTUAL_ENV", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                 "CUDA_VERSION"):
        assert name in container_env, f"the image should set {name}"
    missing = {
        name: (value, seen.get(name)) for name, value in container_env.items()
        if name not in SESSION_VARS and name not in SECRET_VARS and name != "PUBLIC_KEY"
        and seen.get(name) != value
    }
    assert not missing, f"{mode} session differs from the container env: {missing}"
    leaked = [name for name in (*SECRET_VARS, "PUBLIC_KEY") if name in seen]
    leaked += [name for name, value in seen.items() if value in {env[s] for s in SECRET_VARS}]
    assert not leaked, f"secrets reached the {mode} SSH session: {leaked}"


def test_urls_with_credentials_are_secrets_whatever_their_name(start_container, key):
    """Container should keep a URL with a password (DATABASE_URL=postgres://u:pw@h/db) out of SSH."""
    password = secrets.token_hex(12)
    env = {"DATABASE_URL": f"postgres://app:{password}@db.internal:5432/app",
           "HTTPS_PROXY": f"http://me:{password}@proxy:3128",
           "HF_ENDPOINT": "https://hf-mirror.com", "GIT_REMOTE": "git@github.com:acme/x.git",
           "REPO_URL": "https://user@example.com/x.git"}
    c = start_with_ssh(start_container, key.public, environment=env)
    client = ssh_connect(c, key.pkey)
    seen = _dump_env(client, "exec")
    client.close()
    assert password not in json.dumps(seen), "a URL with a password reached the SSH session"
    for name in ("HF_ENDPOINT", "GIT_REMOTE", "REPO_URL"):
        assert seen.get(name) == env[name], f"{name} has no password and should reach SSH: {seen.get(name)!r}"
    _, out = exec_in(c, f"grep -rlsF -- '{password}' /etc /home /run /tmp")
    assert not out.split(), f"the password is written in: {out.split()}"


def test_secrets_are_written_to_no_file(start_container, key):
    """Container should write no secret to a file; the Jupyter token only to Jupyter's private files."""
    env = {name: secrets.token_hex(16) for name in SECRET_VARS}
    c = start_with_ssh(start_container, key.public, environment=env)
    client = ssh_connect(c, key.pkey)
    ssh_run(client, "true")  # a session has been set up, as a user would
    client.close()
    # Jupyter up: it has written whatever it writes (config, runtime files).
    wait_until(lambda: exec_in(c, "curl -fsS -o /dev/null http://127.0.0.1:8888/api")[0] == 0, 120,
               f"JupyterLab did not come up:\n{c.logs().decode()}")
    where = "/etc /home /root /run /tmp /workspace /var/log"
    as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups"
    # The same searches must find what is there, or a broken grep would pass this test: root
    # finds the environment file, nobody only the world-readable bash.bashrc that loads it.
    _, out = exec_in(c, f"grep -rlsF TEAM_ENVIRONMENT {where}")
    assert "/etc/team/environment" in out.split(), f"the search itself is broken: {out}"
    _, out = exec_in(c, f"{as_nobody} grep -rlsF TEAM_ENVIRONMENT {where}")
    assert out.split() == ["/etc/bash.bashrc"], f"the search as nobody is broken: {out}"
    # Jupyter keeps the token in files only $NB_USER can read (its config and runtime dir).
    jupyter_private = ("/run/team/jupyter/", "/home/dev/.local/share/jupyter/runtime/")
    for name, value in env.items():
        _, out = exec_in(c, f"grep -rlsF -- '{value}' {where}")
        files = out.split()
        if name == "JUPYTER_TOKEN":
            files = [f for f in files if not f.startswith(jupyter_private)]
        assert not files, f"{name}'s value is written in: {files}"
        _, out = exec_in(c, f"{as_nobody} grep -rlsF -- '{value}' {where}")
        assert not out.split(), f"{name}'s value is readable by other users in: {out.split()}"


@pytest.mark.skipif(
    "nvidia" not in json.dumps(docker.from_env().info().get("Runtimes", {})),
    reason="needs a GPU host with the NVIDIA Container Toolkit",
)
@pytest.mark.parametrize("mode", ["exec", "login"])
def test_nvidia_smi_works_in_ssh_sessions(start_container, key, mode):
    """Container should run nvidia-smi in SSH sessions on a GPU host."""
    c = start_with_ssh(start_container, key.public,
                       device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])])
    client = ssh_connect(c, key.pkey)
    if mode == "exec":
        rc, out, err = ssh_run(client, "nvidia-smi -L")
        assert rc == 0 and "GPU" in out, f"nvidia-smi over `ssh host cmd` failed: {out}{err}"
    else:
        channel = client.invoke_shell()
        out = shell_send_and_wait(channel, "nvidia-smi -L; echo RC-$?-END", "-END")
        assert "RC-0-END" in out and "GPU 0" in out, f"nvidia-smi in a login shell failed: {out}"
    client.close()


# --- tmux ---------------------------------------------------------------------------------


def test_tmux_job_survives_ssh_connection_drop(start_container, key):
    """Container should keep a job started in tmux running after the SSH connection drops."""
    # Its own container: it waits for every SSH session of dev to end after the drop.
    c = start_with_ssh(start_container, key.public)
    client = ssh_connect(c, key.pkey)
    channel = client.invoke_shell(term="xterm-256color", width=120, height=40)
    # Attached in tmux, as a user would be, then the loop typed into the pane.
    channel.send("tmux new-session -s job\n")
    wait_until(lambda: ssh_run(client, "tmux has-session -t job")[0] == 0, 30, "tmux did not start")
    channel.send("i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done\n")
    wait_until(lambda: ssh_run(client, "test -s /tmp/counter")[0] == 0, 30, "the tmux job did not start")
    # Drop the connection abruptly (no SSH disconnect message), like a lost network.
    client.get_transport().sock.shutdown(socket.SHUT_RDWR)
    client.close()
    wait_until(lambda: exec_in(c, "pgrep -u dev -x sshd || echo gone")[1].strip() == "gone", 30,
               "the dropped SSH session should have ended")

    client = ssh_connect(c, key.pkey)
    rc, _, _ = ssh_run(client, "tmux has-session -t job")
    assert rc == 0, "the tmux session should survive the dropped connection"
    # The loop rewrites the file (`>` truncates first): a read can catch it empty.
    first = int(wait_until(lambda: ssh_run(client, "cat /tmp/counter")[1].strip(), 10,
                           "the counter file stayed empty"))
    wait_until(lambda: int(ssh_run(client, "cat /tmp/counter")[1] or 0) > first + 3, 30,
               "the job in tmux stopped progressing after the connection dropped")
    client.close()


def test_tmux_uses_the_image_config(run_in_image):
    """Container should start tmux with the image's config (mouse, long history, 256 colours)."""
    script = ("tmux new-session -d && tmux show -g mouse && tmux show -g history-limit"
              " && tmux show -g default-terminal")
    rc, out = run_in_image(["bash", "-c", script])
    assert rc == 0, f"tmux failed: {out}"
    for setting in ("mouse on", "history-limit 50000", "default-terminal tmux-256color"):
        assert setting in out, f"tmux should have {setting!r}: {out}"


@pytest.mark.parametrize(("autoattach", "attached"), [("1", True), (None, False)])
def test_tmux_autoattach_on_interactive_ssh_login(start_container, key, autoattach, attached):
    """Container should put interactive SSH logins into tmux session main iff SSH_TMUX_AUTOATTACH=1."""
    env = {"SSH_TMUX_AUTOATTACH": autoattach} if autoattach else {}
    c = start_with_ssh(start_container, key.public, environment=env)
    client = ssh_connect(c, key.pkey)
    channel = client.invoke_shell(term="xterm-256color", width=200, height=50)
    out = shell_send_and_wait(channel, 'echo "IN-TMUX-[${TMUX:+yes}]-$((1+1))"', "]-2")
    assert ("IN-TMUX-[yes]-2" in out) == attached, f"attached to tmux should be {attached}: {out!r}"
    rc, _, _ = ssh_run(client, "tmux has-session -t main")
    assert (rc == 0) == attached, "session 'main' should exist only with auto-attach"
    client.close()


def test_tmux_autoattach_opt_out_file_keeps_logins_out_of_tmux(start_container, key):
    """Container should not put SSH logins into tmux when ~/.no_auto_tmux exists, even with auto-attach."""
    c = start_with_ssh(start_container, key.public, environment={"SSH_TMUX_AUTOATTACH": "1"})
    client = ssh_connect(c, key.pkey)
    seen = {}
    # With the file: a plain shell. Without it (the control): tmux, so the probe can tell.
    for opt_out in (True, False):
        rc, _, err = ssh_run(client, "touch ~/.no_auto_tmux" if opt_out else "rm -f ~/.no_auto_tmux")
        assert rc == 0, f"could not set up ~/.no_auto_tmux: {err}"
        channel = client.invoke_shell(term="xterm-256color", width=200, height=50)
        out = shell_send_and_wait(channel, 'echo "IN-TMUX-[${TMUX:+yes}]-$((1+1))"', "]-2")
        seen[opt_out] = "IN-TMUX-[yes]-2" in out
        channel.close()
    client.close()
    assert seen == {True: False, False: True}, (
        f"attached to tmux by opt-out file present: {seen} (expected only without the file)")


def test_variables_set_by_start_up_hooks_do_not_reach_ssh_sessions(start_container, key, tmp_path):
    """Container should keep variables exported by start-up hooks out of SSH sessions."""
    value = secrets.token_hex(8)
    c = start_with_ssh(start_container, key.public,
                       **hook_mount(tmp_path, f"export TEAM_HOOK_VAR={value}"))
    client = ssh_connect(c, key.pkey)
    seen = {mode: _dump_env(client, mode) for mode in ("exec", "login")}
    client.close()
    # The control: the hook ran and its export reached the services' own environment.
    wait_for_log(c, READY, 120)
    rc, jupyter_env = exec_in(c, "tr '\\0' '\\n' < /proc/$(pgrep -o -f jupyter-lab)/environ", user="dev")
    assert rc == 0 and f"TEAM_HOOK_VAR={value}" in jupyter_env, "the hook's export should reach the services"
    leaked = {mode: env.get("TEAM_HOOK_VAR") for mode, env in seen.items() if "TEAM_HOOK_VAR" in env}
    assert not leaked, f"a hook's variable reached SSH sessions: {leaked}"
