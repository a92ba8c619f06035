"""`make doctor` and the pre-flight of `make run`/`make build` (scripts/doctor.py).

No Docker daemon, GPU, registry or root is needed for most of these: each test writes a fake
`docker` (canned `docker info` JSON, images, containers) and a fake `nvidia-smi` to tmp_path,
points the script at them, holds ports with its own sockets, fakes /sys/class/infiniband with a
folder, and answers the registry probe from a local HTTP server (or a closed port). Only
test_make_doctor_on_this_host uses the real host.
"""
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import host_setup  # scripts/ (conftest.py puts it on sys.path)
import pytest
from conftest import SLOWDOWN, http_status_server

ROOT = pathlib.Path(__file__).resolve().parent.parent
VERSIONS = json.loads((ROOT / "versions.json").read_text())
ROW = next(r for r in VERSIONS["matrix"] if r["name"] == VERSIONS["default"])
STANDIN = VERSIONS["standin"]
IMAGE = "team-dl:doctor-test"
BASE = ROW["base_image"]
CONTAINER = "team-dl-doctortest"
# What `make test` passes down would leak into the nested make runs (as in test_publish.py).
LEAKY = ("BASE_IMAGE", "PYTHON_VERSION", "IMAGE", "TAG", "REGISTRY", "ROW", "CONTAINER",
         "PORT_JUPYTER", "PORT_SSH", "PREFLIGHT", "MAKEFLAGS", "MFLAGS", "MAKELEVEL",
         "MAKEOVERRIDES")

# A fake docker client: answers from docker-state.json next to it, logs every call. It knows the
# read-only commands doctor.py uses, plus what make stop/logs call.
FAKE_DOCKER = r'''#!/usr/bin/env python3
import json, pathlib, sys
here = pathlib.Path(sys.argv[0]).resolve().parent
state = json.loads((here / "docker-state.json").read_text())
args = sys.argv[1:]
with open(here / "docker-calls.log", "a") as log:
    log.write(json.dumps(args) + "\n")
def out(text="", rc=0, err=""):
    sys.stdout.write(text); sys.stderr.write(err); sys.exit(rc)
names = {c["Names"] for c in state["containers"]}
if args[0] == "version":
    out(state["client"] + "\n", 0 if "info" in state else 1)
if args[0] == "info":
    if "info" not in state:
        out(json.dumps({"ServerErrors": [state["daemon_error"]], "ClientInfo": {}}) + "\n")
    out(json.dumps(state["info"]) + "\n")
if args[:2] == ["image", "inspect"]:
    if args[-1] in state["images"]:
        out("sha256:fake\n")
    out("[]\n", 1, "Error: No such image: " + args[-1] + "\n")
if args[:2] == ["container", "inspect"]:
    out("[{}]\n" if args[-1] in names else "[]\n", 0 if args[-1] in names else 1)
if args[0] == "ps":
    out("".join(json.dumps(c) + "\n" for c in state["containers"]))
if args[0] == "run":
    out(state["gpu_run"]["out"], state["gpu_run"]["rc"], state["gpu_run"].get("err", ""))
if args[0] in ("stop", "rm", "logs"):
    out(state.get("logs", "") if args[0] == "logs" else "")
out("", 1, "fake docker: unexpected " + " ".join(args) + "\n")
'''
# What doctor may ask Docker: nothing that changes state (no pull, rm, stop, create, prune).
READ_ONLY = {("version",), ("info",), ("image", "inspect"), ("ps",)}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port_url():
    """A URL on which nothing listens: the registry probe's 'unreachable', without a network."""
    return f"http://127.0.0.1:{free_port()}/v2/"


