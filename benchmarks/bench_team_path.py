#!/usr/bin/env python3
"""The team member's path, measured: README's first screen, as root, with a team registry and no
Docker Hub. Prints a Markdown table (seconds, bytes the registry sent, commands typed, load).

Usage: bench_team_path.py [--image REF] [--work DIR] [--ports JUPYTER,SSH] [--rebuild NAME:TAG] [--keep-rebuild]

1. Publish: --image goes to a fresh Debian docker-registry on 127.0.0.1 as <registry>/team/team-dl:<the
   row's moving tag>, the tag a member's make run follows (tagged under that name by image id,
   pushed, untagged: the image itself is left as it is).
2. Cold, then warm: git clone of this checkout's HEAD, then the first screen's commands as typed
   (make doctor REGISTRY=..., make run REGISTRY=..., the one host step the pre-flight prints for a
   root-owned checkout, make ssh), into a second dockerd with its own data root, socket, exec root
   and bridge (the member's host: cold = its store empty; warm = a new clone, the image there).
   Done when a notebook is saved through Jupyter's contents API with the printed token, and when
   make ssh (in a pseudo-terminal) shows tmux's status line. During make run, `du` samples the
   member's data root every 10 s: the disk a cold pull needs (scripts/doctor.py PULL_DISK_BYTES).
3. Update: the image rebuilt from HEAD with one of our own files changed (make build, a name of
   its own), pushed to the moving tag; then the member's commands: make stop and make run (which
   should say a newer image is published), make pull, make stop, make run. Bytes: blob bytes the
   registry logged as sent (scripts/lazy/node.py), beside the manifest delta.
Needs root, docker-registry, git, ssh-agent; about 2x the image's size of disk under --work, all
removed at the end (the rebuilt image too, unless --keep-rebuild). Other load on the host shows in
each row's load average: compare runs made in one quiet window.
"""
import argparse
import contextlib
import datetime
import json
import os
import pathlib
import pty
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "scripts" / "lazy"), str(ROOT / "benchmarks")]
import bench_pull  # the second-dockerd helper
import node  # the registry that counts the bytes it sent

