"""Lazy pulls on a real node (docs/distributing.md#lazy-pulls-estargz): `make push ESGZ=1` publishes
<tag>-esgz to a registry on 127.0.0.1, a node here (a second containerd with our stargz snapshotter
daemon, scripts/lazy/node.py) pulls it lazily and runs it having fetched a fraction of its layer,
Docker 20.10 runs the same tag as an ordinary image, and a tag whose table of contents does not
match its layer is not read lazily. Slow (a conversion and a node per test) and root-only (FUSE,
overlay mounts): make test-slow. Needs scripts/lazy/build-daemon.sh's daemon (STARGZ_GRPC).
"""
import contextlib
import errno
import hashlib
import http.client
import http.server
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import requests
from conftest import require_tool
from test_publish import worktree  # noqa: F401 - a fixture used here
from test_pull import NAME, make
from test_zstd import MANIFEST_TYPES, labelled_image  # noqa: F401 - a fixture used here

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "lazy"))
import node
import registry
import toc

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="a lazy node needs root (FUSE, overlay mounts)")]
# Only what a run reads is fetched: no background fetch of the rest, which would race the count.
ON_DEMAND = "noprefetch = true\nno_background_fetch = true\n"
PAYLOAD = 2_000_000  # tiny_context's random (incompressible) payload, never read by `smoke --version`


@pytest.fixture
def esgz_tag(local_registry, worktree, labelled_image, tmp_path):  # noqa: F811 - fixtures imported above
    """make push ESGZ=1 of the tiny image. -> (registry, tag, make's result)."""
    require_tool("ctr-remote", "stargz-snapshotter")
    tag, _ = labelled_image
    result = make("push", f"REGISTRY={local_registry}", f"IMAGE={NAME}", f"TAG={tag}", "MOVING_TAGS=latest", "ESGZ=1",
                  f"PUSH_WORKTREE={worktree}", f"PUBLISH_DIR={tmp_path / 'publish'}", timeout=600)
    assert result.returncode == 0, result.stderr
    return local_registry, tag, result


@contextlib.contextmanager
def lazy_node():
    """A cold node under a short path (unix socket paths are limited to 108 bytes)."""
    if not os.path.exists(node.DAEMON):
        pytest.fail(f"{node.DAEMON} is missing: build it with scripts/lazy/build-daemon.sh (Debian's "
                    "golang-go and golang-github-containerd-stargz-snapshotter-dev)")
    root = pathlib.Path(tempfile.mkdtemp(prefix="tdl-lazy-", dir="/var/tmp"))
    try:
        with node.containerd_node(root / "n", stargz_config=ON_DEMAND) as n:
            yield n
    finally:
        shutil.rmtree(root, ignore_errors=True)


def sent(address, tmp_path):
    return node.Registry(address, tmp_path / "registry.log")  # conftest's local_registry logs here


def fuse_mounts(under):
    return [line for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines()
            if f" {under}/" in line and "fuse" in line]


def test_push_esgz_publishes_every_tag_with_a_toc_that_matches_its_layer(esgz_tag):
    """make push ESGZ=1 should push <tag>-esgz and latest-esgz, one digest, every layer with a TOC
    digest that the TOC read back from the registry matches, and say so."""
    reg, tag, result = esgz_tag
    tags = requests.get(f"http://{reg}/v2/{NAME}/tags/list", timeout=10).json()["tags"]
    assert {f"{tag}-esgz", "latest-esgz"} <= set(tags), tags
    client = registry.Client(f"{reg}/{NAME}:{tag}-esgz")
    _, manifest = client.image_manifest()
    for layer in manifest["layers"]:
        assert toc.toc_of_remote_layer(client, layer)["entries"], layer["digest"]
    assert "eStargz layers whose TOCs match their digests" in result.stderr, result.stderr


def test_esgz_tag_is_pulled_lazily_and_runs_having_fetched_a_fraction(esgz_tag, tmp_path):
    """A node with the stargz snapshotter should run the -esgz tag after fetching only what the
    command reads: `smoke --version` without the 2 MB payload beside it."""
    reg, tag, _ = esgz_tag
    log = sent(reg, tmp_path)
    ref = f"{reg}/{NAME}:{tag}-esgz"
    with lazy_node() as n:
        mark = log.mark()
        n.ctr("images", "rpull", "--plain-http", ref)
        assert fuse_mounts(n.root), "rpull mounted no layer lazily (no FUSE mount)"
        run = n.ctr("run", "--rm", "--snapshotter", "stargz", ref, "lazy-smoke", "/bin/smoke", "--version")
        fetched = log.blob_bytes(mark)
    assert "tini version" in run.stdout, run.stdout + run.stderr
    assert fetched < PAYLOAD / 2, f"fetched {fetched} bytes: the whole layer, not lazily"