class FakeHost:
    """tmp_path as a host: fake docker and nvidia-smi, an InfiniBand folder, two free ports."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.docker = tmp_path / "docker"
        self.docker.write_text(FAKE_DOCKER.replace("/usr/bin/env python3", sys.executable, 1))
        self.docker.chmod(0o755)
        self.smi = tmp_path / "nvidia-smi"
        self.ib = tmp_path / "infiniband"
        self.ib.mkdir()
        # Every tool make test needs (scripts/host_setup.py), as stubs: the "test tools" row is OK
        # whatever this machine has (tests/test_host_setup.py tests that row's warning).
        self.tools = tmp_path / "tools"
        self.tools.mkdir()
        for tool in {c for t in host_setup.TOOLS + host_setup.STANDIN_TOOLS for c in t.commands} | {"docker-compose"}:
            (self.tools / tool).write_text("#!/bin/sh\nexit 0\n")
            (self.tools / tool).chmod(0o755)
        self.ports = [free_port(), free_port()]
        # A good GPU host: Docker 24 with buildx and the NVIDIA runtime, image and base here.
        self.state = {
            "client": "24.0.7",
            "info": {"ServerVersion": "24.0.7",
                     "ClientInfo": {"Plugins": [{"Name": "buildx", "Version": "v0.11.2"}]},
                     "Runtimes": {"runc": {"path": "runc"},
                                  "nvidia": {"path": "nvidia-container-runtime"}},
                     "DockerRootDir": str(tmp_path), "RegistryConfig": {"Mirrors": []}},
            "images": [IMAGE, BASE],
            "containers": [],
            "gpu_run": {"out": "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n", "rc": 0},
        }
        self.driver("550.54.15", "NVIDIA H100 80GB HBM3")

    def driver(self, version, name, cc="9.0"):
        # The answer to doctor's --query-gpu=driver_version,name,compute_cap,mig.mode.current.
        self.smi.write_text(f"#!/bin/sh\necho '{version}, {name}, {cc}, [N/A]'\n")
        self.smi.chmod(0o755)

    def save(self):
        (self.dir / "docker-state.json").write_text(json.dumps(self.state))

    def calls(self):
        log = self.dir / "docker-calls.log"
        return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []

    def run(self, command="doctor", *extra, probe=None, disk_gb=0.001, image=IMAGE, base=BASE,
            container=CONTAINER):
        self.save()
        args = [command, "--docker", str(self.docker), "--nvidia-smi", str(self.smi),
                "--image", image, "--base", base, "--container", container,
                "--port", f"PORT_JUPYTER={self.ports[0]}", "--port", f"PORT_SSH={self.ports[1]}",
                "--registry-probe", probe or closed_port_url(), "--infiniband", str(self.ib),
                "--tools-path", str(self.tools),
                "--disk-need-gb", str(disk_gb), *extra]
        # python3 -S: no site-packages, so this also proves the script needs the stdlib only.
        r = subprocess.run(["python3", "-S", str(ROOT / "scripts" / "doctor.py"), *args],
                           capture_output=True, text=True, timeout=60, check=False)
        assert "Traceback" not in r.stderr, r.stderr
        return r.returncode, r.stdout + r.stderr


@pytest.fixture
def host(tmp_path):
    return FakeHost(tmp_path)


def table(out):
    """{check: (status, the row with its fix lines)} from doctor's table."""
    rows, current = {}, None
    for line in out.splitlines():
        m = re.match(r"^  (OK|WARN|FAIL|SKIP) +(.+?)  +\S", line)
        if m:
            current = m.group(2)
            rows[current] = [m.group(1), line]
        elif current and line.startswith("      "):
            rows[current][1] += "\n" + line
        else:
            current = None
    # Wrapped lines join back into one text for the assertions.
    return {k: (s, re.sub(r"\s+", " ", text)) for k, (s, text) in rows.items()}


def status(out, check):
    rows = table(out)
    assert check in rows, f"no {check!r} row in:\n{out}"
    return rows[check]


# ---------------------------------------------------------------- make doctor, check by check


