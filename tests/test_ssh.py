"""SSH and tmux: key-only login from PUBLIC_KEY / PUBLIC_KEY_FILE / a mounted authorized_keys,
per-container host keys, the container environment in every kind of SSH session, no secrets."""
import base64
import hashlib
import io
import json
import os
import re
import secrets
import socket
import time
import uuid

import paramiko
import pytest
from conftest import READY, hook_mount, host_port, wait_for_log, wait_until
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

import docker

SSH_PORT = "22/tcp"
SSHD_UP = r"Server listening on"
HOW_TO_ENABLE = '-e PUBLIC_KEY="$(cat ~/.ssh/id_ed25519.pub)"'
# The script each SSH mode runs to report what it sees: its environment and which python runs.
DUMP_ENV = (
    "import json, os, shutil, sys\n"
    "d = dict(os.environ)\n"
    "d['__python__'] = sys.executable\n"
    "d['__nvidia_smi_dir_on_path__'] = str(any(p in ('/usr/local/nvidia/bin', '/usr/bin')"
    " for p in os.environ['PATH'].split(':')))\n"
    "json.dump(d, open(sys.argv[1], 'w'))\n"
)


class Key:
    """A fresh ed25519 key pair: .pkey for paramiko, .public for authorized_keys."""

    def __init__(self, comment="test@host"):
        private = ed25519.Ed25519PrivateKey.generate()
        pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ).decode()
        self.private_pem = pem
        self.pkey = paramiko.Ed25519Key.from_private_key(io.StringIO(pem))
        self.public = f"{self.pkey.get_name()} {self.pkey.get_base64()} {comment}"


@pytest.fixture
def key():
    return Key()


def ssh_connect(container, pkey=None, user="dev", password=None, timeout=60.0):
    """Log in to the container's published port 22, retrying while sshd is still starting.
    Authentication failures are raised at once: they are what some tests expect."""
    deadline = time.monotonic() + timeout
    while True:
        client = paramiko.SSHClient()
        # Host-key checking is tested on its own (test_ssh_host_keys_*).
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        try:
            client.connect(
                "127.0.0.1", port=host_port(container, SSH_PORT), username=user, pkey=pkey,
                password=password, look_for_keys=False, allow_agent=False, timeout=10,
                banner_timeout=10, auth_timeout=10,
            )
            return client
        except paramiko.AuthenticationException:
            client.close()
            raise
        except (paramiko.SSHException, OSError, EOFError) as e:
            client.close()
            container.reload()
            if container.status != "running":
                pytest.fail(f"container stopped before SSH came up:\n{container.logs().decode()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no SSH login after {timeout}s ({e!r}):\n{container.logs().decode()}")
            time.sleep(0.5)


def ssh_run(client, command, timeout=60):
    """Run `command` over SSH (non-interactive, like `ssh host 'cmd'`): (rc, stdout, stderr)."""
    _, out, err = client.exec_command(command, timeout=timeout)
    rc = out.channel.recv_exit_status()
    return rc, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def shell_send_and_wait(channel, line, marker, timeout=30.0):
    """Type `line` into an interactive shell and wait for `marker` in its output."""
    channel.send(line + "\n")
    buf = ""
    deadline = time.monotonic() + timeout
    while marker not in buf:
        if time.monotonic() > deadline:
            pytest.fail(f"no {marker!r} from the interactive shell after {timeout}s:\n{buf}")
        if channel.recv_ready():
            buf += channel.recv(65536).decode(errors="replace")
        else:
            time.sleep(0.1)
    return buf


def start_with_ssh(start_container, public_key, **kwargs):
    """A container with sshd on (the key in PUBLIC_KEY), port 22 on a random host port."""
    env = dict(kwargs.pop("environment", {}))
    env.setdefault("PUBLIC_KEY", public_key)
    c = start_container(environment=env, ports={SSH_PORT: None}, **kwargs)
    wait_for_log(c, SSHD_UP, timeout=120)
    return c


