"""Shared fixtures for the host-side suite: every test gets fresh containers of IMAGE_REF
(set by `make test`), started through the Docker SDK and always removed afterwards."""
import contextlib
import http.server
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pace  # tests/pace.py
import pytest
import requests

import docker

ROOT = pathlib.Path(__file__).resolve().parent.parent
# scripts/ is no package: tests import its modules (build_info, versions, generate) by name.
sys.path.insert(0, str(ROOT / "scripts"))
ARTIFACTS = ROOT / "artifacts"
# The SSH fixtures (key, the shared sshd) for every file that logs in over SSH.
pytest_plugins = ("ssh_client", "slurm_cluster", "progress")


@pytest.fixture(autouse=True)
def own_local_mk(tmp_path_factory, monkeypatch):
    """Every make a test runs reads and writes its remembered settings (make run/pull
    REGISTRY=...: scripts/local_config.py) in a file of that test's own, never the checkout's
    local.mk: a developer's remembered REGISTRY would change what the tests' make does, and a
    test's would change the developer's and the next test's."""
    monkeypatch.setenv("LOCAL_MK", str(tmp_path_factory.mktemp("local-mk") / "local.mk"))


def require_tool(command, package):
    """The path of a host tool a test needs; missing, the test fails naming its Debian package and
    `make host-setup` (which `make test` runs first: scripts/host_setup.py installs it)."""
    path = shutil.which(command) or shutil.which(command, path="/usr/local/sbin:/usr/sbin:/sbin")
    if not path:
        pytest.fail(f"{command} is not installed: make host-setup installs it "
                    f"(or: apt-get install {package})")
    return path


def pytest_configure(config):
    # make test runs `-m 'not slow'` (PYTEST_MARKS); make test-slow runs the slow ones, and
    # .ci/run runs the host ones in a second pytest beside the rest (docs/testing.md).
    config.addinivalue_line("markers", "slow: takes minutes and guards what rarely breaks: left "
                            "out of make test and .ci/run; make test-slow (weekly in CI) runs it")
    config.addinivalue_line("markers", "host: starts no container and builds no image (files, "
                            "scripts and fakes only): .ci/run runs these beside the container tests")


# The files that take minutes (.ci/run's per-file table), longest first. .ci/run's container
# tests run in two pytest-xdist workers a file at a time (--dist loadfile): these start first, so
# the run never ends on one long file running alone while the other worker idles.
LONG_FILES = ("test_train_amp_flags.py", "test_slurm.py", "test_train_amp_checkpoint.py", "test_cluster.py",
              "test_lifecycle.py", "test_image.py", "test_smoke.py", "test_train_amp_data.py",
              "test_train_amp_compare.py", "test_repro.py", "test_train_amp_resume.py",
              "test_train_amp_bench.py")


def pytest_collection_modifyitems(items):
    """A test marked host runs beside the container tests in .ci/run: it must not use Docker.
    The LONG_FILES run first (a stable sort: each file's tests keep their order)."""
    for item in items:
        docker = {"docker_client", "image_ref"} & set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("host") and docker:
            raise pytest.UsageError(f"{item.nodeid} is marked host but uses {sorted(docker)}: "
                                    "drop the host mark (its file's pytestmark)")
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def docker_client():
    # The API's read timeout guards a hang too: stretched (a pyxis test's call timed out at load 38).
    client = docker.from_env(timeout=round(300 * SLOWDOWN))
    client.ping()
    return client


@pytest.fixture(scope="session")
def image_ref():
    ref = os.environ.get("IMAGE_REF")
    if not ref:
        pytest.exit("IMAGE_REF is not set: run the suite with `make test`", returncode=2)
    return ref


@pytest.fixture(scope="session")
def image(docker_client, image_ref):
    return docker_client.images.get(image_ref)


@pytest.fixture(scope="session")
def artifacts():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


