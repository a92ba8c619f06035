#!/usr/bin/env python3
"""Check this host before `make run` / `make build`: what is fine, what to fix, and the fix.

Usage: doctor.py doctor [OPTIONS]              every check as a table; exit 1 when one must be fixed
       doctor.py preflight --for run|build [OPTIONS]
                                               only what would make that target fail, named before
                                               Docker's own error (silent when all is well)
       doctor.py name --image IMAGE [--user USER]
                                               make run's default container name: a valid Docker name

Standard library only, so the system python3 runs it before any virtualenv exists. It changes
nothing: it reads `docker version/info/ps/image inspect`, binds each port and closes it at once,
and runs one throwaway `docker run --rm --gpus all IMAGE nvidia-smi -L` (doctor only, and only
when Docker has the NVIDIA runtime and the image is here).

Every outside probe can be pointed elsewhere (tests/test_doctor.py drives each case this way):
  --docker PATH (env DOCKER)           the docker client: tests use a fake with canned answers
  --nvidia-smi PATH (env NVIDIA_SMI)   the host's nvidia-smi
  --registry-probe URL                 what tells whether the base's registry answers
  --infiniband DIR                     instead of /sys/class/infiniband
  --memlock KIB|unlimited              instead of this process's RLIMIT_MEMLOCK
  --disk-need-gb GB                    instead of BUILD_DISK_BYTES (PULL_DISK_BYTES with --pull-first)
  --tools-path PATH                    where the test tools are looked for (--maintainer: MAINTAINER=1)
"""
import argparse
import json
import os
import pathlib
import platform
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import build_info
import doctor_gpu
import doctor_inputs
import doctor_team
import host_setup
import versions
from doctor_ports import check_container, check_ports, container_name
from doctor_report import FAIL, OK, SKIP, WARN, Row, print_table

MIN_DOCKER = (20, 10)
# From Docker 23 `docker build` is buildx: with DOCKER_BUILDKIT=1 and no buildx plugin it stops
# ("BuildKit is enabled but the buildx component is missing or broken"). Older clients (Debian's
# 20.10) drive the daemon's built-in BuildKit themselves.
BUILDX_FROM_MAJOR = 23
# Free space a cold `make build` needs under DockerRootDir. Measured on the 2-core host (Debian
# stand-in base, 2026-12-03): the 6.74 GB image (`docker image inspect` Size), 6.85 GB more in the
# build cache (`docker system df -v`: builder venv and apt layers, cache mounts) and ~3 GB of pip's
# wheels beside the unpacked venv at its peak: about 17 GB (results/startup_2core_2026-12-02.md).
# A cold pull (REGISTRY set; 2026-12-08, `du` every 10 s): 6.95 GB, the image unpacked, +1 GB.
BUILD_DISK_BYTES = 17 * 10**9
PULL_DISK_BYTES = 8 * 10**9
# NCCL's InfiniBand transport pins (ibv_reg_mr) host buffers for every peer and channel; NVIDIA's
# and Mellanox's guides ask for an unlimited memlock. A limit this large behaves the same.
MEMLOCK_LARGE = 64 * 2**30
PROBE_TIMEOUT = 3.0       # registry reachability: a reachable registry answers well within this
DOCKER_TIMEOUT = 15.0     # docker version/info/ps/image inspect answer in well under a second
GPU_RUN_TIMEOUT = 60.0    # one `docker run --rm ... nvidia-smi -L`
def version_tuple(text):
    """'20.10.24+dfsg1' -> (20, 10, 24); '525.60.13' -> (525, 60, 13); None when no number."""
    nums = re.findall(r"\d+", (text or "").split("+")[0].split("-")[0])
    return tuple(int(n) for n in nums) or None


