"""make run hands the user's SSH public key to the container and prints the exact ssh line;
make ssh logs in and attaches the team's tmux session. make run is run for real with a fake
`docker` (prints what it gets) and a fake HOME without an ssh-agent, so no container is needed;
one test logs in through make ssh to a real container under a pseudo-terminal."""
import os
import pathlib
import pty
import re
import select
import subprocess
import sys
import time

import pytest
from conftest import SLOWDOWN, host_port, require_tool, wait_for_log, wait_until

ROOT = pathlib.Path(__file__).resolve().parent.parent
HELPER = ROOT / "scripts" / "ssh_key.py"
# What a login attaches: the session 99-team-tmux.sh and /etc/tmux.conf name.
SSH_LINE = "ssh -p {port} -t dev@localhost tmux new -A -s main"
# A fake docker: `image inspect` finds the image; `run` prints the key it was given and its args.
FAKE_DOCKER = """#!/bin/sh
[ "$1" = image ] && exit 0
echo "PK=${PUBLIC_KEY-unset}"
echo "ARGS=$*"
"""


def make_key(directory, name="id_ed25519", comment="you@laptop"):
    """An ed25519 key pair made by ssh-keygen in `directory`; returns (private path, public line)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    subprocess.run([require_tool("ssh-keygen", "openssh-client"), "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True)
    return path, (directory / f"{name}.pub").read_text().strip()


@pytest.fixture
def fake_home(tmp_path):
    """A HOME with an empty ~/.ssh and a fake docker beside it."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    return home


def env_without_agent(home, **extra):
    """The test runner's environment with HOME replaced and no ssh-agent, nor a PUBLIC_KEY."""
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "PUBLIC_KEY", "MAKEFLAGS")}
    env.update(HOME=str(home), **extra)
    return env


