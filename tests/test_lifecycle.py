"""Process model and start-up: tini as PID 1, fail-fast services, clean `docker stop`, health,
user hooks, commands as the non-root user, UID mapping, and the start-up checks' messages."""
import json
import os
import re
import subprocess

import pytest
import requests
from conftest import (
    READY,
    ROOT,
    hook_mount,
    needs_root,
    require_tool,
    version_row,
    wait_for_health,
    wait_for_log,
)

ISSUE_LINE = re.compile(r"^(WARN|ERROR)\b|^\[[WEC] ", re.MULTILINE)  # ours, and Jupyter's [W]/[E]/[C]


@pytest.fixture(scope="module")
def public_key(tmp_path_factory):
    """A fresh ed25519 public key, so that sshd runs (it only starts with a key)."""
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run([require_tool("ssh-keygen", "openssh-client"), "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key.with_suffix(".pub").read_text().strip()


ENTRYPOINT = ROOT / "docker/rootfs/usr/local/bin/entrypoint.sh"
TEAM_LIB = ROOT / "docker/rootfs/usr/local/lib/team"


def entrypoint_contract():
    """The table at the top of entrypoint.sh, as {script: {"sets": {...}, "reads": {...}}}:
    what each setup step (and services.sh) reads from the steps before it and sets for later."""
    contract, script, verb = {}, None, None
    for line in ENTRYPOINT.read_text().splitlines():
        m = re.match(r"#   (\S+\.sh|\(here\))\s+(.*)", line) or re.match(r"#\s{10,}(.*)", line)
        if not m or (m.lastindex == 1 and script is None):
            continue
        if m.lastindex == 2:
            script, rest = m.group(1), m.group(2)
            contract[script] = {"sets": set(), "reads": set(), "unsets": set()}
        else:
            rest = m.group(1)
        for word in re.findall(r"\(.*?\)|[A-Za-z_/.]+", rest):
            if word in ("sets", "exports", "reads", "unsets", "writes"):
                verb = {"exports": "sets", "writes": None}.get(word, word)
            elif verb and re.fullmatch(r"[A-Z][A-Z_]{2,}", word):
                contract[script][verb].add(word)
    return contract


def test_entrypoint_lists_what_each_step_reads_and_sets():
    """Each setup step should set what entrypoint.sh's table says it sets, read nothing another
    step sets unless the table lists it, and decide by START_SERVICES, not the argument count."""
    contract = entrypoint_contract()
    steps = sorted((TEAM_LIB / "entrypoint.d").glob("*.sh"))
    assert [s.name for s in steps] == [k for k in contract if k.endswith(".sh") and k[0].isdigit()], \
        f"the table should list every step, in order: {list(contract)}"
    set_before = set(contract["(here)"]["sets"])
    for path in [*steps, TEAM_LIB / "services.sh"]:
        text, listed = path.read_text(), contract[path.name]
        for name in listed["sets"]:
            assert re.search(rf"\b{name}=", text), f"{path.name} should set {name}, as the table says"
        for name in listed["unsets"]:
            assert re.search(rf"^\s*unset\b.*\b{name}\b", text, re.MULTILINE), f"{path.name} should unset {name}"
        for name in sorted(set_before - listed["sets"]):
            uses = re.search(rf"\${{?{name}\b", text)
            assert not uses or name in listed["reads"], \
                f"{path.name} reads {name} (set by an earlier step) but the table does not say so"
        assert "$#" not in text, f"{path.name} decides by the entrypoint's argument count"
        set_before |= listed["sets"]


def wait_for_exit(container, timeout=30):
    return container.wait(timeout=timeout)["StatusCode"]


def test_tini_is_pid_1(start_container):
    """Container should run tini as PID 1, with the services under it."""
    c = start_container()
    wait_for_log(c, READY)
    _, comm = c.exec_run(["cat", "/proc/1/comm"])
    assert comm.decode().strip() == "tini", f"PID 1 should be tini, is {comm!r}"
    _, children = c.exec_run(["ps", "-o", "args=", "--ppid", "1"])
    assert "services.sh" in children.decode(), f"tini's child should be services.sh: {children!r}"


@pytest.mark.parametrize("pattern,name", [("jupyter-lab", "JupyterLab"), ("/usr/sbin/sshd -D", "sshd")])
def test_killing_a_service_stops_the_container_non_zero(start_container, public_key, pattern, name):
    """Container should exit non-zero, naming the service, when JupyterLab or sshd dies."""
    c = start_container(environment={"PUBLIC_KEY": public_key})
    wait_for_log(c, READY)
    code, out = c.exec_run(["pkill", "-TERM", "-o", "-f", pattern])
    assert code == 0, f"pkill should find {pattern!r}: {out!r}"
    status = wait_for_exit(c)
    logs = c.logs().decode(errors="replace")
    assert status != 0, f"exit code should be non-zero when {name} dies, got {status}:\n{logs}"
    assert re.search(rf"^ERROR .*{name} exited unexpectedly", logs, re.MULTILINE), f"an ERROR should name {name}:\n{logs}"


def test_docker_stop_is_prompt_and_clean(start_jupyter, public_key):
    """Container should stop on `docker stop`'s SIGTERM, before Docker's SIGKILL: exit code 0 (not 137)."""
    c, base, token = start_jupyter({"PUBLIC_KEY": public_key})
    # With a running kernel too: Jupyter shuts its kernels down before it exits.
    r = requests.post(f"{base}/api/kernels", headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code == 201, f"a kernel should start: {r.status_code}"
    # Exit code 0 alone proves the stop beat the 10 s SIGKILL; how fast is `make bench`'s
    # measurement, not a wall-clock threshold that fails on a busy machine.
    c.stop(timeout=10)
    c.reload()
    code = c.attrs["State"]["ExitCode"]
    assert code == 0, f"exit code after docker stop should be 0, got {code} (137 = killed after 10 s)"
    assert "Stopped cleanly" in c.logs().decode(), "the supervisor should log the clean stop"


@pytest.mark.parametrize("env,port", [({"PUBLIC_KEY": None}, 8888), ({"JUPYTER_PORT": "9999"}, 9999)],
                         ids=["jupyter+sshd", "custom-port"])
def test_health_reaches_healthy(start_container, public_key, env, port):
    """Container should become healthy (Jupyter /api, and sshd when on), also on a custom port."""
    env = {k: (v or public_key) for k, v in env.items()}
    c = start_container(environment=env)
    wait_for_health(c)
    _, out = c.exec_run(["/usr/local/bin/healthcheck"])
    assert f"JupyterLab on {port}" in out.decode(), f"the check should probe port {port}: {out!r}"
    if "PUBLIC_KEY" in env:
        assert "sshd on 22" in out.decode(), f"the check should cover sshd: {out!r}"


def test_health_reaches_healthy_under_docker_run_init(start_container, public_key):
    """Container started with `docker run --init` (Docker's init in front of tini) should become
    healthy: the healthcheck finds the services by what they are, not as PID 1's children."""
    c = start_container(environment={"PUBLIC_KEY": public_key}, init=True)
    _, comm = c.exec_run(["cat", "/proc/1/comm"])
    assert comm.decode().strip() == "docker-init", f"PID 1 should be Docker's init: {comm!r}"
    wait_for_health(c)
    _, out = c.exec_run(["/usr/local/bin/healthcheck"])
    assert "sshd on 22" in out.decode(), f"the check should cover sshd: {out!r}"


@pytest.mark.parametrize("pattern,name", [("jupyter-lab", "JupyterLab"), ("/usr/sbin/sshd -D", "sshd")])
def test_healthcheck_fails_when_a_service_hangs(start_container, public_key, pattern, name):
    """Container healthcheck should fail, naming the service, when JupyterLab or sshd is frozen."""
    c = start_container(environment={"PUBLIC_KEY": public_key})
    wait_for_log(c, READY)
    code, out = c.exec_run(["/usr/local/bin/healthcheck"])
    assert code == 0, f"the check should pass first: {out!r}"
    c.exec_run(["pkill", "-STOP", "-o", "-f", pattern])
    code, out = c.exec_run(["/usr/local/bin/healthcheck"])
    assert code != 0 and name in out.decode(), f"a frozen {name} should fail the check: {code} {out!r}"


def test_healthcheck_passes_for_a_plain_command(start_container):
    """Container healthcheck should not flag `docker run IMAGE <command>`, which runs no services."""
    c = start_container(["sleep", "60"])
    wait_for_log(c, r"Executing: sleep 60")
    code, out = c.exec_run(["/usr/local/bin/healthcheck"])
    assert code == 0 and "command mode" in out.decode(), f"command mode should pass: {code} {out!r}"


def test_user_hooks_run(run_in_image, tmp_path):
    """Container should source *.sh hooks, run executable hooks and skip other files, in order."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "10-env.sh").write_text("export HOOK_VAR=from-sourced-hook\n")
    (hooks / "20-run").write_text("#!/bin/sh\necho \"ran as $(id -un) with $HOOK_VAR\" > /tmp/hook-ran\n")
    (hooks / "30-not-executable").write_text("#!/bin/sh\ntouch /tmp/should-not-exist\n")
    (hooks / "20-run").chmod(0o755)
    (hooks / "30-not-executable").chmod(0o644)
    code, out = run_in_image(
        ["bash", "-c", "echo VAR=$HOOK_VAR; cat /tmp/hook-ran; ls /tmp/should-not-exist 2>&1 || true"],
        volumes={str(hooks): {"bind": "/etc/team/hooks.d", "mode": "ro"}})
    assert code == 0, f"the command should succeed:\n{out}"
    assert "VAR=from-sourced-hook" in out, f"a sourced hook's exports should reach the command:\n{out}"
    assert "ran as root with from-sourced-hook" in out, f"the executable hook should run after it:\n{out}"
    assert "No such file" in out, f"a non-executable, non-.sh file should not run:\n{out}"


def test_command_runs_after_setup_as_the_non_root_user(run_in_image):
    """Container should run `docker run IMAGE bash -c ...` as dev in /workspace, exit code kept."""
    code, out = run_in_image(["bash", "-c", "echo \"$(id -un) $(id -u) $PWD $HOME\"; exit 7"])
    assert code == 7, f"the command's exit code should be the container's, got {code}:\n{out}"
    assert "dev 1000 /workspace /home/dev" in out, f"the command should run as dev:\n{out}"
    assert "Executing: bash -c" in out, f"the entrypoint should say what it runs:\n{out}"


def test_normal_start_prints_no_warn_or_error(start_container, public_key):
    """Container should start Jupyter and sshd (CPU host, 1 GiB shm) without a WARN or ERROR line."""
    c = start_container(environment={"PUBLIC_KEY": public_key}, shm_size="1g")
    logs = wait_for_log(c, READY)
    assert not ISSUE_LINE.search(logs), f"a normal start should print no WARN/ERROR:\n{logs}"
    v = {k: re.escape(version_row()[k]) for k in ("torch", "cuda", "cudnn", "nccl")}  # versions.json
    banner = rf"^INFO .*torch {v['torch']}, CUDA {v['cuda']}(\.\d+)*, cuDNN {v['cudnn']}(\.\d+)*, NCCL {v['nccl']}(\.\d+)*,"
    assert re.search(banner, logs, re.MULTILINE), f"the banner should give versions.json's versions:\n{logs}"
    assert re.search(r"^INFO .*No GPU visible.*--gpus all", logs, re.MULTILINE), \
        f"a CPU start should say how to get GPUs, as INFO:\n{logs}"
    assert "SSH on" in logs, f"the ready line should say SSH is on:\n{logs}"


def test_small_shm_warns_with_the_fix(run_in_image):
    """Container should WARN when /dev/shm is below 1 GiB, with --shm-size and --ipc=host."""
    code, out = run_in_image(["true"], shm_size="64m")
    assert code == 0, f"a small shm should warn, not fail:\n{out}"
    assert re.search(r"^WARN .*/dev/shm is only 64 MiB.*--shm-size=8g.*--ipc=host", out, re.MULTILINE), \
        f"the WARN should give the fix:\n{out}"


@needs_root
def test_user_follows_the_owner_of_a_mounted_workspace(run_in_image, tmp_path):
    """Container should give dev the UID/GID of the bind-mounted /workspace's owner."""
    os.chown(tmp_path, 4321, 4322)
    code, out = run_in_image(["bash", "-c", "id -u; id -g; touch /workspace/made-here; stat -c %u:%g ~"],
                             volumes={str(tmp_path): {"bind": "/workspace", "mode": "rw"}})
    assert code == 0, f"the command should succeed:\n{out}"
    assert "4321\n4322\n4321:4322" in out, f"dev should be 4321:4322 and own its home:\n{out}"
    st = (tmp_path / "made-here").stat()
    assert (st.st_uid, st.st_gid) == (4321, 4322), f"the file should belong to the host user, got {st.st_uid}:{st.st_gid}"


def test_host_uid_and_gid_env_vars_win(run_in_image):
    """Container should use HOST_UID/HOST_GID when given, with no mount."""
    code, out = run_in_image(["bash", "-c", "echo ids=$(id -u):$(id -g)"],
                             environment={"HOST_UID": "2345", "HOST_GID": "100"})
    assert code == 0 and "ids=2345:100" in out, f"dev should be 2345:100 (existing GID is fine):\n{out}"


def test_root_uid_is_refused(run_in_image):
    """Container should refuse HOST_UID=0, which would run Jupyter and SSH sessions as root."""
    code, out = run_in_image(["true"], environment={"HOST_UID": "0"})
    assert code != 0 and re.search(r"^ERROR .*HOST_UID.*refused", out, re.MULTILINE), f"UID 0 should be refused:\n{out}"


@needs_root
def test_unwritable_workspace_is_an_error_with_the_fix(run_in_image, tmp_path):
    """Container should log an ERROR with the fix when dev cannot write the mounted /workspace."""
    tmp_path.chmod(0o755)  # root-owned: says nothing about the host user, so no UID change
    _, out = run_in_image(["true"], volumes={str(tmp_path): {"bind": "/workspace", "mode": "rw"}})
    # Root-owned is root's own checkout: HOST_UID=$(id -u) would be 0, refused; an ACL is the fix.
    assert re.search(r"^ERROR .*/workspace .*cannot write.*setfacl -R -m u:1000:rwX", out, re.MULTILINE), \
        f"an ERROR with the fix is expected:\n{out}"


COMPILE_AND_REPORT = """
import torch, torch.hub
from torch._dynamo.utils import counters
torch.compile(lambda x: (x.sin() + 1).relu())(torch.randn(8))
print("fxgraph", counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
print("hub", torch.hub.get_dir())
"""


@needs_root
def test_caches_in_a_mounted_workspace_serve_the_next_container(run_in_image, tmp_path):
    """Container should keep pip/HF/hub/Inductor caches in /workspace/.cache for the next one."""
    os.chown(tmp_path, 4321, 4321)
    mount = {str(tmp_path): {"bind": "/workspace", "mode": "rw"}}
    script = ["bash", "-c", (f"python -c '{COMPILE_AND_REPORT}' && echo xdg=$XDG_CACHE_HOME"
                             " && grep -c XDG_CACHE_HOME= /etc/team/environment")]
    code, first = run_in_image(script, volumes=mount, timeout=600)
    assert code == 0, f"the first container failed:\n{first}"
    assert re.search(r"^fxgraph 0 [1-9]", first, re.MULTILINE), f"the first compile should miss:\n{first}"
    assert "hub /workspace/.cache/torch/hub" in first and "xdg=/workspace/.cache\n1" in first, first
    cache = tmp_path / ".cache"
    assert (cache.stat().st_uid, (cache / ".gitignore").read_text().splitlines()[-1]) == (4321, "*")
    assert any((cache / "torchinductor").rglob("*")), "no Inductor cache was written to the mount"
    code, second = run_in_image(script, volumes=mount, timeout=600)
    assert code == 0 and re.search(r"^fxgraph [1-9]", second, re.MULTILINE), \
        f"a new container should compile from the mounted cache:\n{second}"


@pytest.mark.parametrize("env,mounted,want", [
    ({}, False, "xdg=\n"),                                    # the image's own /workspace
    ({"CACHE_DIR": "none"}, True, "xdg=\n"),                  # opted out
    ({"CACHE_DIR": "/tmp/c"}, False, "xdg=/tmp/c\n"),          # anywhere else
    ({"CACHE_DIR": "rel/dir"}, False, "CACHE_DIR must be an absolute path"),
], ids=["no-mount", "none", "custom", "relative-is-an-error"])
def test_cache_dir_follows_cache_dir_env(run_in_image, tmp_path, env, mounted, want):
    """Container should put caches where CACHE_DIR says, nowhere when 'none' or unmounted."""
    if os.geteuid() == 0:  # stand for a non-root host user; a non-root runner is one already
        os.chown(tmp_path, 4321, 4321)
    mount = {str(tmp_path): {"bind": "/workspace", "mode": "rw"}} if mounted else {}
    code, out = run_in_image(["bash", "-c", "echo xdg=$XDG_CACHE_HOME"], environment=env,
                             volumes=mount)
    assert want in out, f"expected {want!r}:\n{out}"
    assert (code == 0) == want.startswith("xdg="), f"exit code {code}:\n{out}"
    assert not (tmp_path / ".cache").exists(), "CACHE_DIR=none still wrote to the workspace"


@needs_root
def test_an_empty_root_owned_cache_volume_is_handed_to_the_user(run_in_image, tmp_path):
    """Container should chown an empty root-owned CACHE_DIR (a new named volume) to dev and use it,
    but leave a root-owned folder that already holds files alone, with a WARN."""
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir(mode=0o755)
    full.mkdir(mode=0o755)
    (full / "someone-elses").write_text("x")
    for folder, want in ((empty, "xdg=/cache\n"), (full, "xdg=\n")):
        code, out = run_in_image(["bash", "-c", "echo xdg=$XDG_CACHE_HOME; touch /cache/t || true"],
                                 environment={"CACHE_DIR": "/cache"},
                                 volumes={str(folder): {"bind": "/cache", "mode": "rw"}})
        assert code == 0 and want in out, f"{folder.name}: expected {want!r}:\n{out}"
    assert empty.stat().st_uid == 1000 and (empty / "t").stat().st_uid == 1000
    assert full.stat().st_uid == 0 and not (full / "t").exists()
    assert re.search(r"^WARN .*Caches stay inside the container", out, re.MULTILINE), out


def _sudo_as_dev(run_in_image, env, **kwargs):
    """`sudo -n id -u` run by dev: (container exit code, 'rc=<sudo's exit code> out=<its output>')."""
    code, out = run_in_image(["bash", "-c", 'o=$(sudo -n id -u 2>&1); echo "SUDO rc=$? out=$o"'],
                             environment=env, **kwargs)
    results = re.findall(r"^SUDO (.*)$", out, re.MULTILINE)
    assert len(results) == 1, f"the sudo probe printed no result:\n{out}"
    return code, results[0]


@pytest.mark.parametrize("grant,want", [("1", "rc=0 out=0"), (None, "rc=1 out=sudo: a password is required")],
                         ids=["granted", "not-granted"])
def test_sudo_only_when_granted(run_in_image, grant, want):
    """Container should give dev passwordless sudo with GRANT_SUDO=1, and none without it."""
    code, got = _sudo_as_dev(run_in_image, {"GRANT_SUDO": grant} if grant else {})
    assert code == 0, f"the probe's container failed ({code}): {got}"
    assert got == want, f"GRANT_SUDO={grant}: `sudo -n id -u` should give {want!r}, gave {got!r}"


def test_sudo_check_notices_a_grant_that_grants_nothing(run_in_image, tmp_path):
    """The sudo check should see no sudo when GRANT_SUDO=1's grant is taken away (by a hook)."""
    code, got = _sudo_as_dev(run_in_image, {"GRANT_SUDO": "1"},
                             **hook_mount(tmp_path, "rm -f /etc/sudoers.d/90-team-nb-user"))
    assert (code, got) == (0, "rc=1 out=sudo: a password is required"), (
        f"with the grant removed the probe should report no sudo, gave {got!r} (exit {code})")


# A fake nvidia-smi shows what the GPU checks say on hardware this CI host does not have.
@pytest.mark.parametrize("gpu,warn", [
    ("0, NVIDIA H100 80GB HBM3, 550.54.15, 9.0", None),
    ("0, NVIDIA GeForce RTX 4090, 550.54.15, 8.9", None),  # sm_86 kernels run on sm_89
    ("0, NVIDIA GeForce RTX 5090, 570.124.04, 12.0", r"Blackwell .*no kernels.*tag 'blackwell' \(PyTorch >= 2\.7"),
    ("0, NVIDIA B200, 570.124.06, 10.0", r"Blackwell .*no kernels.*tag 'blackwell' \(PyTorch >= 2\.7"),
    ("0, Tesla T4, 470.82.01, 7.5", r"driver 470\.82\.01 is older than {min_driver}, the minimum for CUDA {cuda}.*upgrade"),
], ids=["h100", "rtx4090", "rtx5090", "b200", "old-driver"])
def test_gpu_checks_name_the_problem_and_the_fix(run_in_image, tmp_path, gpu, warn):
    """Container should report the GPU and WARN, with the fix, on an old driver or a Blackwell GPU."""
    code, out = run_in_image(["true"], volumes=fake_nvidia_smi(tmp_path, gpu))
    assert code == 0, f"GPU checks should warn, not fail:\n{out}"
    name = gpu.split(", ")[1]
    assert re.search(rf"^INFO .*GPU 0: {name}", out, re.MULTILINE), f"the banner should list the GPU:\n{out}"
    warns = re.findall(r"^WARN .*", out, re.MULTILINE)
    if warn is None:
        assert not warns, f"a supported GPU should give no WARN: {warns}"
    else:
        warn = warn.format(min_driver=re.escape(version_row()["min_driver"]),
                           cuda=re.escape(version_row()["cuda"]))  # versions.json
        assert any(re.search(warn, w) for w in warns), f"expected a WARN matching {warn!r}:\n{out}"


def fake_nvidia_smi(tmp_path, gpu):
    """The volumes that put an nvidia-smi printing `gpu` (its CSV query line) in the container."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho '{gpu}'\n")
    fake.chmod(0o755)
    return {str(fake): {"bind": "/usr/local/nvidia/bin/nvidia-smi", "mode": "ro"}}


def test_driver_floor_and_versions_in_the_warning_come_from_the_image_record(run_in_image, tmp_path):
    """Container should take the minimum driver and the CUDA version it names from the build's
    record (/usr/share/team-image/versions.json, from versions.json's row), not from the script."""
    code, record = run_in_image(["cat", "/usr/share/team-image/versions.json"], entrypoint=[])
    assert code == 0, f"the image has no version record:\n{record}"
    record = json.loads(record)
    assert (record.get("row"), record.get("min_driver")) == (version_row()["name"], version_row()["min_driver"]), \
        f"the record should name the row and its min_driver: {record}"
    record.update(min_driver="600.1.2", cuda="77.7")  # a floor above the fake GPU's 550 driver
    (tmp_path / "versions.json").write_text(json.dumps(record))
    volumes = fake_nvidia_smi(tmp_path, "0, NVIDIA H100 80GB HBM3, 550.54.15, 9.0")
    volumes[str(tmp_path / "versions.json")] = {"bind": "/usr/share/team-image/versions.json", "mode": "ro"}
    code, out = run_in_image(["true"], volumes=volumes)
    assert code == 0, f"GPU checks should warn, not fail:\n{out}"
    assert re.search(r"^WARN .*driver 550\.54\.15 is older than 600\.1\.2, the minimum for CUDA 77\.7",
                     out, re.MULTILINE), f"the warning should follow the record's min_driver and CUDA:\n{out}"


# The kernels of torch 2.15.0's aarch64 wheel (read from its libtorch_python.so; versions.json
# _comment_arm64): no sm_75/sm_86 as on x86_64, sm_110 instead; GB10 (sm_121) runs sm_120's.
ARM64_ARCHES = ["sm_80", "sm_90", "sm_100", "sm_110", "sm_120"]


@pytest.mark.parametrize("gpu,warn", [
    ("0, Tesla T4, 580.65.06, 7.5", (r"GPU 0 \(Tesla T4, sm_75\) is not in the architectures of this image's "
                                     r"PyTorch [0-9.]+ for linux/arm64 \(sm_80 .*sm_120\).*build for linux/arm64")),
    ("0, NVIDIA GB10, 580.95.05, 12.1", None),
    ("0, NVIDIA GH200 480GB, 580.65.06, 9.0", None),
], ids=["t4", "gb10", "gh200"])
def test_gpu_check_names_the_images_platform_when_its_kernels_do_not_fit(run_in_image, tmp_path, gpu, warn):
    """Container should judge the GPU against its own platform's kernel list (the record's
    platform and cuda_arch_list) and, when the GPU is not in it, name that platform and the fix."""
    code, record = run_in_image(["cat", "/usr/share/team-image/versions.json"], entrypoint=[])
    assert code == 0, f"the image has no version record:\n{record}"
    record = json.loads(record)
    assert record.get("platform") in ("linux/amd64", "linux/arm64"), f"the record names no platform: {record}"
    record.update(platform="linux/arm64", cuda_arch_list=ARM64_ARCHES, min_driver="580.65.06")
    (tmp_path / "versions.json").write_text(json.dumps(record))
    volumes = fake_nvidia_smi(tmp_path, gpu)
    volumes[str(tmp_path / "versions.json")] = {"bind": "/usr/share/team-image/versions.json", "mode": "ro"}
    code, out = run_in_image(["true"], volumes=volumes)
    assert code == 0, f"GPU checks should warn, not fail:\n{out}"
    assert re.search(r"^INFO .*Image: torch .*, linux/arm64$", out, re.MULTILINE), f"the banner names no platform:\n{out}"
    warns = [w for w in re.findall(r"^WARN .*", out, re.MULTILINE) if "GPU 0" in w]
    if warn is None:
        assert not warns, f"a GPU the arm64 kernels cover should give no WARN: {warns}"
    else:
        assert any(re.search(warn, w) for w in warns), f"expected a WARN matching {warn!r}:\n{out}"


def test_arbitrary_user_flag_still_serves_jupyter(start_container):
    """Container should still start JupyterLab under `docker run --user <uid>` (no passwd entry)."""
    c = start_container(user="4321:4321")
    logs = wait_for_log(c, READY)
    _, out = c.exec_run(["ps", "-o", "uid=", "-C", "jupyter-lab"])
    assert out.split() == [b"4321"], f"Jupyter should run as the --user UID: {out!r}\n{logs}"


# --- unusual docker run options: each works, or fails naming the cause and the fix ------------

def test_read_only_workspace_mount_is_named_as_the_cause(run_in_image, tmp_path):
    """Container should blame the :ro mount (not ownership) when /workspace is mounted read-only."""
    if os.geteuid() == 0:  # stand for a non-root host user; a non-root runner is one already
        os.chown(tmp_path, 4321, 4321)
    _, out = run_in_image(["true"], volumes={str(tmp_path): {"bind": "/workspace", "mode": "ro"}})
    assert re.search(r"^ERROR .*/workspace is mounted read-only.*drop :ro", out, re.MULTILINE), \
        f"the ERROR should name the read-only mount and the fix:\n{out}"
    assert "HOST_UID" not in out, f"ownership is not the problem here:\n{out}"


@needs_root
def test_workspace_with_root_group_keeps_the_image_gid(run_in_image, tmp_path):
    """Container should follow a 4242:0 /workspace's owner but keep dev's GID (never group root)."""
    os.chown(tmp_path, 4242, 0)
    tmp_path.chmod(0o755)
    code, out = run_in_image(["bash", "-c", "echo ids=$(id -u):$(id -g); touch /workspace/f"],
                             volumes={str(tmp_path): {"bind": "/workspace", "mode": "rw"}})
    assert code == 0 and "ids=4242:1000" in out, f"dev should become 4242 and keep GID 1000:\n{out}"
    assert not re.search(r"^ERROR", out, re.MULTILINE), f"nothing is wrong here:\n{out}"


@pytest.mark.parametrize("env,named", [
    ({"HOST_UID": "4294967296"}, "HOST_UID='4294967296'"),
    ({"HOST_UID": "-5"}, "HOST_UID='-5'"),
    ({"HOST_GID": "abc"}, "HOST_GID='abc'"),
    ({"HOST_GID": "0"}, "HOST_GID=0"),
])
def test_bad_host_ids_are_refused_naming_the_variable(run_in_image, env, named):
    """Container should refuse an out-of-range or root HOST_UID/HOST_GID, naming that variable."""
    code, out = run_in_image(["true"], environment=env)
    assert code == 64, f"{env} should stop the container with 64, got {code}:\n{out}"
    assert re.search(rf"^ERROR .*{re.escape(named)}.*Fix: ", out, re.MULTILINE), \
        f"the ERROR should name {named} and the fix:\n{out}"
    assert "usermod" not in out and "groupmod" not in out, f"no raw tool error:\n{out}"


def test_read_only_root_filesystem_serves_jupyter_and_commands(start_jupyter, run_in_image, docker_client):
    """Container should start Jupyter and run commands under --read-only --tmpfs /tmp."""
    ro = {"read_only": True, "tmpfs": {"/tmp": ""}}
    vol = docker_client.volumes.create()
    try:
        c, base, token = start_jupyter(volumes={vol.name: {"bind": "/workspace", "mode": "rw"}}, **ro)
        r = requests.put(f"{base}/api/contents/saved.txt", headers={"Authorization": f"token {token}"},
                         json={"type": "file", "format": "text", "content": "hi"}, timeout=30)
        assert r.status_code == 201, f"saving to /workspace should work: {r.status_code} {r.text}"
        logs = c.logs().decode(errors="replace")
        assert not re.search(r"^(WARN|ERROR)", logs, re.MULTILINE), f"a read-only start is normal:\n{logs}"
        c.remove(force=True)
        script = ("import pathlib, torch; p = pathlib.Path.home() / 'x'; p.write_text('ok');"
                  " print('home', p.read_text(), torch.__version__)")
        code, out = run_in_image(["python", "-c", script], **ro)
        assert code == 0 and "home ok" in out, f"a command should run with a writable home:\n{out}"
    finally:
        vol.remove(force=True)


def test_read_only_root_filesystem_with_ssh_is_refused_with_the_fix(run_in_image, public_key):
    """Container should refuse SSH on --read-only up front, with the ways out."""
    code, out = run_in_image(None, timeout=60, environment={"PUBLIC_KEY": public_key},
                             read_only=True, tmpfs={"/tmp": ""})
    assert code == 64, f"SSH on a read-only root should stop the container (64), got {code}:\n{out}"
    assert re.search(r"^ERROR .*SSH cannot start on a read-only root filesystem.*Fix: drop --read-only", out,
                     re.MULTILINE), f"the ERROR should name the cause and the fix:\n{out}"


def test_cap_drop_all_is_refused_with_the_fix(run_in_image):
    """Container should refuse to start as root without SETUID/SETGID, naming --user and --cap-add."""
    code, out = run_in_image(["true"], cap_drop=["ALL"])
    assert code == 64, f"--cap-drop ALL should stop the container (64), got {code}:\n{out}"
    assert re.search(r"^ERROR .*missing: .*SETUID.*--user 1000:1000.*--cap-add SETUID", out, re.MULTILINE), \
        f"the ERROR should name the missing capabilities and both fixes:\n{out}"
    assert "setresuid failed" not in out and "cannot change owner" not in out, f"no raw tool error:\n{out}"


def test_cap_drop_all_with_user_serves_jupyter(start_jupyter):
    """Container should serve Jupyter under --cap-drop ALL --user 1000:1000 (the fix it names)."""
    _, base, token = start_jupyter(cap_drop=["ALL"], user="1000:1000")
    assert requests.get(f"{base}/api/status", headers={"Authorization": f"token {token}"},
                        timeout=30).status_code == 200, "Jupyter should answer"


@needs_root
def test_user_flag_with_an_unwritable_workspace_is_an_error_with_the_fix(run_in_image, tmp_path):
    """Container should say at start that a --user UID cannot write the mounted /workspace."""
    tmp_path.chmod(0o755)  # root-owned
    _, out = run_in_image(["true"], user="12345:12345",
                             volumes={str(tmp_path): {"bind": "/workspace", "mode": "rw"}})
    assert re.search(r"^ERROR .*/workspace .*not writable by UID 12345 from --user.*Fix: --user", out,
                     re.MULTILINE), f"an ERROR naming --user and the fix is expected:\n{out}"


@pytest.mark.parametrize("name,body,status", [
    ("20-fails", "#!/bin/sh\necho half-done\nexit 3\n", 3),
    ("20-fails.sh", "export A=1\nfalse\necho never\n", 1),
])
def test_a_failing_hook_stops_the_container_naming_it(run_in_image, tmp_path, name, body, status):
    """Container should stop at a failing hook, naming it and its exit status, before the command."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "10-ok.sh").write_text("export HOOK_OK=1\n")
    (hooks / name).write_text(body)
    (hooks / name).chmod(0o755)
    (hooks / "30-after").write_text("#!/bin/sh\necho later-hook-ran\n")
    (hooks / "30-after").chmod(0o755)
    code, out = run_in_image(["echo", "command-ran"],
                             volumes={str(hooks): {"bind": "/etc/team/hooks.d", "mode": "ro"}})
    assert code == status, f"the container should exit with the hook's status {status}, got {code}:\n{out}"
    assert re.search(rf"^ERROR .*Hook /etc/team/hooks.d/{re.escape(name)} failed \(exit status {status}\)",
                     out, re.MULTILINE), f"the ERROR should name the hook and its status:\n{out}"
    assert "command-ran" not in out and "later-hook-ran" not in out and "never" not in out, \
        f"nothing after the failing command should run:\n{out}"


@pytest.mark.parametrize("rdma,warns", [(True, True), (False, False)])
def test_infiniband_with_a_low_memlock_limit_warns_with_the_fix(run_in_image, rdma, warns):
    """Container should WARN when RDMA devices are passed in but memlock is too low for NCCL."""
    # A stand-in device node at the path RDMA passthrough uses; 64 KiB locked memory. (An
    # unlimited limit cannot be set here: dockerd may not raise it above its own.)
    devices = ["/dev/null:/dev/infiniband/uverbs0:rw"] if rdma else []
    code, out = run_in_image(["true"], devices=devices,
                             ulimits=[{"Name": "memlock", "Soft": 65536, "Hard": 65536}])
    assert code == 0, f"a low memlock limit should warn, not fail:\n{out}"
    found = re.search(r"^WARN .*InfiniBand/RoCE devices are visible.*64 KiB.*--ulimit memlock=-1", out, re.MULTILINE)
    assert bool(found) == warns, f"RDMA device {rdma}: WARN expected={warns}:\n{out}"


def test_gpu_device_nodes_without_nvidia_smi_warn_with_the_fix(run_in_image):
    """Container should WARN, naming --gpus all, when /dev/nvidia* exist but nvidia-smi is missing."""
    # /dev/null mapped to /dev/nvidia0: a device node as a half-configured GPU runtime leaves it.
    code, out = run_in_image(["true"], devices=["/dev/null:/dev/nvidia0:rw"])
    assert code == 0, f"a half-configured GPU runtime should warn, not fail:\n{out}"
    assert re.search(r"^WARN .*GPU device nodes are present but nvidia-smi is missing.*Fix: docker run --gpus all",
                     out, re.MULTILINE), f"a WARN with the fix is expected:\n{out}"
    assert "No GPU visible" not in out, f"a GPU was clearly asked for: not the plain CPU INFO line:\n{out}"


def test_restart_on_failure_brings_jupyter_back(start_container):
    """Container under --restart on-failure should come back READY after JupyterLab dies."""
    c = start_container(restart_policy={"Name": "on-failure", "MaximumRetryCount": 3})
    wait_for_log(c, READY)
    code, out = c.exec_run(["pkill", "-KILL", "-o", "-f", "jupyter-lab"])
    assert code == 0, f"pkill should find jupyter-lab: {out!r}"
    logs = wait_for_log(c, rf"(?s){READY}.*exited unexpectedly.*{READY}", timeout=180)
    c.reload()
    assert c.attrs["RestartCount"] >= 1 and c.status == "running", (
        f"Docker should have restarted the container ({c.attrs['RestartCount']} restarts, {c.status}):\n{logs}")
    code, out = c.exec_run(["curl", "-fsS", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:8888/api"])
    assert (code, out) == (0, b"200"), f"Jupyter should answer again after the restart: {code} {out!r}"


def test_user_flag_turns_ssh_off_and_says_so(start_container, public_key):
    """Container started with --user should run no sshd even with PUBLIC_KEY, and WARN why."""
    c = start_container(user="1000:1000", environment={"PUBLIC_KEY": public_key})
    logs = wait_for_log(c, READY)
    assert re.search(r"^WARN .*SSH is off: sshd needs the container to start as root.*Remove --user", logs,
                     re.MULTILINE), f"a WARN should say why SSH is off and the fix:\n{logs}"
    code, out = c.exec_run(["pgrep", "-x", "sshd"])
    assert code == 1 and not out.strip(), f"no sshd should run under --user: {out!r}"
    assert "SSH on" not in logs, f"the ready line should not offer SSH:\n{logs}"


@pytest.mark.parametrize("status", [0, 5])
@pytest.mark.parametrize("command", [None, ["echo", "command-ran"]], ids=["services", "command"])
def test_a_sourced_hook_that_exits_stops_the_container_naming_it(run_in_image, tmp_path, status, command):
    """Container should treat `exit N` in a sourced *.sh hook (which ends the entrypoint, not just
    the hook) as a failure, naming the hook and the fix, with a non-zero status: `exit 0` once
    ended the start quietly with 0, so --restart on-failure did not restart it."""
    code, out = run_in_image(command, timeout=120,
                             **hook_mount(tmp_path, f"echo hook-started\nexit {status}\necho after-exit-ran", "20-exits.sh"))
    assert code == (status or 1), f"the container should exit with {status or 1}, got {code}:\n{out}"
    assert re.search(rf"^ERROR .*Hook /etc/team/hooks.d/20-exits.sh ran 'exit {status}'.*Fix: use 'return",
                     out, re.MULTILINE), f"an ERROR should name the hook, its exit and the fix:\n{out}"
    assert "hook-started" in out and "after-exit-ran" not in out, f"the hook should have run up to its exit:\n{out}"
    assert "command-ran" not in out and "READY" not in out, f"nothing should start after it:\n{out}"