class Host:
    """The probes, each run at most once; every one can be redirected by an option."""

    def __init__(self, opts):
        self.o = opts
        self._info = self._ps = self._client = self._smi = None
        self._images = {}

    def docker(self, *args, timeout=DOCKER_TIMEOUT):
        try:
            r = subprocess.run([self.o.docker, *args], capture_output=True, text=True, errors="replace",
                               timeout=timeout, check=False)
        except FileNotFoundError:
            return 127, "", f"{self.o.docker}: not found"
        except PermissionError:
            return 126, "", f"{self.o.docker}: not executable"
        except subprocess.TimeoutExpired:
            return 124, "", f"`docker {' '.join(args)}` gave no answer in {timeout:.0f} s"
        return r.returncode, r.stdout, r.stderr

    def client_version(self):
        # Printed by the client itself, even when the daemon does not answer.
        if self._client is None:
            _, out, _ = self.docker("version", "--format", "{{.Client.Version}}")
            self._client = [out.strip().splitlines()[0] if out.strip() else None]
        return self._client[0]

    def info(self):
        """(docker info as a dict, None) or (None, the error)."""
        if self._info is None:
            rc, out, err = self.docker("info", "--format", "{{json .}}")
            data = None
            try:
                data = json.loads(out) if rc == 0 else None
            except ValueError:
                err = f"docker info printed no JSON: {out[:200]!r}"
            if data is not None and not data.get("ServerVersion"):
                data, err = None, (data.get("ServerErrors") or [err or "no ServerVersion"])[0]
            self._info = (data, None) if data is not None else (None, (err or out).strip())
        return self._info

    def image_present(self, ref):
        if ref not in self._images:
            rc, _, _ = self.docker("image", "inspect", "--format", "{{.Id}}", ref)
            self._images[ref] = rc == 0
        return self._images[ref]

    def containers(self):
        """Every container (running or not) as docker ps's JSON lines."""
        if self._ps is None:
            rc, out, _ = self.docker("ps", "-a", "--format", "{{json .}}")
            self._ps = []
            for line in out.splitlines() if rc == 0 else []:
                try:
                    self._ps.append(json.loads(line))
                except ValueError:
                    pass
        return self._ps

    def nvidia_smi(self):
        """(rc, stdout, stderr) of the host's nvidia-smi query; None when there is none."""
        if self._smi is None:
            self._smi = [self._nvidia_smi()]
        return self._smi[0]

    def _nvidia_smi(self):
        exe = self.o.nvidia_smi
        if not exe or not (os.path.isfile(exe) or shutil.which(exe)):
            return None
        # compute_cap and the MIG mode are query fields since driver 510: ask the older fields alone
        # where they are refused, and say the rest is unknown.
        for fields in ("driver_version,name,compute_cap,mig.mode.current", "driver_version,name"):
            try:
                r = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader"],
                                   capture_output=True, text=True, errors="replace", timeout=DOCKER_TIMEOUT,
                                   check=False)  # errors: a name in another encoding is no reason to stop
            except (OSError, subprocess.TimeoutExpired) as e:
                return 1, "", str(e)
            if r.returncode == 0:
                break
        return r.returncode, r.stdout, r.stderr

    def nvidia_smi_list(self):
        """`nvidia-smi -L`: the GPUs and their MIG devices."""
        try:
            return subprocess.run([self.o.nvidia_smi, "-L"], capture_output=True, text=True, errors="replace",
                                  timeout=DOCKER_TIMEOUT, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    def memlock(self):
        """This process's memlock soft limit in bytes; None = unlimited."""
        if self.o.memlock is not None:
            return None if self.o.memlock == "unlimited" else int(self.o.memlock) * 1024
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        return None if soft == resource.RLIM_INFINITY else soft


def gb(n):
    return f"{n / 1e9:.1f} GB"


def short(ref, n=60):
    return ref if len(ref) <= n else ref[:n - 1] + "…"


# ---------------------------------------------------------------- the checks


def check_docker(h):
    """Docker client and engine, each >= 20.10, and a daemon that answers."""
    client = h.client_version()
    if client is None:
        _, _, err = h.docker("version")
        return [Row(FAIL, "docker", f"no Docker client at {h.o.docker} ({err.strip()[:120]})",
                    [("install Docker Engine >= 20.10: apt-get install docker.io "
                     "(or https://docs.docker.com/engine/install/)"),
                     "or point the Makefile at your client: make ... DOCKER=/path/to/docker"])]
    info, err = h.info()
    if info is None:
        if "permission denied" in err.lower():
            fix = [("let your user use Docker: sudo usermod -aG docker \"$(id -un)\", then log in "
                   "again (or run make as root)")]
        elif "cannot connect" in err.lower() or "daemon running" in err.lower():
            fix = ["start the daemon: sudo systemctl start docker (no systemd: sudo dockerd &)"]
        else:
            fix = ["run `docker info` and fix what it reports; every other check needs it"]
        return [Row(FAIL, "docker", f"client {client}, but the daemon does not answer: "
                    f"{err.splitlines()[0] if err else 'no output'}", fix)]
    server = info.get("ServerVersion", "?")
    old = [f"{who} {v}" for who, v in (("client", client), ("engine", server))
           if (version_tuple(v) or (0,))[:2] < MIN_DOCKER]
    if old:
        return [Row(FAIL, "docker", f"{' and '.join(old)} older than 20.10 (BuildKit cache and "
                    "secret mounts, --gpus)",
                    "upgrade Docker to >= 20.10: apt-get install docker.io (Debian 12, Ubuntu "
                    "22.04) or https://docs.docker.com/engine/install/")]
    return [Row(OK, "docker", f"client {client}, engine {server} (>= 20.10)")]


def check_buildkit(h):
    client = version_tuple(h.client_version()) or (0,)
    info, _ = h.info()
    plugins = [p.get("Name") for p in ((info or {}).get("ClientInfo") or {}).get("Plugins") or []]
    if client[0] < BUILDX_FROM_MAJOR:
        extra = " (buildx is here too)" if "buildx" in plugins else "; no buildx needed"
        return [Row(OK, "buildkit", f"the {client[0]}.{client[1] if len(client) > 1 else 0} "
                    f"client builds with DOCKER_BUILDKIT=1, which the Makefile sets{extra}")]
    if "buildx" in plugins:
        return [Row(OK, "buildkit", "buildx plugin present (Docker >= 23 builds through it)")]
    return [Row(FAIL, "buildkit", f"Docker {client[0]} builds through the buildx plugin and it is "
                "missing: make build stops with \"BuildKit is enabled but the buildx component "
                "is missing or broken\"",
                "install it: apt-get install docker-buildx-plugin (Docker's apt repository) or "
                "docker-buildx (Debian/Ubuntu's); check with: docker buildx version")]


TOOLKIT_FIX = ("install the NVIDIA Container Toolkit (https://docs.nvidia.com/datacenter/"
               "cloud-native/container-toolkit/), then: sudo nvidia-ctk runtime configure "
               "--runtime=docker && sudo systemctl restart docker")


def driver_facts(h):
    """(driver version text, [GPU names]) from the host's nvidia-smi, or (None, reason)."""
    r = h.nvidia_smi()
    if r is None:
        return None, "no nvidia-smi on this host"
    rc, out, err = r
    lines = [ln.split(",") for ln in out.strip().splitlines() if "," in ln]
    if rc != 0 or not lines:
        said = (err or out).strip().splitlines() or [f"exit code {rc}"]
        return None, f"nvidia-smi failed: {said[0]}"
    return lines[0][0].strip(), [ln[1].strip() for ln in lines]


def check_driver(h, row):
    driver, names = driver_facts(h)
    if driver is None:
        if names.startswith("no nvidia-smi"):
            return [Row(SKIP, "driver", "no nvidia-smi on this host (no NVIDIA driver): "
                        "containers run on the CPU")]
        return [Row(WARN, "driver", names,
                    "the driver is installed but not working: check `nvidia-smi`, dmesg; a "
                    "reboot after a driver upgrade is the usual fix")]
    need = row["min_driver"]
    gpus = f"{len(names)} GPU(s): {', '.join(sorted(set(names)))}"
    if (version_tuple(driver) or (0,)) < version_tuple(need):
        return [Row(FAIL, "driver", f"driver {driver} < {need} (versions.json min_driver), {gpus}:"
                    " the NVIDIA toolkit refuses to start the image (NVIDIA_REQUIRE_CUDA)",
                    [f"install an NVIDIA driver >= {need} for CUDA {row['cuda']}, then reboot",
                     ("CUDA forward compatibility (cuda-compat) is no way round it: GeForce/RTX "
                     "GPUs cannot use it, and the image carries none")])]
    return [Row(OK, "driver", f"driver {driver} >= {need} (versions.json min_driver), {gpus}")]


def check_gpu_flavour(h, row):
    """Which versions.json rows run on each host GPU (kernels, min_driver) and which to use."""
    if driver_facts(h)[0] is None:
        return []  # the driver row has said why
    gpus = doctor_gpu.parse_smi(h.nvidia_smi()[1])
    mig = h.nvidia_smi_list() if any(g["mig"].lower() == "enabled" for g in gpus) else None
    arch = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}.get(platform.machine(), "linux/amd64")
    return doctor_gpu.check_gpu_rows(gpus, row, arch, mig)