def test_esgz_tag_runs_under_docker_20_10_as_an_ordinary_image(esgz_tag, docker_client):
    """Docker 20.10, which knows nothing of eStargz, should pull and run the -esgz tag as any image."""
    reg, tag, _ = esgz_tag
    ref = f"{reg}/{NAME}:{tag}-esgz"
    try:
        docker_client.images.pull(ref)
        out = docker_client.containers.run(ref, ["--version"], entrypoint=["/bin/smoke"], remove=True)
    finally:
        with contextlib.suppress(Exception):
            docker_client.images.remove(ref, force=True)
    assert b"tini version" in out, out


def test_esgz_tag_whose_toc_does_not_match_its_layer_is_not_read_lazily(esgz_tag, tmp_path):
    """A manifest whose TOC digest names another TOC should not be mounted lazily: the node either
    refuses it or falls back to fetching the whole layer, whose digest it checks."""
    reg, tag, _ = esgz_tag
    base = f"http://{reg}/v2/{NAME}/manifests"
    manifest = requests.get(f"{base}/{tag}-esgz", headers={"Accept": MANIFEST_TYPES}, timeout=10).json()
    for layer in manifest["layers"]:
        layer["annotations"][toc.ANNOTATION] = "sha256:" + "0" * 64
    put = requests.put(f"{base}/bad-esgz", data=json.dumps(manifest),
                       headers={"Content-Type": manifest["mediaType"]}, timeout=10)
    assert put.status_code == 201, put.text
    log = sent(reg, tmp_path)
    ref = f"{reg}/{NAME}:bad-esgz"
    with lazy_node() as n:
        mark = log.mark()
        pulled = n.ctr("images", "rpull", "--plain-http", ref, check=False)
        lazily = fuse_mounts(n.root)
        run = n.ctr("run", "--rm", "--snapshotter", "stargz", ref, "lazy-bad", "/bin/smoke", "--version", check=False)
        fetched = log.blob_bytes(mark)
        daemon_log = (n.root / "stargz.log").read_text()
    assert not lazily, f"a layer with a mismatching TOC was mounted lazily: {lazily}"
    assert "invalid TOC JSON" in daemon_log, f"the snapshotter did not say why: {daemon_log[-1500:]}"
    assert pulled.returncode != 0 or fetched >= PAYLOAD, f"neither refused nor fetched whole ({fetched} bytes)"
    if pulled.returncode == 0:
        assert "tini version" in run.stdout, run.stdout + run.stderr