@pytest.fixture(scope="module")
def sshd(docker_client, image_ref, module_containers):
    """One container as start_with_ssh starts it, with its key: (container, key). Shared by the
    tests that log in and look without changing what the others see (each its own files,
    sessions and processes); tests that change accounts, settings or mounts start their own."""
    key = Key()
    c = docker_client.containers.run(image_ref, detach=True, shm_size="1g",
                                     environment={"PUBLIC_KEY": key.public}, ports={SSH_PORT: None})
    module_containers.append(c)
    wait_for_log(c, SSHD_UP, timeout=120)
    return c, key


def exec_in(container, command, user="root"):
    """docker exec as `user`: (rc, output)."""
    rc, out = container.exec_run(["bash", "-c", command], user=user)
    return rc, out.decode(errors="replace")


def ssh_lines(logs):
    """WARN/ERROR lines from the SSH step (other steps' warnings are not this suite's concern)."""
    return [
        line for line in logs.splitlines()
        if re.match(r"(WARN|ERROR)\b", line) and re.search(r"ssh|key", line, re.IGNORECASE)
    ]


# --- logging in ---------------------------------------------------------------------------


def test_ssh_key_login_with_public_key_env(sshd):
    """Container should let the user log in with the key given in PUBLIC_KEY, as dev, quietly."""
    c, key = sshd
    client = ssh_connect(c, key.pkey)
    rc, out, err = ssh_run(client, "id -un; pwd")
    client.close()
    assert rc == 0, f"command over SSH failed: {err}"
    assert out.split()[0] == "dev", f"SSH session should run as dev, got {out!r}"
    logs = c.logs().decode()
    assert not ssh_lines(logs), f"a normal SSH start should print no WARN/ERROR:\n{logs}"


def test_ssh_key_login_with_public_key_file(start_container, key, tmp_path):
    """Container should accept the key(s) in the file PUBLIC_KEY_FILE names (a mounted .pub)."""
    pub = tmp_path / "id_ed25519.pub"
    pub.write_text(key.public + "\n")
    c = start_with_ssh(
        start_container, None,
        environment={"PUBLIC_KEY_FILE": "/etc/team/keys/id_ed25519.pub"},
        volumes={str(tmp_path): {"bind": "/etc/team/keys", "mode": "ro"}},
    )
    client = ssh_connect(c, key.pkey)
    rc, out, _ = ssh_run(client, "id -un")
    client.close()
    assert (rc, out.strip()) == (0, "dev"), f"login with PUBLIC_KEY_FILE should work: {rc} {out!r}"


def test_ssh_key_login_with_mounted_authorized_keys(start_container, key, tmp_path):
    """Container should accept keys from a read-only /etc/team/authorized_keys mount."""
    ak = tmp_path / "authorized_keys"
    ak.write_text("# team keys\n" + key.public + "\n")
    c = start_with_ssh(
        start_container, None,
        volumes={str(ak): {"bind": "/etc/team/authorized_keys", "mode": "ro"}},
    )
    client = ssh_connect(c, key.pkey)
    rc, out, _ = ssh_run(client, "id -un")
    client.close()
    assert (rc, out.strip()) == (0, "dev"), f"login with the mounted file should work: {out!r}"


def test_ssh_two_keys_both_work_and_restart_adds_no_duplicates(start_container):
    """Container should accept every key in PUBLIC_KEY and add each only once, restarts included."""
    k1, k2 = Key("one"), Key("two")
    # k1 twice (another comment): the same key must still be added once.
    public = f"{k1.public}\n{k2.public}\n{k1.pkey.get_name()} {k1.pkey.get_base64()} again\n"
    c = start_with_ssh(start_container, public)
    for k in (k1, k2):
        client = ssh_connect(c, k.pkey)
        rc, _, _ = ssh_run(client, "true")
        client.close()
        assert rc == 0, "each key in PUBLIC_KEY should log in"

    c.restart(timeout=20)
    wait_until(lambda: len(re.findall(SSHD_UP, c.logs().decode())) >= 2, 120,
               f"sshd did not come back after a restart:\n{c.logs().decode()}")
    client = ssh_connect(c, k2.pkey)
    rc, out, _ = ssh_run(client, "grep -cv '^#' ~/.ssh/authorized_keys; "
                                 "stat -c '%a %U' ~/.ssh ~/.ssh/authorized_keys")
    client.close()
    lines = out.split("\n")
    assert lines[0] == "2", f"authorized_keys should hold 2 keys after a restart, got {out!r}"
    assert lines[1:3] == ["700 dev", "600 dev"], f"~/.ssh should be 700 and the file 600, dev's: {out!r}"