def cdi_nvidia_specs(info):
    found = []
    for d in info.get("CDISpecDirs") or []:
        p = pathlib.Path(d)
        for f in sorted(p.glob("*.json")) + sorted(p.glob("*.yaml")) if p.is_dir() else []:
            try:
                if "nvidia.com/gpu" in f.read_text(errors="replace"):
                    found.append(str(f))
            except OSError:
                pass
    return found


def check_runtime(h):
    info, _ = h.info()
    if info is None:
        return [Row(SKIP, "nvidia runtime", "needs a working `docker info`")]
    runtimes = sorted(info.get("Runtimes") or {})
    cdi = cdi_nvidia_specs(info)
    if "nvidia" in runtimes:
        via = f"; CDI specs: {', '.join(cdi)}" if cdi else ""
        return [Row(OK, "nvidia runtime", f"registered (make run adds --gpus all){via}")]
    host_gpu = driver_facts(h)[0] is not None
    if cdi:
        return [Row(WARN, "nvidia runtime", f"CDI specs for nvidia.com/gpu ({', '.join(cdi)}) but "
                    "no nvidia runtime in `docker info`: make run adds --gpus all only with it",
                    "sudo nvidia-ctk runtime configure --runtime=docker && "
                    "sudo systemctl restart docker")]
    where = ("this host has an NVIDIA driver, but " if host_gpu else "")
    return [Row(WARN, "nvidia runtime", f"{where}Docker has no nvidia runtime (Runtimes: "
                f"{', '.join(runtimes) or 'none'}) and no CDI spec: make run starts without GPUs",
                TOOLKIT_FIX if host_gpu else f"on a host with an NVIDIA GPU: {TOOLKIT_FIX}")]