def test_good_host_is_all_ok_and_changes_nothing(host):
    """Doctor should pass a good GPU host (exit 0, no WARN/FAIL), asking Docker only read-only
    questions plus one throwaway `docker run --rm` for the GPU check."""
    rc, out = host.run()
    assert rc == 0, out
    rows = table(out)
    bad = {k: v for k, v in rows.items() if v[0] in ("WARN", "FAIL")}
    assert not bad, out
    for check in ("docker", "buildkit", "driver", "nvidia runtime", "gpu container", "disk",
                  "base image", "gpu flavour", f"port {host.ports[0]}", f"port {host.ports[1]}",
                  "container name", "/dev/shm"):
        assert rows.get(check, ("missing",))[0] == "OK", f"{check} is not OK:\n{out}"
    assert status(out, "memlock")[0] == "SKIP", out
    for call in host.calls():
        if call[0] == "run":
            assert call[:4] == ["run", "--rm", "--gpus", "all"], call
        else:
            assert tuple(call[:1]) in READ_ONLY or tuple(call[:2]) in READ_ONLY, call


@pytest.mark.parametrize("client,server", [("19.03.12", "19.03.12"), ("20.10.24+dfsg1", "19.03.5"),
                                           ("18.09.1", "24.0.7")])
def test_old_docker_must_be_fixed(host, client, server):
    """A Docker client or engine older than 20.10 should be a FAIL naming the version to get."""
    host.state["client"], host.state["info"]["ServerVersion"] = client, server
    rc, out = host.run()
    s, row = status(out, "docker")
    assert (rc, s) == (1, "FAIL"), out
    assert "older than 20.10" in row and "upgrade Docker to >= 20.10" in row, row


def test_docker_20_10_without_buildx_is_fine(host):
    """Debian's 20.10 client builds with DOCKER_BUILDKIT=1 alone: no buildx needed."""
    host.state["client"] = host.state["info"]["ServerVersion"] = "20.10.24+dfsg1"
    host.state["info"]["ClientInfo"]["Plugins"] = []
    rc, out = host.run()
    s, row = status(out, "buildkit")
    assert (rc, s) == (0, "OK") and "DOCKER_BUILDKIT=1" in row, out


def test_docker_23_without_buildx_must_be_fixed(host):
    """From Docker 23 `docker build` needs the buildx plugin: without it, a FAIL with the package."""
    host.state["info"]["ClientInfo"]["Plugins"] = [{"Name": "compose"}]
    rc, out = host.run()
    s, row = status(out, "buildkit")
    assert (rc, s) == (1, "FAIL"), out
    assert "docker-buildx-plugin" in row and "buildx component is missing" in row, row


@pytest.mark.parametrize("error,fix", [
    (("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon "
      "running?"), "systemctl start docker"),
    (("Got permission denied while trying to connect to the Docker daemon socket at "
      "unix:///var/run/docker.sock"), "usermod -aG docker"),
])
def test_daemon_not_answering_names_the_fix(host, error, fix):
    del host.state["info"]
    host.state["daemon_error"] = error
    rc, out = host.run()
    s, row = status(out, "docker")
    assert (rc, s) == (1, "FAIL") and fix in row, out


def test_no_docker_client(host, tmp_path):
    host.save()
    rc, out = host.run("doctor", "--docker", str(tmp_path / "no-such-docker"))
    s, row = status(out, "docker")
    assert (rc, s) == (1, "FAIL") and "install Docker Engine" in row, out


def test_no_nvidia_runtime_is_a_warning_with_the_toolkit_fix(host):
    """A GPU host whose Docker lacks the NVIDIA runtime: WARN (the image still runs on the CPU),
    naming the toolkit and nvidia-ctk; the GPU container check is skipped, saying why."""
    del host.state["info"]["Runtimes"]["nvidia"]
    rc, out = host.run()
    s, row = status(out, "nvidia runtime")
    assert (rc, s) == (0, "WARN"), out
    assert "has an NVIDIA driver" in row and "nvidia-ctk runtime configure --runtime=docker" in row
    s, row = status(out, "gpu container")
    assert s == "SKIP" and "no nvidia runtime" in row, out
    assert not [c for c in host.calls() if c[0] == "run"], "ran a GPU container with no runtime"