class Proxy:
    """A registry front on 127.0.0.1 that can misbehave: ranges=False answers every ranged GET with
    the whole blob (200), as a registry without HTTP range support does; cut=True drops the
    connection of every blob GET before its body (a network that went away)."""

    def __init__(self, upstream):
        self.upstream, self.ranges, self.cut = upstream, True, False
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.forward()

            def do_GET(self):
                self.forward()

            def forward(self):
                blob = "/blobs/" in self.path
                if blob and proxy.cut and self.command == "GET":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                skip = {"host", "connection"} | (set() if proxy.ranges else {"range"})
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                conn.request(self.command, self.path, headers=headers)
                answer = conn.getresponse()
                body = answer.read()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # HEAD: the length the GET would have
                self.send_header("Content-Length", answer.getheader("Content-Length", "0")
                                 if self.command == "HEAD" else str(len(body)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(body)
                conn.close()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(esgz_tag):
    front = Proxy(esgz_tag[0])
    yield front
    front.close()


def payload_mount(n):
    """The FUSE mount (a lazily mounted layer) that holds the tiny image's /payload."""
    for line in fuse_mounts(n.root):
        point = pathlib.Path(line.split()[4])
        if (point / "payload").exists():
            return point
    raise AssertionError(f"no lazily mounted layer holds payload: {fuse_mounts(n.root)}")


def payload_digest(reg, tag):
    """The digest the -esgz tag's TOC records for /payload."""
    client = registry.Client(f"{reg}/{NAME}:{tag}-esgz")
    for layer in client.image_manifest()[1]["layers"]:
        for entry in toc.toc_of_remote_layer(client, layer)["entries"]:
            if entry["name"] == "payload":
                return entry["digest"]
    raise AssertionError("no payload in the TOCs")


def test_esgz_tag_from_a_registry_without_ranges_still_runs_but_fetches_whole_layers(esgz_tag, proxy, tmp_path):
    """A registry that ignores Range should still give a working lazy node, the command's output
    right, but no saving: the registry sends whole layers (the payload included)."""
    _, tag, _ = esgz_tag
    proxy.ranges = False
    log = sent(esgz_tag[0], tmp_path)
    ref = f"{proxy.address}/{NAME}:{tag}-esgz"
    with lazy_node() as n:
        mark = log.mark()
        n.ctr("images", "rpull", "--plain-http", ref)
        run = n.ctr("run", "--rm", "--snapshotter", "stargz", ref, "lazy-norange", "/bin/smoke", "--version")
        fetched = log.blob_bytes(mark)
    assert "tini version" in run.stdout, run.stdout + run.stderr
    assert fetched >= PAYLOAD, f"fetched {fetched} bytes: ranges were served after all?"


@pytest.fixture
def lazyread(tmp_path):
    """tests/data/lazyread/main.go built static: a job for the tiny image, which has no shell."""
    go = require_tool("go", "golang-go")
    out = tmp_path / "job" / "lazyread"
    env = {**os.environ, "CGO_ENABLED": "0", "GO111MODULE": "off",
           "GOCACHE": os.environ.get("GOCACHE", "/var/tmp/team-dl-lazy-gocache")}
    built = subprocess.run([go, "build", "-o", str(out), str(ROOT / "tests" / "data" / "lazyread" / "main.go")],
                           capture_output=True, text=True, env=env, check=False, timeout=600)
    assert built.returncode == 0, built.stderr
    return out


def wait_for(path, job, seconds):
    deadline = time.monotonic() + seconds
    while not path.exists():
        if job.poll() is not None:
            pytest.fail(f"the job ended before it began reading: {job.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"the job did not begin reading within {seconds} s")
        time.sleep(0.1)


def test_snapshotter_killed_mid_read_fails_the_jobs_read_and_restarting_both_recovers(esgz_tag, lazyread, tmp_path):
    """A job in a container halfway through a lazily fetched file when the snapshotter is killed
    should see its next read fail at once (ENOTCONN: 'transport endpoint is not connected') and
    exit with that error, not hang or read wrong bytes; with the snapshotter restarted on the same
    root, starting the container again should read the whole file, its bytes the TOC's digest."""
    reg, tag, _ = esgz_tag
    ref = f"{reg}/{NAME}:{tag}-esgz"
    expected = payload_digest(reg, tag)
    talk = tmp_path / "talk"  # the job says `started` here; the test answers `go`
    talk.mkdir()
    with lazy_node() as n:
        n.ctr("images", "rpull", "--plain-http", ref)
        n.ctr("containers", "create", "--snapshotter", "stargz",
              "--mount", f"type=bind,src={lazyread.parent},dst=/job,options=rbind:ro",
              "--mount", f"type=bind,src={talk},dst=/talk,options=rbind:rw",
              ref, "lazy-job", "/job/lazyread", "/payload", "/talk")
        start = [node.CTR, "--address", n.socket, "--namespace", "team-dl-lazy", "tasks", "start", "lazy-job"]
        job = subprocess.Popen(start, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(talk / "started", job, 60)  # 64 KiB read, the file still open
        n.daemon.kill()
        n.daemon.wait()
        (talk / "go").touch()
        begun = time.monotonic()
        _, first_err = job.communicate(timeout=120)
        failed_after = time.monotonic() - begun
        first_status = job.returncode
        (talk / "started").unlink()
        with node.stargz_daemon(n.root, ON_DEMAND):
            n.ctr("tasks", "delete", "lazy-job", check=False)  # the failed run's task
            # containerd redials the snapshotter's socket with a backoff: a few seconds.
            for _ in range(60):
                again = n.ctr("tasks", "start", "lazy-job", check=False, timeout=300)
                if "unavailable" not in again.stderr:  # connection refused or closed: redialing
                    break
                time.sleep(0.5)
            n.ctr("tasks", "delete", "lazy-job", check=False)
    assert first_status == 1, f"the job did not fail its read (exit {first_status}): {first_err}"
    assert "transport endpoint is not connected" in first_err.lower(), first_err
    assert failed_after < 30, f"the failed read took {failed_after:.0f} s: it should fail at once"
    assert again.returncode == 0, f"restarted, the job still failed: {again.stdout}{again.stderr}"
    assert again.stdout.strip() == expected, f"restarted, the job read other bytes: {again.stdout}"


def test_network_cut_mid_read_fails_the_read_and_a_retry_after_it_returns_succeeds(esgz_tag, proxy):
    """A registry connection that drops while a file is fetched lazily should fail that read with
    an error (not wrong bytes, not a hang past the fetch timeout); once the network is back, the
    same read should succeed."""
    _, tag, _ = esgz_tag
    ref = f"{proxy.address}/{NAME}:{tag}-esgz"
    with lazy_node() as n:
        n.ctr("images", "rpull", "--plain-http", ref)
        layer = payload_mount(n)
        proxy.cut = True
        with pytest.raises(OSError) as failed:
            (layer / "payload").read_bytes()
        proxy.cut = False
        data = (layer / "payload").read_bytes()
    assert failed.value.errno in (errno.EIO, errno.ENOTCONN, errno.ETIMEDOUT), failed.value
    assert "sha256:" + hashlib.sha256(data).hexdigest() == payload_digest(proxy.upstream, tag), \
        f"read {len(data)} other bytes after the network came back"
