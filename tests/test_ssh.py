"""SSH: key-only login from PUBLIC_KEY / PUBLIC_KEY_FILE / a mounted authorized_keys, what is
refused, per-container host keys, the hardened sshd, files and listeners. What SSH sessions see
(environment, secrets, tmux) is in test_ssh_sessions.py."""
import base64
import hashlib
import os
import re
import secrets
import socket
import uuid

import paramiko
import pytest
from conftest import READY, hook_mount, host_port, wait_for_log, wait_until
from ssh_client import (
    SSH_PORT,
    SSHD_UP,
    Key,
    exec_in,
    ssh_connect,
    ssh_lines,
    ssh_run,
    start_with_ssh,
)

HOW_TO_ENABLE = '-e PUBLIC_KEY="$(cat ~/.ssh/id_ed25519.pub)"'


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


def test_ssh_off_on_request_without_a_key_gives_no_fix_of_its_own(start_container):
    """SSHD_ENABLED=0 and no key (make run without any key: make prints the one fix): the ready
    line says only "SSH off", not a docker run -e PUBLIC_KEY fix beside make's."""
    c = start_container(environment={"SSHD_ENABLED": "0"})
    ready = next(line for line in wait_for_log(c, READY, 120).splitlines() if "==> READY" in line)
    assert ready.rstrip().endswith("|  SSH off") and "PUBLIC_KEY" not in ready, ready


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