def test_cdi_spec_without_runtime(host, tmp_path):
    """CDI specs for nvidia.com/gpu without the runtime: make run's --gpus needs the runtime."""
    del host.state["info"]["Runtimes"]["nvidia"]
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    host.state["info"]["CDISpecDirs"] = [str(cdi)]
    rc, out = host.run()
    s, row = status(out, "nvidia runtime")
    assert (rc, s) == (0, "WARN") and "CDI specs" in row and "nvidia-ctk runtime configure" in row


def test_low_driver_must_be_fixed(host):
    """A driver below versions.json's min_driver: FAIL, with the floor and the GeForce caveat."""
    host.driver("470.82.01", "NVIDIA GeForce RTX 3090")
    rc, out = host.run()
    s, row = status(out, "driver")
    assert (rc, s) == (1, "FAIL"), out
    assert f"470.82.01 < {ROW['min_driver']}" in row and f">= {ROW['min_driver']}" in row, row
    assert "GeForce" in row and "forward compatibility" in row, row


def test_driver_at_the_floor_is_ok(host):
    host.driver(ROW["min_driver"], "NVIDIA GeForce RTX 3090")
    rc, out = host.run()
    assert (rc, status(out, "driver")[0]) == (0, "OK"), out


def test_no_nvidia_smi_is_skipped(host, tmp_path):
    rc, out = host.run("doctor", "--nvidia-smi", str(tmp_path / "none"))
    s, row = status(out, "driver")
    assert (rc, s) == (0, "SKIP") and "no nvidia-smi" in row, out


def test_gpu_container_that_sees_no_gpu_must_be_fixed(host):
    host.state["gpu_run"] = {"out": "", "rc": 125, "err": "docker: Error response from daemon: "
                             "could not select device driver \"\" with capabilities: [[gpu]].\n"}
    rc, out = host.run()
    s, row = status(out, "gpu container")
    assert (rc, s) == (1, "FAIL") and "could not select device driver" in row, out
    assert "NVIDIA Container Toolkit" in row, row


def test_gpu_container_skipped_without_the_image(host):
    host.state["images"] = [BASE]
    rc, out = host.run()
    s, row = status(out, "gpu container")
    assert (rc, s) == (0, "SKIP") and "not here" in row, out


def test_low_disk_must_be_fixed_when_a_build_is_needed(host):
    """Less free space under DockerRootDir than a build needs: FAIL when the image must be built,
    WARN when it is here already (make run starts it without building)."""
    host.state["images"] = [BASE]
    rc, out = host.run(disk_gb=10**7)
    s, row = status(out, "disk")
    assert (rc, s) == (1, "FAIL"), out
    assert str(host.dir) in row and "docker builder prune" in row, row
    host.state["images"] = [IMAGE, BASE]
    rc, out = host.run(disk_gb=10**7)
    assert (rc, status(out, "disk")[0]) == (0, "WARN"), out


def test_disk_need_is_a_measured_constant():
    """The default need is the documented, measured figure (image + build cache), 10-30 GB."""
    src = (ROOT / "scripts" / "doctor.py").read_text()
    m = re.search(r"^BUILD_DISK_BYTES = (\d+) \* 10\*\*9$", src, re.MULTILINE)
    assert m and 10 <= int(m.group(1)) <= 30, "BUILD_DISK_BYTES is not a GB figure"
    lines = src[:m.start()].splitlines()
    comment = []
    while lines and lines[-1].startswith("#"):
        comment.insert(0, lines.pop())
    comment = " ".join(comment)
    for how in ("Measured on", "docker image inspect", "docker system df"):
        assert how in comment, f"the comment above BUILD_DISK_BYTES does not say {how!r}"


