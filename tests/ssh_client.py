"""What the SSH tests share: a fresh key pair, logging in with paramiko (retrying while sshd
starts), running commands, typing into an interactive shell, and a container with sshd on."""
import io
import re
import time

import paramiko
import pytest
from conftest import SLOWDOWN, host_port, wait_for_log
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

SSH_PORT = "22/tcp"
SSHD_UP = r"Server listening on"


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
    timeout *= SLOWDOWN
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
    timeout *= SLOWDOWN
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