# --- refusing ------------------------------------------------------------------------------


def test_ssh_offers_only_publickey_authentication(sshd):
    """Container should offer publickey as the only SSH authentication method."""
    c, _ = sshd
    sock = socket.create_connection(("127.0.0.1", host_port(c, SSH_PORT)), timeout=10)
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=10)
        with pytest.raises(paramiko.BadAuthenticationType) as e:
            transport.auth_none("dev")
        assert e.value.allowed_types == ["publickey"], (
            f"sshd should allow publickey only, allows {e.value.allowed_types}")
    finally:
        transport.close()


@pytest.mark.parametrize("user", ["dev", "root"])
def test_ssh_refuses_password_login(start_container, key, user):
    """Container should refuse password logins even when the account has a password."""
    c = start_with_ssh(start_container, key.public)
    password = secrets.token_urlsafe(12)
    rc, out = exec_in(c, f"echo '{user}:{password}' | chpasswd")
    assert rc == 0, f"could not set a password for the test: {out}"
    with pytest.raises(paramiko.AuthenticationException):
        ssh_connect(c, user=user, password=password).close()


def test_ssh_refuses_root_even_with_a_valid_key(start_container, key):
    """Container should refuse root logins over SSH, with a key root would accept."""
    c = start_with_ssh(start_container, key.public)
    rc, out = exec_in(c, f"install -d -m 700 /root/.ssh && echo '{key.public}' > /root/.ssh/authorized_keys"
                         " && chmod 600 /root/.ssh/authorized_keys")
    assert rc == 0, f"could not give root the key for the test: {out}"
    with pytest.raises(paramiko.AuthenticationException):
        ssh_connect(c, key.pkey, user="root").close()


def _bad_key_cases():
    good = Key().public
    private = Key().private_pem
    return [
        pytest.param({"PUBLIC_KEY": "ssh-ed25519 not-base64 me@laptop"}, "PUBLIC_KEY", "not-base64",
                     id="garbage"),
        pytest.param({"PUBLIC_KEY": f"{good}\nssh-rsa AAAAB3NzaC1yc2E truncated"}, "PUBLIC_KEY line 2",
                     "truncated", id="second-line-bad"),
        pytest.param({"PUBLIC_KEY": private}, "PUBLIC_KEY holds a PRIVATE key",
                     private.splitlines()[1], id="private-key"),
        pytest.param({"PUBLIC_KEY_FILE": "/nonexistent/id.pub"}, "PUBLIC_KEY_FILE", None,
                     id="missing-file"),
    ]


@pytest.mark.parametrize(("env", "named", "never_logged"), _bad_key_cases())
def test_ssh_malformed_key_fails_loudly(run_in_image, env, named, never_logged):
    """Container should exit non-zero naming the variable and the fix when a key is malformed."""
    rc, logs = run_in_image(None, timeout=120, environment=env)
    assert rc != 0, f"a malformed key should stop the container, it exited {rc}:\n{logs}"
    errors = "\n".join(line for line in logs.splitlines() if line.startswith("ERROR"))
    assert named in errors, f"the error should name {named!r}:\n{logs}"
    assert "Fix:" in errors and HOW_TO_ENABLE in errors, f"the error should give the fix:\n{logs}"
    if never_logged:
        assert never_logged not in logs, "the rejected value must not be echoed to the logs"


@pytest.mark.parametrize("path", ["/etc", "/home/dev"])
def test_public_key_file_that_is_a_directory_gets_a_fix_that_mounts_nothing_over_it(run_in_image, path):
    """Container should refuse a PUBLIC_KEY_FILE that is a directory, saying so, with a fix that
    mounts the key at a path of its own, never over that directory (once: -v KEY:/etc:ro)."""
    rc, logs = run_in_image(None, timeout=120, environment={"PUBLIC_KEY_FILE": path})
    assert rc != 0, f"a directory should stop the container, it exited {rc}:\n{logs}"
    errors = "\n".join(line for line in logs.splitlines() if line.startswith("ERROR"))
    assert f"PUBLIC_KEY_FILE={path} is a directory" in errors, f"the error should say it is a directory:\n{logs}"
    assert f":{path}:" not in errors and f":{path} " not in errors, f"the fix mounts a key over {path}:\n{errors}"
    fix = re.search(r"-v ~/\.ssh/id_ed25519\.pub:(/\S+):ro -e PUBLIC_KEY_FILE=(\S+)", errors)
    assert fix and fix.group(1) == fix.group(2) and fix.group(1).startswith("/run/secrets/"), (
        f"the fix should mount the .pub file at a path of its own and point at it:\n{errors}")