def test_base_missing_and_unreachable_gives_the_standin_route(host):
    """No base here and its registry does not answer: FAIL with `make base-standin` and the exact
    make run line, from versions.json's standin entry."""
    host.state["images"] = []
    rc, out = host.run()
    s, row = status(out, "base image")
    assert (rc, s) == (1, "FAIL") and "cannot be reached" in row, out
    assert "make base-standin" in row, row
    assert f"make run BASE_IMAGE={STANDIN['image']} PYTHON_VERSION={STANDIN['python']}" in row, row


def test_standin_already_here_skips_making_it(host):
    host.state["images"] = [STANDIN["image"]]
    rc, out = host.run()
    s, row = status(out, "base image")
    assert (rc, s) == (1, "FAIL") and "already here" in row, out
    assert "make base-standin" not in row, row


def test_base_missing_but_image_here_is_a_warning(host):
    """make run starts an image that is here without building: the base is only a warning."""
    host.state["images"] = [IMAGE]
    rc, out = host.run()
    assert (rc, status(out, "base image")[0]) == (0, "WARN"), out


@pytest.fixture
def registry():
    """An HTTP server answering 401 to /v2/, as a registry does to an anonymous client."""
    with http_status_server(401) as port:
        yield f"http://127.0.0.1:{port}/v2/"


def test_base_missing_but_registry_answers(host, registry):
    host.state["images"] = []
    rc, out = host.run(probe=registry)
    s, row = status(out, "base image")
    assert (rc, s) == (0, "OK") and "answers" in row, out


