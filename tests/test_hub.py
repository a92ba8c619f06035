"""JupyterHub-ready: a real JupyterHub (pip jupyterhub + dockerspawner in the test venv,
configurable-http-proxy from npm, the shared-password authenticator) spawns the image as a
single-user server, and its Lab API answers through the hub's proxy. The hub, its proxy, the
spawned containers and their network are always cleaned up."""
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
from conftest import ROOT, stop_process, wait_for_server
from test_jupyter import run_in_kernel

CHP = ROOT / ".venv-test" / "npm" / "node_modules" / ".bin" / "configurable-http-proxy"
TIMEOUT = 30


def pinned_jupyterhub():
    """The jupyterhub version docker/build/requirements.txt pins: the one place it is declared."""
    text = (ROOT / "docker" / "build" / "requirements.txt").read_text()
    m = re.search(r"^jupyterhub==([\w.]+)", text, re.MULTILINE)
    assert m, "docker/build/requirements.txt should pin jupyterhub==X (the hub's version)"
    return m.group(1)


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def test_image_and_test_hub_run_the_pinned_jupyterhub(run_in_image):
    """The image's jupyterhub-singleuser and the hub the tests run should be the pinned version:
    the single-user server and the hub talk one API."""
    import jupyterhub

    pinned = pinned_jupyterhub()
    assert jupyterhub.__version__ == pinned, \
        f"the test venv's jupyterhub is {jupyterhub.__version__}, the pin is {pinned}: make test-deps"
    probe = "command -v jupyterhub-singleuser && python3 -c 'import jupyterhub; print(\"JH\", jupyterhub.__version__)'"
    code, out = run_in_image(["bash", "-c", probe])
    assert code == 0, f"jupyterhub-singleuser should be in the image:\n{out}"
    assert f"JH {pinned}" in out, f"the image's jupyterhub should be {pinned}:\n{out}"


HUB_CONFIG = """
import json, os
cfg = json.loads(os.environ["TEST_HUB"])
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = cfg["port"]
# The hub's API must be reachable from the spawned container: the network's gateway (this host).
c.JupyterHub.hub_ip = cfg["gateway"]
c.JupyterHub.hub_port = cfg["hub_port"]
c.JupyterHub.db_url = "sqlite:///" + cfg["dir"] + "/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = cfg["dir"] + "/cookie_secret"
c.ConfigurableHTTPProxy.command = [cfg["chp"]]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:%d" % cfg["proxy_api_port"]
c.ConfigurableHTTPProxy.pid_file = cfg["dir"] + "/proxy.pid"
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = cfg["password"]
c.Authenticator.allow_all = True
# A service token for the test: create users, start their servers, reach them.
c.JupyterHub.services = [{"name": "test", "api_token": cfg["api_token"]}]
c.JupyterHub.load_roles = [{"name": "test", "services": ["test"],
                            "scopes": ["admin:users", "admin:servers", "access:servers"]}]
c.JupyterHub.spawner_class = "docker"
c.DockerSpawner.image = cfg["image"]
# DockerSpawner's default command is the image's CMD, and this image has none (without a command
# the entrypoint starts its own token-authenticated JupyterLab): name the single-user server, as
# KubeSpawner and Zero to JupyterHub do by default (docs/container.md: JupyterHub).
c.DockerSpawner.cmd = ["jupyterhub-singleuser"]
c.DockerSpawner.network_name = cfg["network"]
c.DockerSpawner.name_template = cfg["prefix"] + "-{username}"
c.DockerSpawner.remove = True
c.DockerSpawner.extra_host_config = {"shm_size": "1g"}
# As KubeSpawner starts it with a securityContext (runAsUser), when the test asks for it.
if cfg["user"]:
    c.DockerSpawner.extra_create_kwargs = {"user": cfg["user"]}
c.Spawner.start_timeout = 240
c.Spawner.http_timeout = 240
"""