def check_gpu_container(h, image):
    info, _ = h.info()
    if info is None or "nvidia" not in (info.get("Runtimes") or {}):
        return [Row(SKIP, "gpu container", "skipped: Docker has no nvidia runtime")]
    if not h.image_present(image):
        return [Row(SKIP, "gpu container", f"skipped: {image} is not here yet (make build)")]
    rc, out, err = h.docker("run", "--rm", "--gpus", "all", "--entrypoint", "nvidia-smi",
                            image, "-L", timeout=GPU_RUN_TIMEOUT)
    gpus = [ln for ln in out.splitlines() if ln.startswith("GPU ")]
    if rc == 0 and gpus:
        return [Row(OK, "gpu container", f"{len(gpus)} GPU(s) visible in {image}")]
    said = (err or out).strip().splitlines()
    said = said[-1] if said else f"exit code {rc}"
    if "unsatisfied condition" in said:
        fix = "the host driver is older than the image needs: see the driver row"
    else:
        fix = TOOLKIT_FIX
    return [Row(FAIL, "gpu container", f"docker run --gpus all {image} nvidia-smi -L: {said[:200]}",
                fix)]


def check_disk(h, image, pull=False):  # pull: REGISTRY set, so a missing image is pulled, not built
    need, cold, again, verb = ((h.o.pull_disk_need, "a pull", "a fresh pull", "pulling") if pull
                               else (h.o.disk_need, "a cold build", "a rebuild", "building"))
    info, _ = h.info()
    if info is None:
        return [Row(SKIP, "disk", "needs a working `docker info` (DockerRootDir)")]
    root = info.get("DockerRootDir") or "/var/lib/docker"
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return [Row(SKIP, "disk", f"the daemon is remote ({host}): check free space in its {root} there "
                    f"({cold} needs ~{gb(need)})")]
    try:
        free = shutil.disk_usage(root).free
    except OSError as e:
        return [Row(SKIP, "disk", f"cannot see {root} from here ({e.strerror}; Docker in a VM?): "
                    f"{cold} needs ~{gb(need)} free there")]
    if free >= need:
        return [Row(OK, "disk", f"{gb(free)} free in {root} ({cold} needs ~{gb(need)})")]
    fix = [(f"free {gb(need - free)} or more in {root}: docker builder prune (build cache), "
           "docker image prune (dangling images); `docker system df` shows what uses it"),
           "or move Docker's data: data-root in /etc/docker/daemon.json"]
    if h.image_present(image):
        return [Row(WARN, "disk", f"{gb(free)} free in {root}: enough to run {image}, which is here, "
                    f"but {again} needs ~{gb(need)}", fix)]
    return [Row(FAIL, "disk", f"{gb(free)} free in {root}; {verb} {image} needs ~{gb(need)}", fix)]