def test_port_in_use_names_the_variable_and_a_free_port(host):
    """A host port make run publishes, held by another program: FAIL naming the variable to set
    and the next free port."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", host.ports[0]))
        held.listen()
        rc, out = host.run()
    s, row = status(out, f"port {host.ports[0]}")
    assert (rc, s) == (1, "FAIL") and "in use" in row, out
    m = re.search(r"make run PORT_JUPYTER=(\d+) \(the next free port\)", row)
    assert m and int(m.group(1)) > host.ports[0], row
    assert status(out, f"port {host.ports[1]}")[0] == "OK", out


def test_ib_with_low_memlock_is_a_warning(host):
    """InfiniBand present and a small `ulimit -l`: WARN with --ulimit memlock=-1."""
    (host.ib / "mlx5_0").mkdir()
    rc, out = host.run("doctor", "--memlock", "8192")
    s, row = status(out, "memlock")
    assert (rc, s) == (0, "WARN"), out
    assert "mlx5_0" in row and "8192 KiB" in row and "--ulimit memlock=-1" in row, row
    rc, out = host.run("doctor", "--memlock", "unlimited")
    assert status(out, "memlock")[0] == "OK", out


# ---------------------------------------------------------------- make run / make build pre-flight


def test_preflight_is_silent_when_all_is_well(host):
    rc, out = host.run("preflight", "--for", "run")
    assert (rc, out) == (0, ""), out


def test_preflight_port_taken(host):
    with socket.socket() as held:
        held.bind(("0.0.0.0", host.ports[1]))
        held.listen()
        rc, out = host.run("preflight", "--for", "run")
    assert rc == 1 and "stopped before Docker" in out, out
    s, row = status(out, f"port {host.ports[1]}")
    assert s == "FAIL" and re.search(r"make run PORT_SSH=\d+", row), out


def test_preflight_port_held_by_a_container_names_it(host):
    host.state["containers"] = [{"Names": "someone-elses", "State": "running", "Status": "Up",
                                 "Ports": f"0.0.0.0:{host.ports[0]}->8888/tcp"}]
    with socket.socket() as held:  # docker-proxy's listener, as it would be
        held.bind(("0.0.0.0", host.ports[0]))
        held.listen()
        rc, out = host.run("preflight", "--for", "run")
    s, row = status(out, f"port {host.ports[0]}")
    assert (rc, s) == (1, "FAIL") and "container someone-elses" in row, out
    assert "docker stop someone-elses" in row, row


def test_preflight_container_already_running(host):
    """A second make run while one runs: the name conflict, with make logs/stop and attach."""
    host.state["containers"] = [{"Names": CONTAINER, "State": "running", "Status": "Up 5 minutes",
                                 "Image": IMAGE, "Ports": ""}]
    rc, out = host.run("preflight", "--for", "run")
    s, row = status(out, "container name")
    assert (rc, s) == (1, "FAIL") and "already running" in row, out
    for fix in ("make logs", "==> READY", f"docker attach {CONTAINER}", "make stop"):
        assert fix in row, row


def test_preflight_stopped_container_of_that_name(host):
    host.state["containers"] = [{"Names": CONTAINER, "State": "exited", "Status": "Exited (1)",
                                 "Ports": ""}]
    rc, out = host.run("preflight", "--for", "run")
    s, row = status(out, "container name")
    assert (rc, s) == (1, "FAIL") and "make stop" in row, out


def test_preflight_invalid_container_name(host):
    rc, out = host.run("preflight", "--for", "run", container="ml/team-dl-")
    s, row = status(out, "container name")
    assert (rc, s) == (1, "FAIL") and "CONTAINER=ml-team-dl" in row, out


def test_preflight_build_base_unreachable(host):
    """make build with no base and no registry: the stand-in route for make build."""
    host.state["images"] = []
    rc, out = host.run("preflight", "--for", "build")
    s, row = status(out, "base image")
    assert (rc, s) == (1, "FAIL"), out
    assert f"make build BASE_IMAGE={STANDIN['image']} PYTHON_VERSION={STANDIN['python']}" in row


def test_preflight_run_with_the_image_here_needs_no_base(host):
    host.state["images"] = [IMAGE]
    rc, out = host.run("preflight", "--for", "run")
    assert (rc, out) == (0, ""), out


def account():
    return subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("image,user,want", [
    ("ml/team-dl", "", "ml-team-dl-{account}"),
    ("ml/team-dl", "alice", "ml-team-dl-alice"),
    ("team-dl", "alice", "team-dl-alice"),
    ("ml/team-dl:dev", "DOMAIN\\jo smith", "ml-team-dl-dev-DOMAIN-jo-smith"),
    ("registry.example.com:5000/ml/team-dl", "", "registry.example.com-5000-ml-team-dl-{account}"),
    ("team-dl-", "-", "team-dl"),
])
def test_container_name_is_always_valid(image, user, want):
    """IMAGE with / or :, and USER unset or odd, still give a valid name, never a trailing dash;
    unset USER falls back to the account name (`id -un`)."""
    r = subprocess.run(["python3", "-S", str(ROOT / "scripts" / "doctor.py"), "name",
                        "--image", image, "--user", user],
                       capture_output=True, text=True, check=True)
    name = r.stdout.strip()
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", name) and not name.endswith("-"), name
    assert name == want.format(account=account()), name


# ---------------------------------------------------------------- the Makefile's wiring


def make(host, *args, env=None, timeout=60):
    host.save()
    e = {k: v for k, v in os.environ.items() if k not in LEAKY}
    e.update({"DOCKER": str(host.docker), "NVIDIA_SMI": str(host.smi)}, **(env or {}))
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True,
                          env={k: v for k, v in e.items() if v is not None}, check=False,
                          timeout=timeout)


def test_make_run_with_namespaced_image_and_no_user(host):
    """`make run IMAGE=ml/team-dl` with USER unset: a valid --name, never `ml/team-dl-`."""
    r = make(host, "-n", "run", "IMAGE=ml/team-dl", env={"USER": None})
    names = re.findall(r"--name (\S+)", r.stdout)
    assert names == [f"ml-team-dl-{account()}"], r.stdout + r.stderr


def test_make_run_stops_before_docker_on_a_taken_port(host):
    """make run with PORT_JUPYTER held: the pre-flight's message and fix, and no `docker run`."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", host.ports[0]))
        held.listen()
        r = make(host, "run", f"PORT_JUPYTER={host.ports[0]}", f"PORT_SSH={host.ports[1]}",
                 f"IMAGE={IMAGE.split(':')[0]}", f"TAG={IMAGE.split(':')[1]}")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "stopped before Docker" in out, out
    assert re.search(r"make run PORT_JUPYTER=\d+", re.sub(r"\s+", " ", out)), out
    assert not [c for c in host.calls() if c[0] in ("run", "build")], host.calls()


