#!/usr/bin/env python3
"""make run's SSH key: find the user's public key(s), hand them to `docker run` as PUBLIC_KEY
(in the environment, never on the command line or in a layer), and print the ssh line to use.

    ssh_key.py run [--env-file FILE] [--port N] -- DOCKER run ARGS...
    ssh_key.py login --container NAME [--docker D] [--port N] -- ssh ARGS...   (make ssh)

Where the key comes from, first found wins: PUBLIC_KEY or PUBLIC_KEY_FILE in --env-file (left
to Docker: an `-e` would override it), PUBLIC_KEY in our environment, the ssh-agent's keys
(`ssh-add -L`), then every ~/.ssh/*.pub that holds a public key. With none, SSH stays off in
the container (30-ssh.sh) and this says how to add one. Then it execs the docker command."""
import argparse
import os
import pathlib
import re
import shlex
import subprocess
import sys

# The image's login user and the tmux session its profile (99-team-tmux.sh) and tmux.conf use.
USER = "dev"
SESSION = "main"
# One authorized_keys line without options: type, base64 blob, optional comment. The container
# validates each key again with ssh-keygen; this only keeps other *.pub files out.
KEY_LINE = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+)\s+[A-Za-z0-9+/=]{20,}(\s.*)?$")


def ssh_command(port):
    """The command `make ssh` runs, short of its -o options: log in, attach (or make) the session."""
    return f"ssh -p {port} -t {USER}@localhost tmux new -A -s {SESSION}"


def env_file_sets_key(path):
    """True if the --env-file sets PUBLIC_KEY or PUBLIC_KEY_FILE to something."""
    if not path or not os.path.isfile(path):
        return False
    for line in pathlib.Path(path).read_text(errors="replace").splitlines():
        name, _, value = line.strip().partition("=")
        if name in ("PUBLIC_KEY", "PUBLIC_KEY_FILE") and value.strip():
            return True
    return False


