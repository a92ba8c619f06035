"""Pull first: `make pull` and make run/shell/smoke's use of a published image, against a real
registry on 127.0.0.1 (Debian's docker-registry, conftest's local_registry) with real
`docker pull`, and against fake registries for the faults a real one does not produce (401, 500,
a digest that does not match, a pull cut off halfway, a full disk).

The image is a tiny stand-in (FROM scratch: tini-static as /bin/smoke and a 2 MB payload): what
is checked (digests, tags, what gets built) does not depend on the image's contents.
"""
import hashlib
import http.server
import io
import json
import os
import pathlib
import signal
import socket
import subprocess
import tarfile
import threading
import time
import urllib.request
import uuid

import pytest
from conftest import require_tool
from test_publish import LEAKY, ROOT

import docker

NAME = "team-dl-pulltest"
DOCKERFILE = "FROM scratch\nCOPY smoke /bin/smoke\nCOPY payload /payload\nCMD [\"smoke\", \"--version\"]\n"


def make(*args, env=None, timeout=300):
    run_env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    run_env.update({"DOCKER": "/usr/bin/docker", **(env or {})})
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True,
                          env=run_env, check=False, timeout=timeout)


def tiny_context(payload_size=2_000_000):
    """Build context of the runnable tiny image; a fresh random payload makes a distinct image."""
    buf = io.BytesIO()
    tini = pathlib.Path(require_tool("tini-static", "tini")).read_bytes()
    files = (("Dockerfile", DOCKERFILE.encode(), 0o644), ("smoke", tini, 0o755),
             ("payload", os.urandom(payload_size), 0o644))
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def gone(client, ref):
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return True
    return False


@pytest.fixture
def publish(docker_client, local_registry):
    """Factory: publish(payload_size) builds a tiny image, pushes it to the local registry as
    NAME:<new tag> and removes it here again, so only the registry has it. -> (REGISTRY, TAG,
    digest). Every image the test leaves under NAME is removed afterwards."""
    def push(payload_size=2_000_000):
        tag = f"t{uuid.uuid4().hex[:10]}"
        ref = f"{local_registry}/{NAME}:{tag}"
        image, _ = docker_client.images.build(fileobj=tiny_context(payload_size), custom_context=True,
                                              tag=ref, rm=True, pull=False)
        out = subprocess.run(["/usr/bin/docker", "push", ref], capture_output=True, text=True, check=True).stdout
        digest = next(w for w in out.split() if w.startswith("sha256:"))
        docker_client.images.remove(image.id, force=True)
        return local_registry, tag, digest

    yield push
    for image in docker_client.images.list():
        if any(NAME in t for t in image.tags + (image.attrs.get("RepoDigests") or [])):
            docker_client.images.remove(image.id, force=True)


def pull(registry, tag, *extra, **kw):
    return make("pull", f"REGISTRY={registry}", f"IMAGE={NAME}", f"TAG={tag}", *extra, **kw)


def test_make_pull_fetches_the_tag_and_checks_its_digest(publish, docker_client):
    """make pull should docker-pull the published tag by its digest, then tag REF, and say that
    the signature was not checked when no signer is configured."""
    registry, tag, digest = publish()
    result = pull(registry, tag)
    assert result.returncode == 0, f"make pull failed:\n{result.stderr}"
    image = docker_client.images.get(f"{registry}/{NAME}:{tag}")
    assert f"{registry}/{NAME}@{digest}" in image.attrs["RepoDigests"], image.attrs["RepoDigests"]
    assert "signature not checked" in result.stderr, f"no word on the signature:\n{result.stderr}"
    assert f"pulled and verified {registry}/{NAME}:{tag} ({digest})" in result.stderr, result.stderr


def test_make_smoke_uses_the_published_image_instead_of_building(publish, docker_client, tmp_path):
    """make smoke with REGISTRY set should pull the published REF and run it, not build it."""
    registry, tag, _ = publish()
    docker_log, env = fake_docker(tmp_path)
    result = make("smoke", f"REGISTRY={registry}", f"IMAGE={NAME}", f"TAG={tag}", "SMOKE_ARGS=--version", env=env)
    assert result.returncode == 0, f"make smoke failed:\n{result.stdout}\n{result.stderr}"
    assert "tini version" in result.stdout + result.stderr, f"the pulled image did not run:\n{result.stdout}"
    calls = docker_log.read_text().splitlines()
    assert any(c.startswith("pull ") for c in calls) and not any(c.startswith("build ") for c in calls), calls