def test_make_stop_and_logs(host):
    """make stop stops and removes make run's container (and is fine with none); make logs prints
    its logs, or says that nothing runs."""
    r = make(host, "stop", f"CONTAINER={CONTAINER}")
    assert r.returncode == 0 and "nothing to stop" in r.stdout, r.stdout + r.stderr
    r = make(host, "logs", f"CONTAINER={CONTAINER}")
    assert r.returncode != 0 and "make run starts it" in r.stderr, r.stdout + r.stderr
    host.state["containers"] = [{"Names": CONTAINER, "State": "running", "Ports": ""}]
    host.state["logs"] = "INFO ==> READY  JupyterLab: http://127.0.0.1:8888/lab?token=abc\n"
    r = make(host, "logs", f"CONTAINER={CONTAINER}")
    assert r.returncode == 0 and "==> READY" in r.stdout, r.stdout + r.stderr
    r = make(host, "stop", f"CONTAINER={CONTAINER}")
    assert r.returncode == 0 and f"stopped {CONTAINER}" in r.stdout, r.stdout + r.stderr
    assert ["stop", "-t", "30", CONTAINER] in host.calls(), f"make stop gives STOP_TIMEOUT: {host.calls()}"


def test_make_doctor_exits_with_the_status_the_readme_gives(host):
    """README's first run says which exit status of make doctor means "something to fix"."""
    said = re.search(r"`make doctor`.*?exits? (\d+)[^;)]*something to fix", (ROOT / "README.md").read_text())
    assert said, "README.md's first run no longer says make doctor's exit status"
    host.driver("470.57.02", "Tesla V100-SXM2-16GB", "7.0")  # below min_driver: a FAIL
    r = make(host, "doctor", f"IMAGE={IMAGE.split(':')[0]}", f"TAG={IMAGE.split(':')[1]}")
    assert r.returncode == int(said.group(1)), f"README says {said.group(1)}, make doctor exits {r.returncode}"


def test_make_help_lists_the_new_targets(host):
    r = make(host, "help")
    for target in ("doctor", "stop", "logs"):
        assert re.search(rf"^\s*(\x1b\[\d+m)?{target}\b", r.stdout, re.MULTILINE), r.stdout
    for var in ("PORT_JUPYTER", "PORT_SSH", "CONTAINER", "PREFLIGHT"):
        assert re.search(rf"^\s*{var}\s", r.stdout, re.MULTILINE), r.stdout


def test_make_doctor_on_this_host():
    """make doctor with the real docker: exit 0, or name each real problem with its fix, in
    seconds (a generous bound: a sanity check, not a timing test)."""
    env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    start = time.monotonic()
    r = subprocess.run(["make", "-s", "-C", str(ROOT), "doctor"], capture_output=True, text=True,
                       env=env, check=False, timeout=120)
    took = time.monotonic() - start
    out = r.stdout + r.stderr
    rows = table(r.stdout)
    assert "docker" in rows and "base image" in rows, out
    fails = {k: v for k, (v, _) in rows.items() if v == "FAIL"}
    assert (r.returncode == 0) == (not fails), out
    for check in fails:
        assert "fix:" in table(r.stdout)[check][1], f"{check} has no fix:\n{out}"
    assert took < 60 * SLOWDOWN, f"make doctor took {took:.0f} s"
