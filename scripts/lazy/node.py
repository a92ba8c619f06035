"""A throw-away lazy-pulling node on this host, for the lazy-pull tests and benchmarks/bench_start.py:
a registry (Debian's docker-registry on 127.0.0.1), a second containerd with its own root, state
and socket, and our stargz snapshotter daemon (scripts/lazy/build-daemon.sh) as its proxy plugin
`stargz`. Nothing here touches the host's Docker or its containerd. Needs root (FUSE, overlayfs).

    with registry(work) as reg, containerd_node(work / "node") as node:
        node.ctr("images", "rpull", "--plain-http", f"{reg.address}/x:esgz")
"""
import contextlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import time

DAEMON = os.environ.get("STARGZ_GRPC", "/work/lazy-bin/stargz-grpc")  # scripts/lazy/build-daemon.sh's output
CTR = os.environ.get("CTR_REMOTE", "ctr-remote")  # Debian's stargz-snapshotter package


def require(path, fix):
    found = shutil.which(path) or (path if os.path.exists(path) else None)
    if not found:
        raise RuntimeError(f"{path} not found: {fix}")
    return found


def wait(probe, seconds, what, log_path):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.1)
    tail = pathlib.Path(log_path).read_text(errors="replace")[-2000:] if os.path.exists(log_path) else ""
    raise RuntimeError(f"{what} did not start within {seconds} s:\n{tail}")


def stop(proc, seconds=30):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Registry:
    """Debian's docker-registry; its info log records every response with its size, which is how
    the bytes a node fetched are counted (registry-side, so no client can under-report)."""

    def __init__(self, address, log_path):
        self.address, self.log_path = address, pathlib.Path(log_path)

    def mark(self):
        """A position in the log; blob_bytes(since=mark) counts only what came after it."""
        return self.log_path.stat().st_size

    def blob_bytes(self, since=0):
        """Bytes of blobs (layers, configs) the registry sent since the mark: full and ranged GETs."""
        with open(self.log_path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        total = 0
        for line in text.splitlines():
            if "response completed" in line and "/blobs/" in line and 'http.request.method=GET' in line:
                written = re.search(r"http\.response\.written=(\d+)", line)
                total += int(written.group(1)) if written else 0
        return total


@contextlib.contextmanager
def registry(work):
    """-> Registry on 127.0.0.1:<a port it binds itself>, storing under work/registry-data."""
    work = pathlib.Path(work)
    work.mkdir(parents=True, exist_ok=True)
    config, log_path = work / "registry.yml", work / "registry.log"
    config.write_text("version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\nstorage:\n"
                      f"  filesystem:\n    rootdirectory: {work / 'registry-data'}\n"
                      "  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:0\n")
    binary = require("docker-registry", "apt-get install docker-registry")
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        address = wait(lambda: (m := re.search(r"listening on (127\.0\.0\.1:\d+)", log_path.read_text()))
                       and m.group(1), 30, "the registry", log_path)
        yield Registry(address, log_path)
    finally:
        stop(proc)


class Node:
    def __init__(self, root, socket):
        self.root, self.socket = pathlib.Path(root), socket

    def ctr(self, *args, check=True, timeout=1800):
        """ctr-remote against this node's containerd, namespace team-dl-lazy."""
        proc = subprocess.run([CTR, "--address", self.socket, "--namespace", "team-dl-lazy", *args],
                              capture_output=True, text=True, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"ctr-remote {' '.join(args[:3])} failed: {proc.stderr.strip()[-1500:]}")
        return proc


def containerd_config(root):
    """version 2 config: own root/state/sockets, no CRI, the stargz daemon as snapshotter `stargz`."""
    return "\n".join([
        "version = 2",
        f'root = "{root}/root"',
        f'state = "{root}/state"',
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
        "[grpc]",
        f'  address = "{root}/containerd.sock"',
        "[ttrpc]",
        f'  address = "{root}/containerd.sock.ttrpc"',
        "[proxy_plugins]",
        "  [proxy_plugins.stargz]",
        '    type = "snapshot"',
        f'    address = "{root}/stargz.sock"',
        "",
    ])


@contextlib.contextmanager
def stargz_daemon(root, config=None):
    """Our stargz daemon serving root/stargz.sock, its state in root/stargz. -> the Popen (tests kill it)."""
    root = pathlib.Path(root)
    binary = require(DAEMON, "build it: scripts/lazy/build-daemon.sh")
    (root / "stargz.toml").write_text(config or "")
    log_path = root / "stargz.log"
    # A killed daemon leaves its socket: gone, the wait below sees the new one only once it serves
    # (after it has remounted the lazily mounted layers of the last one).
    (root / "stargz.sock").unlink(missing_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen([binary, "--address", str(root / "stargz.sock"), "--root", str(root / "stargz"),
                                 "--config", str(root / "stargz.toml")], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait(lambda: (root / "stargz.sock").exists() or proc.poll() is not None, 30, "the stargz daemon", log_path)
        if proc.poll() is not None:
            raise RuntimeError(f"the stargz daemon exited: {log_path.read_text()[-1500:]}")
        yield proc
    finally:
        stop(proc)


@contextlib.contextmanager
def containerd_node(root, stargz_config=None, stargz=True):
    """A cold node: empty containerd + stargz daemon under root (stargz=False: containerd alone,
    enough to convert); everything removed afterwards (containers, FUSE and overlay mounts, the
    directory)."""
    root = pathlib.Path(root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    require("containerd", "apt-get install containerd")
    (root / "containerd.toml").write_text(containerd_config(root))
    log_path = root / "containerd.log"
    node = Node(root, str(root / "containerd.sock"))
    try:
        with stargz_daemon(root, stargz_config) if stargz else contextlib.nullcontext() as daemon:
            node.daemon = daemon  # the stargz daemon's Popen (a test kills it), None without one
            with open(log_path, "wb") as out:
                proc = subprocess.Popen(["containerd", "--config", str(root / "containerd.toml")],
                                        stdout=out, stderr=subprocess.STDOUT)
            try:
                wait(lambda: node.ctr("version", check=False).returncode == 0, 60, "the second containerd", log_path)
                yield node
            finally:
                for task in node.ctr("tasks", "ls", "-q", check=False).stdout.split():
                    node.ctr("tasks", "kill", "-s", "KILL", task, check=False)
                    time.sleep(0.5)
                    node.ctr("tasks", "delete", "-f", task, check=False)
                for container in node.ctr("containers", "ls", "-q", check=False).stdout.split():
                    node.ctr("containers", "delete", container, check=False)
                stop(proc)
    finally:
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


def unmount_under(root):
    """Lazy-unmount whatever is still mounted under root (deepest first): overlays, FUSE layers."""
    mounts = [line.split()[4] for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(str(root) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def image_layers(reg, repo, tag):
    """The manifest's layer descriptors of reg/repo:tag (OCI or Docker media types)."""
    import urllib.request
    accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
    req = urllib.request.Request(f"http://{reg.address}/v2/{repo}/manifests/{tag}", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["layers"]