@pytest.mark.parametrize(("published", "extra", "builds"), [
    (False, [], True), (True, ["BUILD=1"], True), (True, [], False)],
    ids=["nothing-published-builds", "build-1-builds", "published-pulls"])
def test_make_smoke_builds_only_when_nothing_is_published_or_build_is_asked(publish, tmp_path, published,
                                                                             extra, builds):
    """make smoke should build when the registry has no such tag (404) or BUILD=1, and not when
    the tag is published. (The fake docker fails every build: nothing is really built.)"""
    registry, tag, _ = publish()
    tag = tag if published else tag + "-unpublished"
    docker_log, env = fake_docker(tmp_path)
    result = make("smoke", f"REGISTRY={registry}", f"IMAGE={NAME}", f"TAG={tag}", "SMOKE_ARGS=--version",
                  "PREFLIGHT=0", *extra, env=env)
    built = any(line.startswith("build ") for line in docker_log.read_text().splitlines())
    assert built == builds, f"build {'not ' if builds else ''}run:\n{docker_log.read_text()}\n{result.stderr}"
    if not published:
        assert "is not published: building it locally" in result.stderr, result.stderr


def fake_docker(tmp_path, pull_output=None):
    """A docker client that logs its arguments and hands them to the real one; `build` fails (no
    test here builds the 7 GB image), and with pull_output, `pull` prints that and fails."""
    log = tmp_path / "docker-calls.log"
    script = tmp_path / "docker"
    fail_pull = (f'if [ "$1" = pull ]; then printf "%s\\n" {json.dumps(pull_output)}; exit 1; fi\n'
                 if pull_output else "")
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\nif [ "$1" = build ]; then exit 7; fi\n{fail_pull}'
                      'exec /usr/bin/docker "$@"\n')
    script.chmod(0o755)
    log.touch()
    return log, {"DOCKER": str(script)}


class FakeRegistry(http.server.ThreadingHTTPServer):
    """A registry that answers manifests with `status`, or serves `manifest` under a claimed
    digest of the caller's choice (None: its true digest)."""

    def __init__(self, status=200, manifest=None, claimed=None):
        self.status, self.manifest, self.claimed = status, manifest, claimed
        super().__init__(("127.0.0.1", 0), FakeHandler)


class FakeHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        s = self.server
        if s.status != 200 or s.manifest is None:
            self.send_response(s.status)
            self.end_headers()
            return
        body = json.dumps(s.manifest).encode()
        self.send_response(200)
        self.send_header("Content-Type", s.manifest["mediaType"])
        self.send_header("Docker-Content-Digest", s.claimed or "sha256:" + hashlib.sha256(body).hexdigest())
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_registry():
    servers = []

    def start(**kw):
        server = FakeRegistry(**kw)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()


def manifest(layer_size=1000, media="application/vnd.docker.image.rootfs.diff.tar.gzip"):
    return {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 2,
                       "digest": "sha256:" + "c" * 64},
            "layers": [{"mediaType": media, "size": layer_size, "digest": "sha256:" + "d" * 64}]}


@pytest.mark.parametrize(("status", "says"), [
    (401, "docker login 127.0.0.1:"), (404, "is not published (404)"), (500, "try again later")])
def test_make_pull_says_in_one_line_what_a_failing_registry_means(fake_registry, docker_client, tmp_path,
                                                                  status, says):
    """make pull from a registry answering 401, 404 or 500 should fail with one ERROR line that says
    what to do, tag nothing; make smoke should not build instead (except for 404)."""
    registry = fake_registry(status=status)
    result = pull(registry, "x")
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert result.returncode != 0 and len(errors) == 1 and says in errors[0], result.stderr
    assert gone(docker_client, f"{registry}/{NAME}:x"), "something was tagged"
    docker_log, env = fake_docker(tmp_path)
    smoke = make("smoke", f"REGISTRY={registry}", f"IMAGE={NAME}", "TAG=x", "PREFLIGHT=0", env=env)
    built = "build " in docker_log.read_text()
    assert smoke.returncode != 0 and built == (status == 404), f"{status}: built={built}\n{smoke.stderr}"