def registry_of(ref):
    """Which registry a reference is pulled from (Docker's rules for the first path part)."""
    name = ref.split("@")[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first if first not in ("docker.io", "index.docker.io") else "registry-1.docker.io"
    return "registry-1.docker.io"


def probe(url, proxy):
    """None when something answers HTTP(S) at url within PROBE_TIMEOUT, else why not. Any HTTP
    status counts (a registry says 401 to anonymous /v2/); so does a TLS handshake error (a plain
    HTTP registry): only no answer at all means unreachable."""
    result = [f"no answer in {PROBE_TIMEOUT:.0f} s"]
    # Through the daemon's proxy, not this shell's: the daemon pulls, not this script.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(
        {"http": proxy, "https": proxy} if proxy else {}))

    def run():
        try:
            opener.open(urllib.request.Request(url, method="HEAD"), timeout=PROBE_TIMEOUT)
            result[0] = None
        except urllib.error.HTTPError:
            result[0] = None
        except urllib.error.URLError as e:
            reason = e.reason
            if "ssl" in type(reason).__name__.lower() or "SSL" in str(reason):
                result[0] = None
            else:
                result[0] = str(getattr(reason, "strerror", None) or reason)
        except OSError as e:  # timeouts, resets, a proxy that refuses the tunnel
            # 407: the daemon's proxy answered but wants the credentials `docker info` masks.
            result[0] = None if "407" in str(e) else (str(e) or type(e).__name__)

    # A thread bounds name resolution too, which the socket timeout does not cover.
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(PROBE_TIMEOUT + 0.5)
    return result[0]


def standin_fix(h, target):
    s = versions.DATA["standin"]
    fix = []
    if h.image_present(s["image"]):
        fix.append(f"the Debian stand-in {s['image']} is already here; use it as the base:")
    else:
        fix.append("make the Debian stand-in base (docs/building.md: Air-gapped hosts; needs root and "
                   "debootstrap, ~30 s), then build on it:")
        fix.append("  make base-standin")
    fix.append(f"  make {target} BASE_IMAGE={s['image']} PYTHON_VERSION={s['python']}")
    fix.append("or load the real base from a connected host (docker save | docker load), or set "
               "BASE_IMAGE to your registry's copy (make mirror-base)")
    return fix


def check_base(h, image, base, target, image_suffices=False):
    """The base is here, or its registry answers; else the stand-in route. image_suffices: only
    a warning when the image itself is here (make run starts it without building)."""
    if h.image_present(base):
        return [Row(OK, "base image", f"{short(base)} is here")]
    info, _ = h.info()
    info = info or {}
    registry = registry_of(base)
    url = h.o.registry_probe
    if not url:
        mirrors = (info.get("RegistryConfig") or {}).get("Mirrors") or []
        if registry == "registry-1.docker.io" and mirrors:
            # The daemon pulls Docker Hub images through its mirror: probe that instead.
            registry = mirrors[0].rstrip("/").split("://")[-1]
            url = mirrors[0].rstrip("/") + "/v2/"
        else:
            url = f"https://{registry}/v2/"
    why = probe(url, info.get("HttpsProxy") or info.get("HttpProxy") or "")
    if why is None:
        return [Row(OK, "base image", f"{short(base)} is not here; {registry} answers, so the "
                    "build pulls it")]
    finding = f"{short(base)} is not here and {registry} cannot be reached ({why})"
    if image_suffices and h.image_present(image):
        return [Row(WARN, "base image", finding + f": make run works ({image} is here), "
                    "make build would not", standin_fix(h, "build"))]
    return [Row(FAIL, "base image", finding, standin_fix(h, target))]