# Another CPU's image under QEMU (make arm64-emulated): the CPU model every container emulates
# (QEMU reads QEMU_CPU from the emulated process's environment), and how many times longer a
# command may take there than the timeouts written for this host's CPU.
QEMU_CPU = os.environ.get("TEAM_TEST_QEMU_CPU", "")
# ... times this machine's pace now (tests/pace.py: a busy or slower machine gets longer), so a
# timeout guards a hang, never a speed. Measured once: the pytest processes started beside this
# one (xdist's workers) inherit it.
PACE = pace.factor()
os.environ["TEAM_TEST_PACE"] = f"{PACE:.2f}"
# Under pytest-xdist the workers share the CPU with each other, a load the pace measured before
# they started cannot show: each worker's guards are stretched by their number too.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
SLOWDOWN = float(os.environ.get("TEAM_TEST_SLOWDOWN") or 1) * PACE * WORKERS


# torch's default is one OpenMP thread per core in every container. Under xdist, as many workers
# as cores each run a container: the threads oversubscribe the cores, and OpenMP's waiting threads
# spin on CPU the other worker needs (a 4-step CPU training run at load ~25: 261 s with the default
# 2 threads, 18 s with 1). Then each test container gets one thread (OMP_NUM_THREADS=1, the
# value torchrun sets for its processes too) unless the test sets its own.
CONTAINER_ENV = {"OMP_NUM_THREADS": "1"} if WORKERS > 1 and WORKERS >= (os.cpu_count() or 1) else {}


def with_container_env(kwargs):
    """run() keyword arguments with CONTAINER_ENV and QEMU_CPU added under the test's own."""
    extra = {**CONTAINER_ENV, **({"QEMU_CPU": QEMU_CPU} if QEMU_CPU else {})}
    if extra:
        env = kwargs.get("environment") or {}
        env = dict(env) if isinstance(env, dict) else dict(e.split("=", 1) for e in env)
        kwargs = {**kwargs, "environment": {**extra, **env}}
    return kwargs


def pytest_report_header(config):
    workers = getattr(config.option, "numprocesses", None)
    each = f", times {workers} in each of the {workers} xdist workers" if isinstance(workers, int) and workers > 1 else ""
    return f"hang guards: {SLOWDOWN:.2f}x their written timeouts{each} (TEAM_TEST_PACE {PACE:.2f}: tests/pace.py)"


@pytest.fixture
def start_container(docker_client, image_ref):
    """Factory: start_container(command=None, **run_kwargs) -> a detached, running container.
    Every container it starts is force-removed when the test ends, pass or fail."""
    started = []

    def start(command=None, **kwargs):
        kwargs.setdefault("detach", True)
        kwargs.setdefault("shm_size", "1g")
        kwargs = with_container_env(kwargs)
        c = docker_client.containers.run(kwargs.pop("image", image_ref), command, **kwargs)
        started.append(c)
        return c

    yield start
    remove_containers(started)


def remove_containers(containers):
    """Force-remove containers (and their anonymous volumes); already gone is fine."""
    for c in containers:
        try:
            c.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass


def remove_image(ref):
    """Remove an image a test built, with the containers made from it first (a test's
    containers live until its teardown, and an image in use is not removed: `docker image rm`
    failed quietly and left team-dl-mirrortest:keep and untagged copies behind after green CI runs).
    Already gone is fine; still there afterwards fails the test."""
    client = docker.from_env()
    try:
        remove_containers(client.containers.list(all=True, filters={"ancestor": ref}))
        client.images.remove(ref, force=True)
    except docker.errors.ImageNotFound:
        return
    assert not client.images.list(name=ref), f"{ref} is still there after its removal"


@pytest.fixture(scope="module")
def module_containers(docker_client):
    """Containers started by module-scoped fixtures; all force-removed after the module."""
    started = []
    yield started
    remove_containers(started)


@pytest.fixture
def run_in_image(start_container):
    """Run a command to completion in a fresh container: returns (exit_code, output)."""

    def run(command, timeout=300, **kwargs):
        timeout *= SLOWDOWN
        c = start_container(command, **kwargs)
        try:
            result = c.wait(timeout=timeout)
        except requests.exceptions.RequestException as e:  # the SDK's read timeout
            logs = c.logs().decode(errors="replace")
            # Removed now (start_container would at teardown), so a hung command stops using
            # the CPU before the next test starts.
            remove_containers([c])
            pytest.fail(f"{command!r} did not finish within {timeout}s ({e.__class__.__name__}):\n{logs[-6000:]}")
        return result["StatusCode"], c.logs().decode(errors="replace")

    return run