def test_make_pull_from_an_unreachable_registry_says_so(docker_client):
    """make pull from a port nobody listens on should say the registry cannot be reached."""
    result = pull(f"127.0.0.1:{closed_port()}", "x")
    assert result.returncode != 0 and "cannot reach the registry 127.0.0.1:" in result.stderr, result.stderr


def closed_port():
    """A port that was free a moment ago and has no listener."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_pull_refuses_a_manifest_whose_digest_is_not_what_the_registry_claims(fake_registry,
                                                                                   docker_client):
    """A registry (or proxy) whose Docker-Content-Digest names other bytes than it sends: refused,
    nothing pulled or tagged."""
    registry = fake_registry(manifest=manifest(), claimed="sha256:" + "e" * 64)
    result = pull(registry, "x")
    assert result.returncode != 0 and "the registry says it is sha256:eeeeeeeeeeee" in result.stderr, result.stderr
    assert gone(docker_client, f"{registry}/{NAME}:x"), "something was tagged"


def test_make_pull_refuses_a_tag_that_is_not_the_pinned_digest(publish, docker_client):
    """make pull DIGEST=<another> should refuse before pulling: the tag moved or the pin is stale."""
    registry, tag, _ = publish()
    result = pull(registry, tag, "DIGEST=sha256:" + "1" * 64)
    assert result.returncode != 0 and "not the pinned DIGEST" in result.stderr, result.stderr
    assert gone(docker_client, f"{registry}/{NAME}:{tag}"), "a tag was made despite the refusal"


def test_make_pull_refuses_before_downloading_what_the_disk_cannot_hold(fake_registry, docker_client, tmp_path):
    """An image larger than the free space of Docker's disk: refused before docker pull runs."""
    registry = fake_registry(manifest=manifest(layer_size=10**15))
    docker_log, env = fake_docker(tmp_path)
    result = pull(registry, "x", env=env)
    assert result.returncode != 0 and "GB free in" in result.stderr and "docker image prune" in result.stderr, \
        result.stderr
    assert "pull " not in docker_log.read_text(), "docker pull ran anyway"


def test_a_disk_filling_up_during_the_pull_gets_one_line_and_no_tag(publish, docker_client, tmp_path):
    """docker pull failing with ENOSPC (a fake docker: this host's disk cannot be filled) should give
    the one line about the disk, and leave REF untagged."""
    registry, tag, _ = publish()
    _, env = fake_docker(tmp_path, pull_output="failed to register layer: write /var/lib/docker/tmp/x: "
                                                "no space left on device")
    result = pull(registry, tag, env=env)
    assert result.returncode != 0 and "the disk filled up during the pull" in result.stderr, result.stderr
    assert gone(docker_client, f"{registry}/{NAME}:{tag}"), "REF was tagged after a failed pull"


