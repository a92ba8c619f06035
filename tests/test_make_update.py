"""Updates reach a team member: with REGISTRY, make run/shell/smoke/pull/doctor follow the row's
moving tag (the weekly rebuild moves it), make run says in one line when the registry has a newer
image than the one here, and make pull says when make run's container still runs the old one.
Host-side: a fake registry on 127.0.0.1 and a fake docker."""
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import build_info
import pytest
import versions
from test_publish import LEAKY, ROOT

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

SCRIPT = ROOT / "scripts" / "update_check.py"
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": []}).encode()
PUBLISHED = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


def make(*args, env=None):
    run_env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    run_env.update(env or {})
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True,
                          env=run_env, check=False, timeout=120)


def moving_tag():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_info.py"), "moving-tags"],
                       capture_output=True, text=True, check=True)
    return r.stdout.split()[0]


def test_with_a_registry_the_team_targets_follow_the_rows_moving_tag():
    """REGISTRY set, TAG not given: make run/pull use the row's moving tag (what the weekly rebuild
    moves); TAG=... and BUILD=1 and the publishing targets keep the descriptive tag."""
    tag, descriptive = moving_tag(), build_info.tag(versions.row())
    reg = "registry.example/team"
    for target in ("run", "pull", "smoke"):
        out = make("-n", target, f"REGISTRY={reg}", env={"DOCKER": "/bin/false"}).stdout
        assert f"'{reg}/team-dl:{tag}'" in out, f"make {target} does not follow {tag}:\n{out}"
    assert f"'{reg}/team-dl:t1'" in make("-n", "pull", f"REGISTRY={reg}", "TAG=t1", env={"DOCKER": "/bin/false"}).stdout
    for target, extra in (("run", ["BUILD=1"]), ("push", []), ("build", [])):
        out = make("-n", target, f"REGISTRY={reg}", "PREFLIGHT=0", *extra, env={"DOCKER": "/bin/false"}).stdout
        assert f"{reg}/team-dl:{descriptive}" in out, f"make {target} {extra} left the descriptive tag:\n{out}"


class Registry(http.server.BaseHTTPRequestHandler):
    delay = 0

    def do_GET(self):
        time.sleep(self.delay)
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.index.v1+json")
        self.send_header("Docker-Content-Digest", PUBLISHED)
        self.end_headers()
        self.wfile.write(MANIFEST)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def registry():
    servers = []

    def start(delay=0):
        handler = type("H", (Registry,), {"delay": delay})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_address[1]}"
    yield start
    for s in servers:
        s.shutdown()


def fake_docker(tmp_path, repo_digests, running_image=None, image_id="sha256:new"):
    script = tmp_path / "docker"
    script.write_text(f"""#!{sys.executable}
import json, sys
a = sys.argv[1:]
if a[:2] == ["image", "inspect"]:
    print(json.dumps([{{"Id": {image_id!r}, "RepoDigests": {repo_digests!r}}}])); sys.exit(0)
if a[:2] == ["container", "inspect"]:
    if {running_image!r} is None: sys.exit(1)
    print(json.dumps([{{"Image": {running_image!r}, "State": {{"Running": True}}}}])); sys.exit(0)
sys.exit(1)
""")
    script.chmod(0o755)
    return str(script)


def check(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_make_run_says_when_a_newer_image_is_published(registry, tmp_path):
    """The registry's digest for the tag is not the one here: one line, with make pull."""
    reg = registry()
    docker = fake_docker(tmp_path, [f"{reg}/team-dl@sha256:" + "1" * 64])
    r = check("newer", "--docker", docker, "--ref", f"{reg}/team-dl:2.6")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 0 and len(lines) == 1 and "newer" in lines[0] and "make pull" in lines[0], r.stderr


def test_make_run_is_silent_when_the_image_is_the_published_one(registry, tmp_path):
    reg = registry()
    docker = fake_docker(tmp_path, [f"{reg}/team-dl@{PUBLISHED}"])
    r = check("newer", "--docker", docker, "--ref", f"{reg}/team-dl:2.6")
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_a_slow_registry_does_not_hold_make_run_up(registry, tmp_path):
    """A registry slower than the short timeout: make run goes on, silent, within seconds."""
    reg = registry(delay=10)
    docker = fake_docker(tmp_path, [f"{reg}/team-dl@sha256:" + "1" * 64])
    start = time.monotonic()
    r = check("newer", "--docker", docker, "--ref", f"{reg}/team-dl:2.6")
    assert r.returncode == 0 and time.monotonic() - start < 8, (time.monotonic() - start, r.stderr)


def test_make_pull_says_the_running_container_still_uses_the_old_image(tmp_path):
    """After a pull, make run's container still runs the image from before: say so and how to take it."""
    docker = fake_docker(tmp_path, [], running_image="sha256:old", image_id="sha256:new")
    r = check("running", "--docker", docker, "--ref", "r/team-dl:2.6", "--container", "team-dl-x")
    assert "team-dl-x" in r.stderr and "make stop" in r.stderr and "make run" in r.stderr, r.stderr
    same = fake_docker(tmp_path, [], running_image="sha256:new", image_id="sha256:new")
    assert not check("running", "--docker", same, "--ref", "r/team-dl:2.6", "--container", "team-dl-x").stderr.strip()