def wait_until(predicate, timeout, message, interval=0.25):
    """Poll `predicate` until it returns a truthy value (returned), or fail with `message` (a
    string, or a function giving one, e.g. with the logs of that moment) after `timeout` s.
    The one wait loop of the suite: `predicate` may itself pytest.fail to stop early. `timeout`
    is the quiet machine's: it is stretched by SLOWDOWN (tests/pace.py)."""
    timeout *= SLOWDOWN
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(message() if callable(message) else message)
        time.sleep(interval)


def wait_for_server(proc, url, log_path, timeout, what):
    """Wait until GET `url` (a string, or a function giving one or None while unknown) answers
    200 from the process `proc` started; fail with the tail of its log when it exits first or
    does not answer within `timeout` s. For the real servers the tests start (registry, PyPI,
    JupyterHub)."""
    def answers():
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}:\n{log_path.read_text()[-6000:]}")
        target = url() if callable(url) else url
        try:
            return bool(target) and requests.get(target, timeout=2).status_code == 200
        except requests.ConnectionError:
            return False
    wait_until(answers, timeout, lambda: f"{what} did not start:\n{log_path.read_text()[-6000:]}",
               interval=0.2)


def stop_process(proc, timeout=10, sig=signal.SIGTERM):
    """Stop a server the tests started: `sig`, then SIGKILL (its whole session when it has one)
    if it is still there after `timeout` s."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (PermissionError, ProcessLookupError):
            proc.kill()
        proc.wait()


def _logs(container):
    return container.logs().decode(errors="replace")


def _fail_if_stopped(container, waiting_for):
    container.reload()
    if container.status in ("exited", "dead"):
        pytest.fail(f"container {container.status} before {waiting_for}:\n{_logs(container)}")


def wait_for_log(container, pattern, timeout=60.0):
    """Wait until the container's logs match `pattern` (regex); return the logs.
    Fails with the logs when the container exits first or the time runs out."""
    rx = re.compile(pattern)

    def logged():
        logs = _logs(container)
        if rx.search(logs):
            return logs or True
        _fail_if_stopped(container, f"logging {pattern!r}")
        return None

    return wait_until(logged, timeout,
                      lambda: f"no {pattern!r} in the logs after {timeout}s:\n{_logs(container)}")


def wait_for_health(container, want="healthy", timeout=90):
    """Wait until Docker's HEALTHCHECK reports `want`; fail if the container stops first."""
    def status():
        _fail_if_stopped(container, f"its health was {want!r}")
        return container.attrs["State"].get("Health", {}).get("Status") == want

    def why():
        health = container.attrs["State"].get("Health", {})
        return (f"health is {health.get('Status')!r}, not {want!r}, after {timeout}s; last checks: "
                f"{health.get('Log', [])[-3:]}\n{_logs(container)}")

    wait_until(status, timeout, why, interval=1)


def host_port(container, port):
    """The host port Docker published for container `port` (e.g. '8888/tcp')."""
    container.reload()
    return int(container.attrs["NetworkSettings"]["Ports"][port][0]["HostPort"])