def check_shm(_h):
    return [Row(OK, "/dev/shm", "make run, shell and smoke pass --shm-size=8g (Docker's default, "
                "64 MiB, starves DataLoader workers; plain docker run: --shm-size=8g or --ipc=host)")]


def check_memlock(h):
    ib = pathlib.Path(h.o.infiniband)
    devices = sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []
    if not devices:
        return [Row(SKIP, "memlock", f"no InfiniBand devices ({ib} is empty or absent)")]
    limit = h.memlock()
    shown = "unlimited" if limit is None else f"{limit // 1024} KiB"
    if limit is None or limit >= MEMLOCK_LARGE:
        return [Row(OK, "memlock", f"InfiniBand ({', '.join(devices)}); ulimit -l: {shown}")]
    return [Row(WARN, "memlock", f"InfiniBand ({', '.join(devices)}) but ulimit -l is {shown}: "
                "NCCL over IB fails to register memory (ibv_reg_mr) in a container that "
                "inherits it", ["docker run ... --ulimit memlock=-1 (plus --device=/dev/infiniband)",
                                ("for make run: set it for every container in /etc/docker/"
                                "daemon.json: \"default-ulimits\": {\"memlock\": {\"Name\": "
                                "\"memlock\", \"Soft\": -1, \"Hard\": -1}}, then restart docker")])]


def check_test_tools(o):
    """What make test needs beyond make run: scripts/host_setup.py's list (make host-setup,
    which make test runs first, installs it); a warning, as make run and build do without."""
    args = ["check", "--docker", o.docker] + (["--path", o.tools_path] if o.tools_path else [])
    standin = o.base == versions.DATA["standin"]["image"]
    h = host_setup.Host(host_setup.parse(args + (["--standin"] if standin else [])))
    tools = host_setup.TOOLS + (host_setup.STANDIN_TOOLS if standin else [])
    need = host_setup.missing(h, tools)
    if not need:
        return [Row(OK, "test tools", f"make test's tools are here ({', '.join(t.name for t in tools)})")]
    return [Row(WARN, "test tools", f"make test needs {host_setup.describe(need)}",
                ["make test installs them (make host-setup; root or sudo), or run:",
                 "  " + host_setup.install_command(h, host_setup.packages(h, need))])]


# ---------------------------------------------------------------- the commands


def doctor(h, o, row):
    rows = check_docker(h)
    docker_ok = rows[0].status == OK
    if docker_ok:
        rows += check_buildkit(h)
    rows += check_driver(h, row) + check_gpu_flavour(h, row) + doctor_gpu.check_row_support(row) + check_runtime(h)
    if docker_ok:
        rows += check_gpu_container(h, o.image)
        rows += check_disk(h, o.image, pull=o.pull_first)
        # REGISTRY set (--pull-first): make run pulls a missing image, so the build base is
        # no concern of a team member's (make build checks it itself, when it builds).
        if o.pull_first:
            rows += doctor_team.team_rows(h, o)
        else:
            rows += check_base(h, o.image, o.base, "run", image_suffices=True)
    rows += check_ports(h, o.ports, o.container, strict=False)
    if docker_ok:
        rows += check_container(h, o.container, strict=False)
    rows += check_shm(h) + check_memlock(h)
    # make test's tools are maintainer business: noise on a team member's screen.
    return rows + (check_test_tools(o) if o.maintainer else [])