def test_ssh_off_without_key_and_jupyter_still_runs(start_container):
    """Container should start no sshd without a key, say how to enable it (also in the ready
    line), and still run Jupyter."""
    c = start_container(ports={SSH_PORT: None})
    logs = wait_for_log(c, READY, 120)
    info = [line for line in logs.splitlines() if line.startswith("INFO") and "SSH is off" in line]
    assert info and HOW_TO_ENABLE in info[0], f"one INFO line should say how to enable SSH:\n{logs}"
    ready = next(line for line in logs.splitlines() if "==> READY" in line)
    assert "SSH off: no public key" in ready and HOW_TO_ENABLE in ready, (
        f"the ready line should say how to add a key:\n{ready}")
    assert not ssh_lines(logs), f"no key is a normal start: no SSH WARN/ERROR expected:\n{logs}"
    _, out = exec_in(c, ". /run/team/services.env; echo ${SSHD_ENABLED:-0}; pgrep -x sshd || echo no-sshd; ls /etc/ssh")
    assert out.split("\n")[:2] == ["0", "no-sshd"], f"sshd should be off and marked so: {out!r}"
    assert "ssh_host_" not in out, f"no host keys are needed without sshd: {out!r}"


def test_ssh_can_be_switched_off_with_sshd_enabled_0(start_container, key):
    """Container should start no sshd when SSHD_ENABLED=0, even with a key, and say so."""
    c = start_container(environment={"PUBLIC_KEY": key.public, "SSHD_ENABLED": "0"})
    wait_until(lambda: exec_in(c, "curl -fsS -o /dev/null http://127.0.0.1:8888/api")[0] == 0, 120,
               f"JupyterLab should run with SSH switched off:\n{c.logs().decode()}")
    _, out = exec_in(c, ". /run/team/services.env; echo ${SSHD_ENABLED:-0}; pgrep -x sshd || echo no-sshd")
    assert out.split() == ["0", "no-sshd"], f"sshd should be off and marked so: {out!r}"
    assert "SSH is off (SSHD_ENABLED=0)" in c.logs().decode(), "the log should say why SSH is off"


def test_ssh_not_started_with_a_command_and_public_key_not_passed_on(run_in_image, key):
    """Container should run a given command without sshd and without PUBLIC_KEY in its env."""
    rc, logs = run_in_image(["bash", "-c", "echo \"PK=${PUBLIC_KEY-unset}\"; pgrep -x sshd || echo no-sshd"],
                            environment={"PUBLIC_KEY": key.public})
    assert rc == 0, f"the command failed: {logs}"
    assert "PK=unset" in logs, f"PUBLIC_KEY should not reach the command: {logs}"
    assert "no-sshd" in logs and "SSH: not started, because a command was given" in logs, (
        f"a command runs instead of the services, and the log should say so: {logs}")


def test_ssh_sftp_transfers_files(sshd):
    """Container should serve SFTP (scp, VS Code, editors) to the key's owner, unbroken by shell init."""
    c, key = sshd
    client = ssh_connect(c, key.pkey)
    sftp = client.open_sftp()
    payload = secrets.token_bytes(4096)
    with sftp.open("/workspace/upload.bin", "wb") as f:
        f.write(payload)
    with sftp.open("/workspace/upload.bin", "rb") as f:
        back = f.read()
    sftp.close()
    client.close()
    assert back == payload, "a file written over SFTP should read back unchanged"


# --- host keys ----------------------------------------------------------------------------


def test_image_contains_no_ssh_host_keys(run_in_image):
    """Container image should ship no SSH host keys (they would be shared by every container)."""
    rc, out = run_in_image(["-1", "/etc/ssh"], entrypoint="ls")
    assert rc == 0, f"ls /etc/ssh failed: {out}"
    assert "sshd_config" in out, f"the listing should be of /etc/ssh: {out}"
    assert "ssh_host_" not in out, f"host keys are baked into the image: {out}"