def agent_keys():
    """The public keys an ssh-agent holds; none without SSH_AUTH_SOCK or ssh-add."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return []
    try:
        out = subprocess.run(["ssh-add", "-L"], check=False, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if KEY_LINE.match(line.strip())]


def home_keys():
    """(file names, key lines) of ~/.ssh/*.pub that hold public keys, in name order."""
    names, keys = [], []
    for pub in sorted((pathlib.Path.home() / ".ssh").glob("*.pub")):
        try:
            text = pub.read_text(errors="replace")
        except OSError:
            continue
        found = [line.strip() for line in text.splitlines() if KEY_LINE.match(line.strip())]
        if found and "PRIVATE KEY" not in text:
            names.append(f"~/.ssh/{pub.name}")
            keys.extend(found)
    return names, keys


def choose(env_file):
    """(where the key comes from, key text for PUBLIC_KEY or None to leave the environment alone)."""
    if env_file_sets_key(env_file):
        return f"PUBLIC_KEY/PUBLIC_KEY_FILE in {env_file}", None
    if os.environ.get("PUBLIC_KEY", "").strip():
        return "PUBLIC_KEY in your environment", os.environ["PUBLIC_KEY"]
    keys = agent_keys()
    if keys:
        return f"your ssh-agent ({len(keys)} key(s))", "\n".join(dict.fromkeys(keys))
    names, keys = home_keys()
    if keys:
        return ", ".join(names), "\n".join(dict.fromkeys(keys))
    return None, None


def run(opts):
    cmd = opts.command
    if "run" not in cmd:
        sys.exit(f"ssh_key.py run: expected `DOCKER run ARGS...` after --, got {cmd!r}")
    source, key = choose(opts.env_file)
    env = dict(os.environ)
    i = cmd.index("run") + 1
    if key is not None:
        env["PUBLIC_KEY"] = key
        # Name only: Docker copies the value from our environment, so it is on no command line.
        cmd = [*cmd[:i], "-e", "PUBLIC_KEY", *cmd[i:]]
    elif not source:
        # No key anywhere: SSH off on purpose, so the container's log says only that, and the
        # one fix on the screen is make's below (its own `docker run -e PUBLIC_KEY=...` fix
        # beside it sent people two ways).
        cmd = [*cmd[:i], "-e", "SSHD_ENABLED=0", *cmd[i:]]
    if source:
        print(f"make run: SSH key from {source}. Once READY, log in and attach tmux session "
              f"{SESSION!r}:\n  {ssh_command(opts.port)}    (or: make ssh)", file=sys.stderr)
    else:
        print("make run: no SSH public key (no ~/.ssh/*.pub, no ssh-agent key, PUBLIC_KEY unset), "
              "so SSH stays off; JupyterLab starts as usual.\n  To add one: ssh-keygen -t ed25519, "
              "then make stop and make run again (or set PUBLIC_KEY in .env).", file=sys.stderr)
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        sys.exit(f"ssh_key.py: cannot run {shlex.join(cmd[:2])}: {e}")


def ssh_state(docker, container):
    """SSH in make run's container, from its ready line: 'on', 'off', 'starting' or 'absent'
    (no container of that name: make ssh may still reach another one)."""
    try:
        r = subprocess.run([docker, "logs", container], capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    if r.returncode != 0:
        return "absent"
    ready = [ln for ln in (r.stdout + r.stderr).splitlines() if "==> READY" in ln]
    if not ready:
        return "starting"
    return "off" if "SSH off" in ready[-1] else "on"


SSH_OFF_FIX = ("To turn it on: make stop, make a key if you have none (ssh-keygen -t ed25519), then "
               "make run again: it hands ~/.ssh/*.pub (or your ssh-agent's key) to the container; "
               "or set PUBLIC_KEY in .env.")


def login(opts):
    """make ssh: say so when make run's container has SSH off (ssh alone says only "Connection
    reset by peer"), else run ssh; when ssh fails to connect, say what the container says."""
    state = ssh_state(opts.docker, opts.container)
    if state == "off":
        sys.exit(f"make ssh: SSH is off in {opts.container}: it was started without an SSH public "
                 f"key.\n  {SSH_OFF_FIX}")
    cmd = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    rc = subprocess.run(cmd, check=False).returncode
    if rc == 255:  # ssh's own failure (no connection, refused key), not the remote command's
        state = ssh_state(opts.docker, opts.container)
        why = {"absent": f"no container named {opts.container} answers here: make run starts it "
                         "(make ssh logs in to make run's container on PORT_SSH)",
               "starting": f"{opts.container} is still starting: wait for its ==> READY line (make logs)",
               "off": f"SSH is off in {opts.container}. {SSH_OFF_FIX}",
               "on": f"{opts.container} has SSH on, so the message above is from ssh: the port "
                     f"(PORT_SSH={opts.port}) or the key (SSH_ARGS=-i KEY) is wrong"}[state]
        print(f"make ssh: ssh could not log in: {why}", file=sys.stderr)
    return rc


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="find the key, print the ssh line, exec the docker run command")
    r.add_argument("--env-file", help="the --env-file make run passes (.env), if any")
    r.add_argument("--port", default="2222", help="host port of the container's 22 (PORT_SSH)")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- DOCKER run ARGS...")
    g = sub.add_parser("login", help="make ssh: check make run's container has SSH on, then ssh")
    g.add_argument("--docker", default="docker")
    g.add_argument("--container", required=True)
    g.add_argument("--port", default="2222", help="PORT_SSH, for the message")
    g.add_argument("command", nargs=argparse.REMAINDER, help="-- ssh ARGS...")
    opts = p.parse_args(argv)
    if opts.action == "login":
        sys.exit(login(opts))
    if opts.command[:1] == ["--"]:
        opts.command = opts.command[1:]
    run(opts)


if __name__ == "__main__":
    main()