@pytest.fixture
def local_registry(docker_client, tmp_path):
    """A real registry (Debian's docker-registry) on 127.0.0.1:<a port it binds itself>, storing
    in tmp_path. Yields 'host:port'; stops it and removes every local tag pointing at it afterwards."""
    binary = require_tool("docker-registry", "docker-registry")
    config = tmp_path / "registry.yml"
    # Port 0: the registry binds a free port itself and logs it ("listening on ..."; info level),
    # so no other process can take a port picked and released before the registry binds it.
    config.write_text(
        "version: 0.1\nlog:\n  level: info\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'registry-data'}\n"
        # Deleting a manifest stands in for an upstream tag removal (test_base.py).
        "  delete:\n    enabled: true\n"
        "http:\n  addr: 127.0.0.1:0\n"
    )
    log = open(tmp_path / "registry.log", "wb")  # noqa: SIM115 - closed after the process ends
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    log_path, address = tmp_path / "registry.log", None

    def v2_url():
        nonlocal address
        bound = re.search(r'msg="listening on (127\.0\.0\.1:\d+)"', log_path.read_text())
        address = bound and bound.group(1)
        return address and f"http://{address}/v2/"
    try:
        wait_for_server(proc, v2_url, log_path, 30, "registry")
        yield address
    finally:
        stop_process(proc)
        log.close()
        for img in docker_client.images.list() if address else []:
            for ref in img.tags:
                if ref.startswith(address + "/"):
                    docker_client.images.remove(ref, noprune=False)


READY = r"==> READY"


@pytest.fixture
def start_jupyter(start_container):
    """Factory: start_jupyter(env=None, port=8888, **run_kwargs) -> (container, base_url, token).
    Publishes Jupyter's port on a random 127.0.0.1 port and waits for the ready line; token is
    the generated one from that line, or None when the test chose its own auth."""

    def start(env=None, port=8888, timeout=120, **kwargs):
        c = start_container(environment=env or {}, ports={f"{port}/tcp": ("127.0.0.1", None)}, **kwargs)
        return jupyter_ready(c, port, timeout)

    return start


def jupyter_ready(container, port=8888, timeout=120):
    """Wait for a started container's ready line: (container, base_url, generated token or None)."""
    logs = wait_for_log(container, READY, timeout)
    m = re.search(r"/lab\?token=([0-9a-f]+)", logs)
    return container, f"http://127.0.0.1:{host_port(container, f'{port}/tcp')}", m.group(1) if m else None


VERSIONS = json.loads((ROOT / "versions.json").read_text())


def version_row():
    """The versions.json matrix row the image was built from: $ROW (make test passes it), else
    the default row. Tests read versions from here instead of spelling them out."""
    name = os.environ.get("ROW") or VERSIONS["default"]
    return next(r for r in VERSIONS["matrix"] if r["name"] == name)


# The image as pyxis, Kubernetes `command:` and Apptainer run it: no entrypoint, a UID with no
# passwd entry (HOME=/), a read-only root filesystem with only /tmp writable (run kwargs).
BARE = {"entrypoint": "", "user": "12345:12345", "read_only": True, "tmpfs": {"/tmp": ""}}
# Docker's --tmpfs /tmp is noexec, where no compiled kernel can be loaded; pyxis (the host's
# /tmp) and a Kubernetes emptyDir allow exec. Tests of torch.compile use /tmp:exec.
BARE_EXEC = {**BARE, "tmpfs": {"/tmp": "exec"}}


# Tests that stand for a host user by making a host folder owned by another UID (os.chown) or
# left to root: only a root test runner can make those.
needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="needs a root test runner: it makes a host folder owned by another UID, or by root, "
           "to stand for a host user (run `make test` as root, as CI does)")


def hook_mount(tmp_path, script, name="10-test.sh"):
    """run kwargs that mount a start-up hook (sourced as root after the setup steps, before the
    services or the command) holding `script`: how tests break a container on purpose."""
    hooks = tmp_path / f"hooks-{uuid.uuid4().hex[:8]}"
    hooks.mkdir()
    (hooks / name).write_text(script + "\n")
    hooks.chmod(0o755)
    return {"volumes": {str(hooks): {"bind": "/etc/team/hooks.d", "mode": "ro"}}}


@pytest.fixture
def docker_network(docker_client):
    """A user-defined bridge network (its DNS resolves container names); always removed,
    with any container still attached to it."""
    net = docker_client.networks.create(f"test-{uuid.uuid4().hex[:10]}", driver="bridge")
    yield net
    net.reload()
    for c in net.containers:
        c.remove(force=True, v=True)
    net.remove()


@contextlib.contextmanager
def http_status_server(status):
    """A local HTTP server that answers every HEAD request with `status`, quietly: a registry's
    401 to an anonymous client, an index's 404. -> its port, while the block runs."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