def _host_key(container, pkey):
    client = ssh_connect(container, pkey)
    try:
        return client.get_transport().get_remote_server_key().get_fingerprint().hex()
    finally:
        client.close()


def test_ssh_host_keys_differ_between_containers(start_container, key):
    """Container should generate its own host keys: two containers never share one."""
    a = start_with_ssh(start_container, key.public)
    b = start_with_ssh(start_container, key.public)
    assert _host_key(a, key.pkey) != _host_key(b, key.pkey), "two containers share a host key"
    rc, out = exec_in(a, "stat -c '%n %a %U' /etc/ssh/ssh_host_*_key")
    assert rc == 0 and len(out.splitlines()) == 3, f"expected ed25519, ecdsa and rsa keys: {out}"
    assert all(line.endswith(" 600 root") for line in out.splitlines()), f"host keys must be 600 root: {out}"


def test_ssh_persisted_host_keys_are_reused(start_container, docker_client, key):
    """Container should reuse the host keys kept in SSH_HOST_KEYS_DIR, so clients see one host."""
    volume = docker_client.volumes.create(f"test-ssh-hostkeys-{uuid.uuid4().hex[:8]}")
    try:
        kwargs = {
            "environment": {"PUBLIC_KEY": key.public, "SSH_HOST_KEYS_DIR": "/etc/team/ssh-host-keys"},
            "volumes": {volume.name: {"bind": "/etc/team/ssh-host-keys", "mode": "rw"}},
        }
        first = start_with_ssh(start_container, key.public, **kwargs)
        fingerprint = _host_key(first, key.pkey)
        rc, out = exec_in(first, "stat -c '%a %U' /etc/team/ssh-host-keys /etc/team/ssh-host-keys/*_key")
        assert rc == 0 and set(out.split("\n")[:-1]) == {"700 root", "600 root"}, (
            f"the key directory should be 700 and the keys 600, root's: {out!r}")
        first.remove(force=True)

        second = start_with_ssh(start_container, key.public, **kwargs)
        assert _host_key(second, key.pkey) == fingerprint, "a new container changed the host key"
        assert "reused" in second.logs().decode(), "the log should say the host keys were reused"
        second.remove(force=True)

        kwargs["volumes"][volume.name]["mode"] = "ro"
        third = start_with_ssh(start_container, key.public, **kwargs)
        assert _host_key(third, key.pkey) == fingerprint, "keys on a read-only mount were not reused"
    finally:
        for c in docker_client.containers.list(all=True, filters={"volume": volume.name}):
            c.remove(force=True)
        volume.remove(force=True)


# --- sshd configuration -------------------------------------------------------------------


def test_sshd_config_test_passes_and_is_hardened(sshd):
    """Container should pass `sshd -t` and run with key-only, no-root, no-X11 settings."""
    c, _ = sshd
    rc, out = exec_in(c, "sshd -t")
    assert rc == 0, f"sshd -t failed: {out}"
    rc, out = exec_in(c, "sshd -T")
    assert rc == 0, f"sshd -T failed: {out}"
    effective = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    expected = {
        "passwordauthentication": "no",
        "kbdinteractiveauthentication": "no",
        "permitemptypasswords": "no",
        "permitrootlogin": "no",
        "authenticationmethods": "publickey",
        "x11forwarding": "no",
        "permituserenvironment": "no",
        "clientaliveinterval": "60",
    }
    wrong = {k: effective.get(k) for k, v in expected.items() if effective.get(k) != v}
    assert not wrong, f"sshd settings differ from the hardened ones: {wrong}"


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


# --- files --------------------------------------------------------------------------------


