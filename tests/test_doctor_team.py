"""make doctor and make run's pre-flight with REGISTRY set check what a team member needs instead
of the build base: the registry answers and has the tag (for which platforms), the SSH key, a
WORKSPACE the container's user can write (root-owned: the one host step), the ports. Host-side:
a fake docker (test_doctor's), a fake registry on 127.0.0.1, keys in a temporary HOME."""
import hashlib
import http.server
import json
import os
import subprocess
import threading

import doctor  # scripts/, which conftest puts on sys.path
import pytest
from test_doctor import IMAGE, FakeHost, table
from test_publish import LEAKY, ROOT

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

INDEX = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
         "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
                        "digest": "sha256:" + "a" * 64, "platform": {"os": "linux", "architecture": a}}
                       for a in ("amd64", "arm64")]}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if not self.path.endswith("/manifests/published"):
            self.send_response(404 if self.path != "/v2/" else 200)
            self.end_headers()
            return
        body = json.dumps(INDEX).encode()
        self.send_response(200)
        self.send_header("Content-Type", INDEX["mediaType"])
        self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(body).hexdigest())
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def registry():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def host(tmp_path):
    h = FakeHost(tmp_path)
    h.state["images"] = []  # neither the image nor any base here: a fresh team member's host
    return h


def make(host, target, *args, home):
    env = {k: v for k, v in os.environ.items() if k not in (*LEAKY, "SSH_AUTH_SOCK", "PUBLIC_KEY")}
    env.update({"DOCKER": str(host.docker), "NVIDIA_SMI": str(host.smi), "HOME": str(home)})
    host.save()
    r = subprocess.run(["make", "-s", "-C", str(ROOT), target, f"PORT_JUPYTER={host.ports[0]}",
                        f"PORT_SSH={host.ports[1]}", f"IMAGE={IMAGE.split(':')[0]}", *args],
                       capture_output=True, text=True, env=env, check=False, timeout=120)
    return r.returncode, r.stdout + r.stderr


def home_with_key(tmp_path, key=True):
    home = tmp_path / ("home-key" if key else "home-nokey")
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    if key:
        (home / ".ssh" / "id_ed25519.pub").write_text("ssh-ed25519 " + "A" * 68 + " you@laptop\n")
    return home


def user_workspace(tmp_path):
    """A WORKSPACE owned by a user other than root, as make run's container can write it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    return ws


def test_make_doctor_with_registry_checks_the_registry_the_tag_and_its_platforms(host, registry, tmp_path):
    """make doctor REGISTRY=... TAG=<published>: a registry row naming the platforms, no base row."""
    _, out = make(host, "doctor", f"REGISTRY={registry}", "TAG=published", f"WORKSPACE={user_workspace(tmp_path)}",
                   home=home_with_key(tmp_path))
    rows = table(out)
    assert "registry" in rows and rows["registry"][0] == "OK", out
    assert "linux/amd64" in rows["registry"][1] and "linux/arm64" in rows["registry"][1], out
    assert "base image" not in rows, out


def test_make_doctor_with_registry_says_the_tag_is_not_published(host, registry, tmp_path):
    """A tag the registry does not have: FAIL, saying so, before any pull."""
    rc, out = make(host, "doctor", f"REGISTRY={registry}", "TAG=absent", f"WORKSPACE={user_workspace(tmp_path)}",
                   home=home_with_key(tmp_path))
    rows = table(out)
    assert rc != 0 and rows.get("registry", [""])[0] == "FAIL" and "not published" in out, out


def test_make_doctor_with_registry_names_the_ssh_key_or_how_to_make_one(host, registry, tmp_path):
    """The key make run would hand the container, or a WARN with ssh-keygen."""
    ws = user_workspace(tmp_path)
    _, out = make(host, "doctor", f"REGISTRY={registry}", "TAG=published", f"WORKSPACE={ws}",
                  home=home_with_key(tmp_path))
    assert table(out)["ssh key"][0] == "OK" and "id_ed25519.pub" in out, out
    _, out = make(host, "doctor", f"REGISTRY={registry}", "TAG=published", f"WORKSPACE={ws}",
                  home=home_with_key(tmp_path, key=False))
    assert table(out)["ssh key"][0] == "WARN" and "ssh-keygen -t ed25519" in out, out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: WORKSPACE owned by root stands for root's checkout")
def test_make_run_stops_before_the_pull_on_a_root_owned_workspace_with_the_host_step(host, registry, tmp_path):
    """WORKSPACE owned by root (a root's checkout, mode 755): make run's pre-flight stops before the
    pull with the one host step (setfacl for the container's UID 1000); make doctor names it too."""
    ws = tmp_path / "rootws"
    ws.mkdir(mode=0o755)
    rc, out = make(host, "run", f"REGISTRY={registry}", "TAG=published", f"WORKSPACE={ws}",
                   home=home_with_key(tmp_path))
    assert rc != 0 and "setfacl -R -m u:1000:rwX -m d:u:1000:rwX" in out, out
    assert not [c for c in host.calls() if c[:1] in (["pull"], ["run"])], host.calls()
    _, out = make(host, "doctor", f"REGISTRY={registry}", "TAG=published", f"WORKSPACE={ws}",
                  home=home_with_key(tmp_path))
    assert table(out)["workspace"][0] == "FAIL", out


def test_make_doctor_with_registry_judges_the_disk_by_what_a_pull_needs(host, registry, tmp_path):
    """make doctor REGISTRY=... with the image not here: the disk row weighs the pull a member's make
    run does (the image unpacked, its download beside it), not a 17 GB build no member runs."""
    _, out = make(host, "doctor", f"REGISTRY={registry}", "TAG=published", f"WORKSPACE={user_workspace(tmp_path)}",
                  home=home_with_key(tmp_path))
    row = table(out)["disk"][1]
    assert f"a pull needs ~{doctor.gb(doctor.PULL_DISK_BYTES)}" in row, out
    assert "build" not in row, out