@pytest.fixture(params=[None, "1000:1000"], ids=["started-as-root", "started-as-uid-1000"])
def hub(request, docker_client, image_ref, docker_network, tmp_path):
    """A running JupyterHub spawning image_ref with DockerSpawner on docker_network, the
    container started as root (DockerSpawner's default: the entrypoint maps and drops to dev) or
    as UID 1000 (a KubeSpawner securityContext's runAsUser). Yields {url: the hub's public URL,
    token: the test service's API token, log: the hub's log file, prefix: of container names}. Stops the hub (it stops its servers and proxy) and
    removes whatever is left: containers (docker_network's teardown), the proxy by its pid."""
    if not CHP.exists():
        pytest.fail(f"configurable-http-proxy is missing ({CHP}): make test-deps")
    docker_network.reload()
    gateway = docker_network.attrs["IPAM"]["Config"][0]["Gateway"]
    cfg = {"port": free_port(), "hub_port": free_port(gateway), "proxy_api_port": free_port(),
           "gateway": gateway, "dir": str(tmp_path), "chp": str(CHP), "image": image_ref,
           "network": docker_network.name, "prefix": f"test-hub-{secrets.token_hex(4)}",
           "password": secrets.token_hex(16), "api_token": secrets.token_hex(32),
           "user": request.param}
    (tmp_path / "jupyterhub_config.py").write_text(HUB_CONFIG)
    log_path = tmp_path / "hub.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed after the process ends
    env = dict(os.environ, TEST_HUB=json.dumps(cfg),
               PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "jupyterhub"),
                             "-f", str(tmp_path / "jupyterhub_config.py")],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{cfg['port']}"
    try:
        wait_for_server(proc, f"{url}/hub/api", log_path, 90, "JupyterHub")
        yield {"url": url, "token": cfg["api_token"], "log": log_path, "prefix": cfg["prefix"]}
    finally:
        stop_process(proc, timeout=60)  # SIGTERM: the hub stops the servers it spawned and its proxy
        log.close()
        pid_file = tmp_path / "proxy.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        # Spawned containers still there are on docker_network: its teardown removes them.


def test_hub_spawns_the_image_and_its_lab_api_answers_through_the_proxy(hub, docker_client):
    """A real JupyterHub should spawn the image as a single-user server whose Lab API and kernels
    answer through the hub's proxy, as the non-root user, with the hub's auth (not none),
    whether the spawner starts the container as root or as the user."""
    url, api_token, log_path = hub["url"], hub["token"], hub["log"]
    auth = {"Authorization": f"token {api_token}"}
    r = requests.post(f"{url}/hub/api/users/alice", headers=auth, timeout=TIMEOUT)
    assert r.status_code == 201, f"creating the user should be 201, got {r.status_code}: {r.text}"
    r = requests.post(f"{url}/hub/api/users/alice/server", headers=auth, timeout=TIMEOUT)
    assert r.status_code in (201, 202), \
        f"starting the server should be accepted, got {r.status_code}: {r.text}\n{log_path.read_text()[-6000:]}"

    # Pending while the container starts; gone from "servers" when the spawn failed.
    start = time.monotonic()
    while True:
        user = requests.get(f"{url}/hub/api/users/alice", headers=auth, timeout=TIMEOUT).json()
        server = user.get("servers", {}).get("", {})
        if server.get("ready"):
            break
        elapsed = time.monotonic() - start
        if (not server and elapsed > 5) or elapsed > 300:
            pytest.fail(f"the server did not become ready: {user}\n{log_path.read_text()[-6000:]}")
        time.sleep(1)
    prefix = server["url"]  # /user/alice/

    base = url + prefix.rstrip("/")
    r = requests.get(f"{base}/api/status", headers=auth, timeout=TIMEOUT)
    assert r.status_code == 200, f"the Lab API through the hub's proxy should answer 200, got {r.status_code}"
    r = requests.get(f"{base}/lab", headers=auth, timeout=TIMEOUT)
    assert r.status_code == 200 and "JupyterLab" in r.text, f"/lab through the hub should be Lab, got {r.status_code}"
    r = requests.get(f"{base}/api/contents", timeout=TIMEOUT, allow_redirects=False)
    assert r.status_code in (302, 403), f"the server without the hub's auth should refuse, got {r.status_code}"

    out = run_in_kernel(base, api_token, "import os, pwd; print('WHO', pwd.getpwuid(os.getuid()).pw_name, os.getuid())")
    assert "WHO dev 1000" in out, f"the kernel should run as dev (UID 1000), printed {out!r}"
    # The extras ride along (their config is read by jupyterhub-singleuser too).
    r = requests.get(f"{base}/nvdashboard/accelerators/check", headers=auth, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["has_gpu"] is False, f"nvdashboard through the hub: {r.status_code}"
    r = requests.get(f"{base}/server-proxy/servers-info", headers=auth, timeout=TIMEOUT)
    assert r.status_code == 200 and [s["name"] for s in r.json()["server_processes"]] == ["tensorboard"], \
        f"the TensorBoard launcher entry through the hub: {r.status_code} {r.text[:300]}"

    # The server's own hub token (the spawner's env) and the test's never reach its logs.
    container = docker_client.containers.get(hub["prefix"] + "-alice")
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    logs = container.logs().decode(errors="replace")
    assert re.search(r"^INFO .*Executing: jupyterhub-singleuser", logs, re.MULTILINE), \
        f"the entrypoint should have run the spawner's command:\n{logs}"
    for secret in (env["JUPYTERHUB_API_TOKEN"], api_token):
        assert secret not in logs, f"a hub token reached the spawned server's logs:\n{logs}"