DOCKER = "/usr/bin/docker"
DEFAULT_IMAGE = "team-dl:2.6.0-cuda12.4-cudnn9-py3.11-runtime"
# Make variables the caller's environment must not hand the member's make (a member has none).
LEAKY = ("BASE_IMAGE", "PYTHON_VERSION", "IMAGE", "TAG", "REGISTRY", "ROW", "CONTAINER", "WORKSPACE",
         "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "DOCKER", "DOCKER_HOST", "SSH_AUTH_SOCK")
CHANGED = "docker/rootfs/etc/tmux.conf"
MARK = "# rebuilt by benchmarks/bench_team_path.py: only our own files changed"
ROWS = []


def last_blob_sent(reg, since):
    """Wall-clock time of the last blob the registry finished sending after the mark (its log's
    time=...), or None: where a pull's download ended, inside make run's seconds."""
    with open(reg.log_path, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    times = re.findall(r'^time="([^"]+)".*response completed.*http\.request\.method=GET.*/blobs/', text, re.MULTILINE)
    if not times:
        return None
    return datetime.datetime.fromisoformat(times[-1][:26]).replace(tzinfo=datetime.UTC).timestamp()


@contextlib.contextmanager
def peak_disk(path, every=10):
    """-> a list whose [0] ends as the most `du -sxb path` said while inside (sampled every `every`
    s: a short peak between samples is missed): what make doctor's PULL_DISK_BYTES stands for."""
    peak, done = [0], threading.Event()

    def sample():
        while not done.wait(every):
            out = sh("du", "-sxb", str(path), check=False).stdout.split()
            peak[0] = max(peak[0], int(out[0]) if out else 0)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield peak
    finally:
        done.set()
        t.join()


def load():
    return pathlib.Path("/proc/loadavg").read_text().split()[0]


def sh(*args, env=None, cwd=None, check=True, timeout=1800):
    p = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, check=False, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    return p


def row(phase, step, seconds, note="", typed=0, sent=None):
    ROWS.append((phase, step, seconds, note, typed, sent, load()))
    print(f"  {phase}: {step}: {seconds:.1f} s {note} (load {load()})", file=sys.stderr, flush=True)


class Member:
    """The member's shell: a fresh HOME, an ssh-agent with a new key (make run hands the agent's
    key over; ssh uses it), DOCKER_HOST at the member's dockerd; ports other than 8888/2222."""

    def __init__(self, work, sock, ports, reg):
        self.work, self.reg, self.typed = work, reg, 0
        home = work / "home"
        (home / ".ssh").mkdir(parents=True, exist_ok=True)
        key = home / ".ssh" / "id_ed25519"
        if not key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        agent = sh("ssh-agent", "-s").stdout
        self.agent = dict(re.findall(r"(SSH_AUTH_SOCK|SSH_AGENT_PID)=([^;]+);", agent))
        self.env = {k: v for k, v in os.environ.items() if k not in LEAKY}
        self.env.update(HOME=str(home), DOCKER_HOST=sock, PORT_JUPYTER=str(ports[0]), PORT_SSH=str(ports[1]),
                        TERM="xterm", SSH_AUTH_SOCK=self.agent["SSH_AUTH_SOCK"])
        sh("ssh-add", "-q", str(key), env=self.env)
        self.port, self.data = ports[0], pathlib.Path(sock.removeprefix("unix://")).parent / "data"

    def close(self):
        sh("kill", self.agent["SSH_AGENT_PID"], check=False)

    def type(self, *args, cwd, check=True):
        """One command typed: -> (seconds, stdout + stderr). check: it must exit 0."""
        self.typed += 1
        start = time.monotonic()
        p = sh(*args, env=self.env, cwd=cwd, check=False)
        seconds, out = time.monotonic() - start, p.stdout + p.stderr
        shown = out if len(out) < 4000 else f"{out[:2000]}\n[...]\n{out[-2000:]}"
        print(f"$ {' '.join(args)}  # {seconds:.1f} s, exit {p.returncode}\n{shown}", file=sys.stderr, flush=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {p.returncode}:\n{out[-3000:]}")
        return seconds, out, p.returncode

    def save_notebook(self, out):
        """PUT a notebook through the contents API with the token make run printed. -> seconds."""
        token = re.findall(r"token=([0-9a-f]+)", out)
        if not token:
            raise RuntimeError(f"make run printed no token:\n{out[-2000:]}")
        body = json.dumps({"type": "notebook", "format": "json", "content": {
            "cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/contents/bench-team-path.ipynb",
                                     data=body, method="PUT", headers={"Authorization": f"token {token[-1]}"})
        start = time.monotonic()
        with urllib.request.urlopen(req, timeout=60) as r:
            if r.status not in (200, 201):
                raise RuntimeError(f"the notebook save answered {r.status}")
        return time.monotonic() - start

    def ssh_in_tmux(self, cwd, timeout=120):
        """make ssh in a pseudo-terminal, until tmux draws its status line ([main]). -> seconds."""
        self.typed += 1
        master, slave = pty.openpty()
        start = time.monotonic()
        proc = subprocess.Popen(["make", "ssh"], stdin=slave, stdout=slave, stderr=slave, cwd=cwd,
                                env=self.env, start_new_session=True)
        os.close(slave)
        seen = bytearray()

        def drain():
            with contextlib.suppress(OSError):
                while chunk := os.read(master, 4096):
                    seen.extend(chunk)
        threading.Thread(target=drain, daemon=True).start()
        while b"[main]" not in seen and proc.poll() is None and time.monotonic() - start < timeout:
            time.sleep(0.05)
        seconds = time.monotonic() - start
        os.write(master, b"\x02d")  # tmux's detach: the session stays, ssh ends
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
        if b"[main]" not in seen:
            raise RuntimeError(f"make ssh showed no tmux status line:\n{bytes(seen)[-2000:].decode(errors='replace')}")
        return seconds


def member_path(phase, m, repo, registry, clone):
    """Clone, then the first screen's commands as typed until a notebook saves and tmux shows."""
    shutil.rmtree(clone, ignore_errors=True)
    m.typed, mark, start = 0, m.reg.mark(), time.monotonic()
    s, _, _ = m.type("git", "clone", "-q", str(repo), str(clone), cwd=clone.parent)
    row(phase, "git clone", s, typed=1)
    s, out, rc = m.type("make", "doctor", f"REGISTRY={registry}", cwd=clone, check=False)
    row(phase, "make doctor REGISTRY=...", s, f"exit {rc}", typed=1)
    with peak_disk(m.data) as peak:
        began = time.time()
        s, out, rc = m.type("make", "run", f"REGISTRY={registry}", cwd=clone, check=False)
        fix = re.search(r"^\s*(setfacl -R [^\n]*)$", out, re.MULTILINE)
        if rc != 0 and fix:
            # The one host step the pre-flight prints for a root-owned checkout, typed as printed.
            row(phase, "make run (stops at the pre-flight)", s, f"exit {rc}", typed=1)
            s2, _, _ = m.type("bash", "-c", fix.group(1), cwd=clone)
            row(phase, f"`{fix.group(1).strip()}`", s2, typed=1)
            began = time.time()
            s, out, rc = m.type("make", "run", cwd=clone, check=False)
    if rc != 0:
        raise RuntimeError(f"make run exited {rc}:\n{out[-3000:]}")
    pulled = m.reg.blob_bytes(since=mark)
    done = last_blob_sent(m.reg, mark)
    row(phase, "make run (pull, start, returns at READY)", s, ("" if done is None else
        f"the registry sent its last blob {done - began:.1f} s in; ") + f"data root at most "
        f"{bench_pull.gb(peak[0])} (du every 10 s)", typed=1, sent=pulled)
    s = m.save_notebook(out)
    saved = time.monotonic() - start
    row(phase, "notebook saved (contents API, printed token)", s)
    s = m.ssh_in_tmux(clone)
    row(phase, "make ssh until tmux's status line", s, typed=1)
    row(phase, "**clone to notebook saved**", saved, typed=m.typed - 1)
    row(phase, "**clone to tmux**", time.monotonic() - start, typed=m.typed, sent=m.reg.blob_bytes(since=mark))
    return out


def publish(image, ref):
    """docker push image (a local image) as ref, tagged by its id and untagged after. -> seconds."""
    image_id = sh(DOCKER, "image", "inspect", "-f", "{{.Id}}", image).stdout.strip()
    sh(DOCKER, "tag", image_id, ref)
    try:
        start = time.monotonic()
        sh(DOCKER, "push", ref)
        return time.monotonic() - start
    finally:
        sh(DOCKER, "image", "rm", ref, check=False)


def rebuild(work, name):
    """make build of HEAD with one of our own files changed (the top layer), as name."""
    tree = work / "rebuild"
    shutil.rmtree(tree, ignore_errors=True)
    sh("git", "clone", "-q", str(ROOT), str(tree))
    with open(tree / CHANGED, "a") as f:
        f.write(MARK + "\n")
    env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    env.setdefault("BASE_IMAGE", sh("python3", "scripts/versions.py", "standin", "image", cwd=ROOT).stdout.strip())
    env.setdefault("PYTHON_VERSION", sh("python3", "scripts/versions.py", "standin", "python", cwd=ROOT).stdout.strip())
    if os.path.exists("/etc/ssl/certs/ca-certificates.crt"):
        env.setdefault("CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    for k in ("BASE_IMAGE", "PYTHON_VERSION", "CA_BUNDLE"):
        if k in os.environ:
            env[k] = os.environ[k]
    start = time.monotonic()
    name, tag = name.split(":")
    sh("make", "build", f"IMAGE={name}", f"TAG={tag}", "DOCKER=" + DOCKER, cwd=tree, env=env, timeout=3600)
    return time.monotonic() - start


@contextlib.contextmanager
def member_dockerd(root):
    """The member's host: a second dockerd with its own data root, exec root, pidfile, socket and
    bridge (never --bridge none: that deletes docker0 at start, bench_pull.cold_dockerd says why).
    The bridge gets an address, so docker-proxy reaches the container's published ports."""
    root.mkdir(parents=True, exist_ok=True)
    sock, bridge = f"unix://{root}/docker.sock", "t51tp0"
    sh("ip", "link", "add", bridge, "type", "bridge")
    sh("ip", "addr", "add", "10.251.51.1/24", "dev", bridge)
    sh("ip", "link", "set", bridge, "up")
    try:
        with bench_pull.daemon("dockerd", root, [
                "dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
                "--pidfile", str(root / "pid"), "-H", sock, "--bridge", bridge, "--iptables=false",
                "--ip-masq=false", "--containerd-namespace", "team-path", "--containerd-plugins-namespace",
                "team-path-plugins"], [DOCKER, "-H", sock, "info"]):
            yield sock
    finally:
        sh("ip", "link", "delete", bridge, check=False)
        shutil.rmtree(root, ignore_errors=True)


def manifest_delta(reg, repo, old_layers, new_layers):
    have = {layer["digest"] for layer in old_layers}
    fresh = [layer for layer in new_layers if layer["digest"] not in have]
    return sum(layer["size"] for layer in fresh), len(fresh), len(new_layers)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", default=DEFAULT_IMAGE, help="the image the team publishes (left untouched)")
    ap.add_argument("--work", default="/var/tmp/bench-team-path", help="registry, member host, clones (removed)")
    ap.add_argument("--ports", default="18951,12251", help="the member's PORT_JUPYTER,PORT_SSH")
    ap.add_argument("--rebuild", default="team-dl-bench-rebuild:top-layer", help="the rebuilt image's name")
    ap.add_argument("--keep-rebuild", action="store_true", help="leave the rebuilt image here")
    o = ap.parse_args(argv)
    work, ports = pathlib.Path(o.work), [int(p) for p in o.ports.split(",")]
    moving = sh("python3", "scripts/build_info.py", "moving-tags", cwd=ROOT).stdout.split()[0]
    head = sh("git", "rev-parse", "--short", "HEAD", cwd=ROOT).stdout.strip()
    print(f"image {o.image}, HEAD {head}, work {work}, load at start {load()}", file=sys.stderr)
    work.mkdir(parents=True, exist_ok=True)
    try:
        with node.registry(work / "registry") as reg, member_dockerd(work / "docker") as sock:
            registry = f"{reg.address}/team"
            ref = f"{registry}/team-dl:{moving}"
            row("publish", f"docker push {o.image} as {ref}", publish(o.image, ref))
            old_layers = node.image_layers(reg, "team/team-dl", moving)
            m = Member(work, sock, ports, reg)
            try:
                member_path("cold", m, ROOT, registry, work / "team-dl")
                m.type("make", "stop", cwd=work / "team-dl")
                member_path("warm", m, ROOT, registry, work / "team-dl")
                update(o, m, reg, ref, work / "team-dl", old_layers, moving)
                m.type("make", "stop", cwd=work / "team-dl")
            finally:
                m.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not o.keep_rebuild:
            sh(DOCKER, "image", "rm", o.rebuild, check=False)
    print(table(o, head))


def update(o, m, reg, ref, clone, old_layers, moving):
    row("update", f"maintainer: make build, {CHANGED} changed", rebuild(pathlib.Path(o.work), o.rebuild))
    row("update", f"maintainer: docker push as {ref}", publish(o.rebuild, ref))
    size, fresh, total = manifest_delta(reg, "team/team-dl", old_layers,
                                        node.image_layers(reg, "team/team-dl", moving))
    m.typed, mark = 0, reg.mark()
    s, _, _ = m.type("make", "stop", cwd=clone)
    row("update", "make stop (the member's next restart)", s, typed=1)
    s, out, _ = m.type("make", "run", cwd=clone)
    said = "says a newer image is published" if "newer" in out and "is published" in out else "**no update notice**"
    row("update", "make run", s, said, typed=1, sent=reg.blob_bytes(since=mark))
    start, mark = time.monotonic(), reg.mark()
    s, out, _ = m.type("make", "pull", cwd=clone)
    said = "says the container runs the old image" if "still runs" in out else "no word on the running container"
    row("update", "make pull", s, f"{said}; manifest delta {size} B in {fresh} of {total} layers",
        typed=1, sent=reg.blob_bytes(since=mark))
    s, _, _ = m.type("make", "stop", cwd=clone)
    row("update", "make stop", s, typed=1)
    s, out, _ = m.type("make", "run", cwd=clone)
    name = sh(DOCKER, "ps", "--format", "{{.Names}}", env=m.env).stdout.split()[0]
    got = sh(DOCKER, "exec", name, "grep", "-c", MARK, "/etc/tmux.conf", env=m.env, check=False)
    row("update", "make run (the new image)", s, "runs the rebuilt image" if got.stdout.strip() == "1"
        else "**still the old image**", typed=1)
    row("update", "**make pull to the new image at READY**", time.monotonic() - start, typed=3,
        sent=reg.blob_bytes(since=mark))


def table(o, head):
    lines = [(f"Image `{o.image}`, HEAD `{head}`, {os.cpu_count()} CPU cores; load = 1-minute load average "
             "at the end of each step."), "", "| Phase | Step | Seconds | Commands typed | Registry sent | Load | Note |",
             "|---|---|---|---|---|---|---|"]
    for phase, step, seconds, note, typed, sent, ld in ROWS:
        size = "" if sent is None else bench_pull.mb(sent) if sent >= 1e7 else f"{sent:,} B"
        lines.append(f"| {phase} | {step} | {seconds:.1f} | {typed or ''} | {size} | {ld} | {note} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