def test_make_pull_requires_the_signature_when_a_signer_is_configured(publish, docker_client, tmp_path):
    """SIGNER_IDENTITY set: without cosign, or with a signature cosign rejects, make pull refuses
    and tags nothing."""
    registry, tag, _ = publish()
    identity = "SIGNER_IDENTITY=https://github.com/acme/team-dl/.github/workflows/release.yml@refs/heads/main"
    no_cosign = pull(registry, tag, identity, env={"PATH": "/usr/bin:/bin"})
    assert no_cosign.returncode != 0 and "cosign is not installed" in no_cosign.stderr, no_cosign.stderr
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "cosign").write_text("#!/bin/sh\necho 'Error: no matching signatures' >&2\nexit 1\n")
    (fake / "cosign").chmod(0o755)
    rejected = pull(registry, tag, identity, env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert rejected.returncode != 0 and "is not signed by https://github.com/acme" in rejected.stderr, \
        rejected.stderr
    assert gone(docker_client, f"{registry}/{NAME}:{tag}"), "REF was tagged without a valid signature"


class SlowProxy(http.server.ThreadingHTTPServer):
    """A proxy in front of the real registry that sends blobs slowly while `slow` is set, and sets
    `started` once a slow blob transfer is under way: a pull that can be cut off halfway."""

    def __init__(self, upstream):
        self.upstream, self.slow, self.started = upstream, threading.Event(), threading.Event()
        super().__init__(("127.0.0.1", 0), ProxyHandler)


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        req = urllib.request.Request(f"http://{self.server.upstream}{self.path}", method=self.command,
                                     headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
        try:
            r = urllib.request.urlopen(req, timeout=30)
        except urllib.error.HTTPError as e:
            r = e
        self.send_response(r.status)
        for k, v in r.headers.items():
            if k.lower() not in ("connection", "transfer-encoding"):
                self.send_header(k, v)
        self.end_headers()
        slow = self.server.slow.is_set() and "/blobs/" in self.path and self.command == "GET"
        try:
            while chunk := r.read(64 * 1024):
                if slow:
                    self.server.started.set()
                    time.sleep(0.5)
                self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_a_pull_killed_halfway_leaves_no_tag_and_a_second_run_completes(publish, docker_client):
    """make pull stopped in the middle of a download should leave REF untagged; run again, it
    completes and tags REF."""
    upstream, tag, _ = publish(payload_size=8_000_000)
    proxy = SlowProxy(upstream)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    registry = f"127.0.0.1:{proxy.server_address[1]}"
    try:
        proxy.slow.set()
        env = {k: v for k, v in os.environ.items() if k not in LEAKY}
        first = subprocess.Popen(["make", "-s", "-C", str(ROOT), "pull", f"REGISTRY={registry}", f"IMAGE={NAME}",
                                  f"TAG={tag}", "DOCKER=/usr/bin/docker"], env=env, start_new_session=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proxy.started.wait(60), "the download never started"
        os.killpg(first.pid, signal.SIGTERM)
        out = first.communicate(timeout=60)[0]
        assert first.returncode != 0, f"the pull was not stopped:\n{out}"
        assert gone(docker_client, f"{registry}/{NAME}:{tag}"), f"a pull cut off halfway left REF tagged:\n{out}"
        proxy.slow.clear()
        again = pull(registry, tag)
        assert again.returncode == 0, f"the second run did not complete:\n{again.stderr}"
        assert not gone(docker_client, f"{registry}/{NAME}:{tag}"), "REF is not tagged after the second run"
    finally:
        proxy.shutdown()


def test_run_preflight_with_a_registry_does_not_ask_for_the_base(tmp_path):
    """make run with REGISTRY set pulls a missing image, so its preflight must not stop for a
    missing base (make build checks that itself, if the registry has none)."""
    args = ["python3", "scripts/doctor.py", "preflight", "--for", "run", "--image", f"{NAME}:absent",
            "--base", "team-dl-no-such-base:1", "--registry-probe", "http://127.0.0.1:9/v2/",
            "--port", f"PORT_JUPYTER={closed_port()}", "--port", f"PORT_SSH={closed_port()}",
            "--workspace", str(tmp_path)]
    os.chown(tmp_path, 1000, 1000)  # the container's user's WORKSPACE (a root-owned one is a FAIL of its own)
    plain = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    assert plain.returncode != 0 and "base image" in plain.stdout + plain.stderr, plain.stdout
    pulls = subprocess.run([*args, "--pull-first"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert pulls.returncode == 0, f"preflight stopped a pulling make run:\n{pulls.stdout}{pulls.stderr}"


def test_make_run_with_a_registry_pulls_and_starts_with_no_build_base_here(publish, docker_client, tmp_path):
    """make run REGISTRY=... on a host without the build base (an unreachable one here) and without
    the image: the pre-flight lets it through, make run pulls the published tag and starts it."""
    registry, tag, _ = publish()
    name = f"{NAME}-run-{uuid.uuid4().hex[:6]}"
    workspace = tmp_path / "workspace"  # the container's user's (a root-owned one stops make run)
    workspace.mkdir()
    os.chown(workspace, 1000, 1000)
    try:
        result = make("run", f"REGISTRY={registry}", f"IMAGE={NAME}", f"TAG={tag}", f"CONTAINER={name}",
                      f"BASE_IMAGE=127.0.0.1:{closed_port()}/no-such-base:1", f"PORT_JUPYTER={closed_port()}",
                      f"PORT_SSH={closed_port()}", "DETACH=0", f"WORKSPACE={workspace}")
        out = result.stdout + result.stderr
        assert result.returncode == 0 and "tini version" in out, f"make run did not pull and start:\n{out}"
        assert not gone(docker_client, f"{registry}/{NAME}:{tag}"), "make run did not pull the image"
    finally:
        subprocess.run(["/usr/bin/docker", "rm", "-f", name], capture_output=True, check=False)
        subprocess.run(["/usr/bin/docker", "volume", "rm", f"{name}-ssh-hostkeys"], capture_output=True, check=False)