def preflight(h, o, row):
    """What would make `make <target>` fail; fast (no container is started)."""
    rows = doctor_inputs.check_reference(o.image) + check_docker(h)
    if o.target == "run":  # make exports what was typed on its command line: the value make run uses
        rows += doctor_inputs.check_stop_timeout(os.environ.get("STOP_TIMEOUT"))
    if any(r.check == "docker" and r.status != OK for r in rows):
        return rows
    # --pull-first (REGISTRY set): a missing image is pulled; make build checks for itself only
    # if the registry has none (scripts/pull.py), so the base does not matter yet.
    building = o.target == "build" or not (h.image_present(o.image) or o.pull_first)
    if o.target == "run":
        rows += check_container(h, o.container, strict=True)
        rows += check_ports(h, o.ports, o.container, strict=True)
        # Before the pull and the start: the entrypoint would say it only after both.
        rows += doctor_team.check_workspace(o.workspace, strict=True)
    if building:
        rows += check_buildkit(h) + check_base(h, o.image, o.base, o.target)
    return rows


def port_arg(text):
    var, _, value = text.rpartition("=")
    try:
        return (var or "PORT", int(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"want VAR=PORT, got {text!r}") from None


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("doctor", "preflight", "name"))
    p.add_argument("--row", default=os.environ.get("ROW") or None, help="versions.json row")
    p.add_argument("--for", dest="target", choices=("run", "build"), default="run")
    p.add_argument("--docker", default=os.environ.get("DOCKER") or "docker")
    p.add_argument("--nvidia-smi", default=os.environ.get("NVIDIA_SMI", "nvidia-smi"))
    p.add_argument("--image", help="the image make run starts (REF); for name: IMAGE")
    p.add_argument("--base", default=None, help="BASE_IMAGE")
    p.add_argument("--user", default=None, help="for name: $USER (empty: the account name)")
    p.add_argument("--container", default=None)
    p.add_argument("--port", dest="ports", action="append", type=port_arg,
                   help="VAR=PORT that make run publishes (repeat)")
    p.add_argument("--pull-first", action="store_true",
                   help="REGISTRY set: a missing image is pulled from REGISTRY, not built")
    p.add_argument("--registry-probe", default=None)
    p.add_argument("--workspace", default=None, help="WORKSPACE: the host folder make run mounts on /workspace")
    p.add_argument("--infiniband", default="/sys/class/infiniband")
    p.add_argument("--memlock", default=None)
    p.add_argument("--disk-need-gb", type=float, default=None)
    p.add_argument("--tools-path", default=None)
    p.add_argument("--maintainer", action="store_true", help="doctor: also check make test's tools")
    o = p.parse_args(argv)
    row = versions.row(o.row)
    if o.command == "name":
        return o, row
    o.image = o.image or f"team-dl:{build_info.tag(row)}"
    o.base = o.base or versions.base_image(row)
    o.container = o.container or container_name(
        o.image.rsplit("/", 1)[-1].split(":")[0], os.environ.get("USER", ""))
    o.ports = o.ports or [("PORT_JUPYTER", 8888), ("PORT_SSH", 2222)]
    o.disk_need, o.pull_disk_need = (BUILD_DISK_BYTES, PULL_DISK_BYTES) if o.disk_need_gb is None else (
        o.disk_need_gb * 1e9,) * 2
    return o, row


def main(argv):
    o, row = parse(argv)
    if o.command == "name":
        if not o.image:
            sys.exit("doctor.py name: --image IMAGE is required")
        print(container_name(o.image, o.user if o.user is not None else os.environ.get("USER")))
        return 0
    start = time.monotonic()
    h = Host(o)
    if o.command == "doctor":
        rows = doctor(h, o, row)
        print_table(rows, f"make doctor: this host, for {o.image}\n"
                          f"  (base {short(o.base, 70)}; versions.json row {row['name']})\n", False)
    else:
        rows = preflight(h, o, row)
        print_table(rows, f"make {o.target}: stopped before Docker, by scripts/doctor.py preflight:"
                    if any(r.status == FAIL for r in rows) else f"make {o.target}: preflight",
                    True)
    fails = sum(r.status == FAIL for r in rows)
    warns = sum(r.status == WARN for r in rows)
    if o.command == "doctor":
        verdict = "all good" if not fails and not warns else (
            f"{fails} to fix (FAIL), {warns} warning(s) (WARN): each has its fix above")
        print(f"\n{verdict}. ({time.monotonic() - start:.1f} s)")
    elif fails:
        print("  (all host checks: make doctor; skip this one: PREFLIGHT=0)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