def test_ssh_files_on_bind_mount_belong_to_host_user(start_container, key, tmp_path):
    """Container should create files made over SSH in a bind-mounted /workspace as its host owner."""
    owner = 1234 if os.geteuid() == 0 else os.geteuid()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    if os.geteuid() == 0:
        os.chown(workspace, owner, owner)
    c = start_with_ssh(start_container, key.public,
                       volumes={str(workspace): {"bind": "/workspace", "mode": "rw"}})
    client = ssh_connect(c, key.pkey)
    rc, _, err = ssh_run(client, "echo hi > /workspace/from-ssh.txt")
    client.close()
    assert rc == 0, f"writing to /workspace over SSH failed: {err}"
    made = workspace / "from-ssh.txt"
    assert made.stat().st_uid == owner, (
        f"file made over SSH is owned by {made.stat().st_uid}, not the host user {owner}")
    assert made.stat().st_gid == owner, f"file group is {made.stat().st_gid}, not {owner}"


def test_only_jupyter_and_sshd_listen_beyond_loopback(sshd):
    """Container should listen on 8888 and 22 only; kernels and helpers stay on loopback."""
    c, _ = sshd
    wait_for_log(c, READY, 120)
    # A kernel opens its own ports: start one so the check covers them too. It says when it
    # answers (a file), then stays up; polled for, not a fixed sleep.
    starter = ("from jupyter_client import KernelManager as K; import time; k = K(); k.start_kernel();"
               " kc = k.client(); kc.start_channels(); kc.wait_for_ready(timeout=120);"
               " open('/tmp/kernel-up', 'w').close(); time.sleep(300)")
    c.exec_run(["bash", "-c", f'cd /tmp && exec python -c "{starter}"'], user="dev", detach=True)
    wait_until(lambda: exec_in(c, "test -e /tmp/kernel-up")[0] == 0, 150,
               f"the kernel did not come up:\n{c.logs().decode()}")
    rc, out = exec_in(c, "ss -Hltn", user="dev")
    assert rc == 0, out
    listening = {line.split()[3] for line in out.splitlines() if line.startswith("LISTEN")}
    assert listening, f"ss listed nothing, the probe is broken:\n{out}"
    outside = {a for a in listening if not a.startswith(("127.", "[::1]", "::1"))}
    ports = {a.rsplit(":", 1)[1] for a in outside}
    assert ports <= {"8888", "22"}, f"unexpected listeners beyond loopback: {sorted(outside)}"
    assert {"8888", "22"} <= ports, f"Jupyter and sshd should listen: {sorted(listening)}"


# --- what the log and the session promise -------------------------------------------------


def _logged_host_key_fingerprints(logs):
    """{'ED25519': 'SHA256:...', ...} from the start-up line that lists the host keys."""
    line = re.search(r"SSH host key fingerprints \(compare on first connect\):(.*)$", logs, re.MULTILINE)
    assert line, f"no host-key fingerprint line in the log:\n{logs}"
    return dict(re.findall(r"(\w+) (SHA256:\S+)", line.group(1)))


def _served_host_key(container, pkey):
    """(TYPE, 'SHA256:...') of the host key sshd presents, as `ssh-keygen -l` prints it."""
    client = ssh_connect(container, pkey)
    try:
        served = client.get_transport().get_remote_server_key()
    finally:
        client.close()
    digest = base64.b64encode(hashlib.sha256(served.asbytes()).digest()).decode().rstrip("=")
    kind = {"ssh-ed25519": "ED25519", "ssh-rsa": "RSA", "rsa-sha2-256": "RSA", "rsa-sha2-512": "RSA"}.get(
        served.get_name(), "ECDSA")
    return kind, f"SHA256:{digest}"


@pytest.mark.parametrize("rekey", [False, True], ids=["image", "mutation-keys-replaced-after-logging"])
def test_ssh_host_key_fingerprints_are_logged(start_container, key, tmp_path, rekey):
    """Container should log the fingerprint of each host key sshd serves, for the first connect."""
    # The mutation: a hook (after the SSH step) replaces the host keys, so the log is stale.
    hook = hook_mount(tmp_path, "rm -f /etc/ssh/ssh_host_*; ssh-keygen -q -A") if rekey else {}
    c = start_with_ssh(start_container, key.public, **hook)
    logged = _logged_host_key_fingerprints(c.logs().decode())
    assert set(logged) == {"ED25519", "ECDSA", "RSA"}, f"one fingerprint per host key type expected: {logged}"
    kind, served = _served_host_key(c, key.pkey)
    assert (logged[kind] == served) != rekey, (
        f"the logged {kind} fingerprint {logged[kind]} vs the key sshd serves {served} (keys replaced: {rekey})")


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
