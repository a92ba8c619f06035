"""Fakes for the host tests of make pull/push's inputs (tests/test_pull_inputs.py): a registry
that speaks HTTP or HTTPS (a self-signed certificate), answers late or not at all, and records
what it was asked; and a docker client that answers what scripts/pull.py asks, from a state file.
Nothing here starts a container or talks to the Docker daemon.
"""
import hashlib
import http.server
import json
import ssl
import subprocess
import sys
import threading
import time

MEDIA = "application/vnd.docker.distribution.manifest.v2+json"


def manifest(layer_size=1000):
    return {"schemaVersion": 2, "mediaType": MEDIA,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 2,
                       "digest": "sha256:" + "c" * 64},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                        "size": layer_size, "digest": "sha256:" + "d" * 64}]}


def body_digest(body):
    return "sha256:" + hashlib.sha256(body).hexdigest()


class Registry(http.server.ThreadingHTTPServer):
    """Serves one manifest for every /v2/.../manifests/... (or `status`), after `delay` seconds;
    `requests` lists (scheme, path) of what arrived. With cert (a (certfile, keyfile) pair) it
    speaks TLS only, as a registry behind `ssh -L` does."""

    def __init__(self, host="127.0.0.1", cert=None, status=200, delay=0.0):
        self.status, self.delay, self.requests = status, delay, []
        self.body = json.dumps(manifest()).encode()
        self.digest = body_digest(self.body)
        self.tls = cert is not None
        super().__init__((host, 0), Handler)
        if cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*cert)
            self.socket = ctx.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    @property
    def address(self):
        return f"{self.server_address[0]}:{self.server_address[1]}"

    def start(self):
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def handle_error(self, request, client_address):
        pass  # a plain-HTTP client on the TLS port, or the client going away: not the test's business


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        s = self.server
        s.requests.append(("https" if s.tls else "http", self.path))
        time.sleep(s.delay)
        if s.status != 200 or "/manifests/" not in self.path:
            self.send_response(s.status if s.status != 200 else 404)
            if s.status == 401:  # ask for the stored login, as a registry with htpasswd does
                self.send_header("WWW-Authenticate", 'Basic realm="fake"')
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", MEDIA)
        self.send_header("Docker-Content-Digest", s.digest)
        self.send_header("Content-Length", str(len(s.body)))
        self.end_headers()
        self.wfile.write(s.body)

    def log_message(self, *args):
        pass


def self_signed(tmp_path, host="127.0.0.1"):
    """(certfile, keyfile) of a fresh self-signed certificate for host (openssl, 1 s)."""
    cert, key = tmp_path / "registry.crt", tmp_path / "registry.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={host}",
                    "-addext", f"subjectAltName=IP:{host}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


# A docker client for pull.py: `pull NAME@DIGEST` "downloads" (records it), `image inspect`
# answers for what was pulled (with the labels in state["labels"]), `tag` records, `info`
# answers DockerRootDir and RegistryConfig from state. Every call is logged.
FAKE_DOCKER = r'''#!PYTHON
import json, pathlib, sys
here = pathlib.Path(sys.argv[0]).resolve().parent
state_file = here / "docker-state.json"
state = json.loads(state_file.read_text())
args = sys.argv[1:]
with open(here / "docker-calls.log", "a") as log:
    log.write(json.dumps(args) + "\n")
def out(text="", rc=0):
    sys.stdout.write(text); sys.exit(rc)
if args[0] == "version":
    out(state.get("server", "24.0.7") + "\n")
if args[0] == "info":
    fmt = args[-1]
    if "RegistryConfig" in fmt:
        out(json.dumps(state.get("registry_config", {"InsecureRegistryCIDRs": ["127.0.0.0/8"], "IndexConfigs": {}})) + "\n")
    out(str(here) + "\n")
if args[0] == "pull":
    state["pulled"] = args[-1]
    state_file.write_text(json.dumps(state))
    out("done\n")
if args[:2] == ["image", "inspect"]:
    ref = args[-1]
    if state.get("pulled") and ref in (state["pulled"], state.get("tagged")):
        out(json.dumps([{"Id": "sha256:" + "f" * 64, "RepoDigests": [state["pulled"]],
                         "Config": {"Labels": state.get("labels", {})}}]) + "\n")
    sys.stderr.write("Error: No such image: " + ref + "\n"); sys.exit(1)
if args[0] == "tag":
    state["tagged"] = args[-1]
    state_file.write_text(json.dumps(state))
    out()
sys.stderr.write("fake docker: unexpected " + " ".join(args) + "\n"); sys.exit(1)
'''


class Docker:
    """The fake docker in tmp_path: .path to hand make as DOCKER, .calls() what it was asked."""

    def __init__(self, tmp_path, **state):
        self.dir = tmp_path
        self.path = tmp_path / "docker"
        self.path.write_text(FAKE_DOCKER.replace("PYTHON", sys.executable, 1))
        self.path.chmod(0o755)
        (tmp_path / "docker-state.json").write_text(json.dumps(state))

    def calls(self):
        log = self.dir / "docker-calls.log"
        return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []

    def tagged(self):
        return json.loads((self.dir / "docker-state.json").read_text()).get("tagged")