def make_run(home, *args, **env):
    """`make run` with the fake docker next to `home`: (exit code, stdout, stderr)."""
    r = subprocess.run(["make", "--no-print-directory", "run", "PREFLIGHT=0", f"DOCKER={home.parent / 'docker'}",
                        "IMAGE=team-dl-fake", *args],
                       check=False, cwd=ROOT, env=env_without_agent(home, **env), capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def test_make_run_hands_over_the_key_in_home_ssh_and_prints_the_ssh_line(fake_home):
    """make run should pass ~/.ssh/*.pub as PUBLIC_KEY (environment only) and print the ssh line."""
    _, public = make_key(fake_home / ".ssh")
    (fake_home / ".ssh" / "not-a-key.pub").write_text("this is no key\n")
    rc, out, err = make_run(fake_home, "PORT_SSH=2299")
    assert rc == 0, f"make run failed:\n{out}\n{err}"
    assert f"PK={public}\n" in out, f"docker should get the key in PUBLIC_KEY, and only the key:\n{out}"
    assert re.search(r"^ARGS=run .*-e PUBLIC_KEY ", out, re.MULTILINE), f"-e PUBLIC_KEY missing:\n{out}"
    assert "ssh-ed25519" not in out.split("ARGS=", 1)[1], f"the key belongs in the environment, not the args:\n{out}"
    assert SSH_LINE.format(port=2299) in err and "make ssh" in err, f"the ssh line should be printed:\n{err}"


def test_make_run_without_a_key_says_how_to_add_one(fake_home):
    """make run with no key in ~/.ssh and no agent should start, SSH off, and say how to add a key."""
    rc, out, err = make_run(fake_home)
    assert rc == 0, f"make run failed:\n{out}\n{err}"
    assert "PK=unset" in out and "PUBLIC_KEY" not in out.split("ARGS=", 1)[1], f"no key to pass:\n{out}"
    assert "SSH stays off" in err and "ssh-keygen -t ed25519" in err, f"the fix should be printed:\n{err}"


def test_make_run_takes_the_agents_keys(fake_home, tmp_path):
    """make run should pass the keys `ssh-add -L` lists when an ssh-agent is running."""
    _, public = make_key(tmp_path / "elsewhere")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh-add").write_text(f"#!/bin/sh\n[ \"$1\" = -L ] && echo '{public}'\n")
    (bin_dir / "ssh-add").chmod(0o755)
    rc, out, err = make_run(fake_home, SSH_AUTH_SOCK=str(tmp_path / "agent.sock"),
                            PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert rc == 0 and f"PK={public}\n" in out, f"the agent's key should be passed:\n{out}\n{err}"
    assert "ssh-agent" in err, f"make run should say where the key came from:\n{err}"


def test_make_run_keeps_the_key_the_user_set(fake_home, tmp_path):
    """make run should pass a PUBLIC_KEY from the environment as it is, and leave one in .env alone."""
    make_key(fake_home / ".ssh")
    _, mine = make_key(tmp_path / "mine", comment="chosen@laptop")
    rc, out, err = make_run(fake_home, PUBLIC_KEY=mine)
    assert rc == 0 and f"PK={mine}\n" in out, f"the user's PUBLIC_KEY should win over ~/.ssh:\n{out}\n{err}"
    env_file = tmp_path / "env"
    env_file.write_text(f"PUBLIC_KEY={mine}\n")
    r = subprocess.run([sys.executable, str(HELPER), "run", "--env-file", str(env_file), "--",
                        str(fake_home.parent / "docker"), "run", "IMAGE"],
                       check=False, env=env_without_agent(fake_home), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "PK=unset" in r.stdout and "-e PUBLIC_KEY" not in r.stdout, (
        f"a key in the --env-file should not be overridden by -e PUBLIC_KEY:\n{r.stdout}\n{r.stderr}")
    assert ".env" in r.stderr or str(env_file) in r.stderr, f"say where the key comes from:\n{r.stderr}"


def test_make_ssh_logs_in_and_attaches_the_tmux_session(start_container, tmp_path):
    """make ssh should log in to the container with the user's key and attach tmux session main."""
    private, public = make_key(tmp_path / "keys")
    c = start_container(environment={"PUBLIC_KEY": public}, ports={"22/tcp": ("127.0.0.1", None)})
    wait_for_log(c, r"Server listening on", 120)
    port = host_port(c, "22/tcp")
    master, slave = pty.openpty()
    env = env_without_agent(tmp_path, TERM="xterm-256color")
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "ssh", f"PORT_SSH={port}",
         f"SSH_ARGS=-i {private} -o IdentitiesOnly=yes -o BatchMode=yes"],
        cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    screen = bytearray()

    def read_some():
        while select.select([master], [], [], 0.2)[0]:
            try:
                screen.extend(os.read(master, 65536))
            except OSError:  # the session ended: EIO on the master
                return

    def attached():
        read_some()
        if proc.poll() is not None:
            pytest.fail(f"make ssh ended ({proc.returncode}) before attaching:\n{screen.decode(errors='replace')}")
        # Typed again until it lands: keys sent before tmux is up may be lost.
        os.write(master, b"tmux display -p '#S' > /tmp/attached-session\r")
        return exec_in(c, "cat /tmp/attached-session 2>/dev/null") == "main"

    try:
        wait_until(attached, 60, lambda: f"no shell in tmux session main:\n{screen.decode(errors='replace')}",
                   interval=2)
        os.write(master, b"tmux detach\r")
        deadline = time.monotonic() + 20 * SLOWDOWN
        while proc.poll() is None and time.monotonic() < deadline:
            read_some()
        assert proc.poll() == 0, f"make ssh should end cleanly on detach:\n{screen.decode(errors='replace')}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    sessions = exec_in(c, "su dev -c 'tmux ls -F \"#S\"'")
    assert sessions == "main", f"the detached session should keep running: {sessions!r}"


def exec_in(container, command):
    return container.exec_run(["bash", "-c", command])[1].decode(errors="replace").strip()


def test_make_ssh_when_ssh_is_off_says_so_and_how_to_turn_it_on(tmp_path):
    """make ssh to a container started without a key should say SSH is off and how to turn it on,
    not only ssh's "Connection reset by peer"."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n[ \"$1\" = logs ] && echo 'INFO [12:00:00] ==> READY  JupyterLab: http://127.0.0.1:8888/lab?token=x"
        "  |  SSH off: no public key; add one with -e PUBLIC_KEY=...'\nexit 0\n")
    (bin_dir / "ssh").write_text(f"#!/bin/sh\necho \"ssh $*\" >> {tmp_path / 'ssh.log'}\n"
                                 "echo 'kex_exchange_identification: read: Connection reset by peer' >&2\nexit 255\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = env_without_agent(tmp_path, PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = subprocess.run(["make", "--no-print-directory", "ssh", f"DOCKER={bin_dir / 'docker'}", "CONTAINER=team-dl-x"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "SSH is off in team-dl-x" in out, out
    assert "ssh-keygen -t ed25519" in out and "make run" in out, out
