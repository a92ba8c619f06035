"""A GPU lost under a running container (the systemd cgroup issue after `systemctl daemon-reload`:
NVML says "Failed to initialize NVML: Unknown Error") should turn the container unhealthy, with
the cause and the fixes in Docker's health log; a container started without a GPU stays healthy.

The GPU is a stand-in this CI host can lose for real: device nodes that open (/dev/null's, given
with --device) and an nvidia-smi that, as NVML does, opens /dev/nvidiactl first. Losing the GPU
replaces the nodes with the real NVIDIA numbers (195:*), which the container's device cgroup
refuses: open() gets "Operation not permitted", as it does after the reload."""
import pytest
from conftest import READY, wait_for_health, wait_for_log, wait_until

GPU = "0, NVIDIA H100 80GB HBM3, 550.54.15, 9.0"
# Opens /dev/nvidiactl as NVML does, and fails with NVML's words when it may not.
FAKE_NVIDIA_SMI = f"""#!/bin/sh
if ! (: < /dev/nvidiactl) 2>/dev/null; then echo 'Failed to initialize NVML: Unknown Error'; exit 255; fi
echo '{GPU}'
"""
FAILING_NVIDIA_SMI = "#!/bin/sh\necho 'Failed to initialize NVML: Unknown Error'\nexit 255\n"
GPU_NODES = ["/dev/null:/dev/nvidiactl:rwm", "/dev/null:/dev/nvidia0:rwm"]
# What the reload leaves: the nodes still there, the device cgroup refusing them.
LOSE_THE_GPU = ("rm /dev/nvidiactl /dev/nvidia0 && mknod -m 666 /dev/nvidiactl c 195 255 "
                "&& mknod -m 666 /dev/nvidia0 c 195 0")
SECOND = 1_000_000_000  # Docker's health durations are in nanoseconds
QUICK_HEALTH = {"test": ["CMD", "/usr/local/bin/healthcheck"], "interval": SECOND, "timeout": 10 * SECOND,
                "retries": 2}
MODES = {"command": ["sleep", "infinity"], "services": None}


def nvidia_smi(tmp_path, script):
    """The volumes that put `script` in the container as nvidia-smi (the toolkit's place)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(script)
    fake.chmod(0o755)
    return {str(fake): {"bind": "/usr/local/nvidia/bin/nvidia-smi", "mode": "ro"}}


def start_and_wait(start_container, command, **kwargs):
    c = start_container(command, healthcheck=QUICK_HEALTH, **kwargs)
    wait_for_log(c, READY if command is None else r"Executing: ", 120)
    return c


def health_log(c):
    c.reload()
    return c.attrs["State"]["Health"]["Log"]


@pytest.mark.parametrize("mode", MODES)
def test_container_turns_unhealthy_with_cause_and_fixes_when_its_gpu_is_lost(start_container, tmp_path, mode):
    """Container started with a GPU should turn unhealthy once the GPU is refused, naming NVML's
    error, the refused node and the fixes (restart; CDI, cgroupfs), and be healthy after a restart."""
    c = start_and_wait(start_container, MODES[mode], devices=GPU_NODES,
                       volumes=nvidia_smi(tmp_path, FAKE_NVIDIA_SMI))
    assert "GPU 0: NVIDIA H100" in c.logs().decode(), "the start-up checks should list the stand-in GPU"
    wait_for_health(c, "healthy", timeout=60)

    code, out = c.exec_run(["sh", "-c", LOSE_THE_GPU], user="root")
    assert code == 0, f"could not replace the GPU nodes: {out!r}"
    wait_for_health(c, "unhealthy", timeout=30)
    last = health_log(c)[-1]
    words = ["Failed to initialize NVML: Unknown Error", "/dev/nvidiactl: Operation not permitted",
             "/dev/nvidia0: Operation not permitted", "systemctl daemon-reload", "docker restart",
             "nvidia-ctk cdi generate", "--device nvidia.com/gpu=all", "native.cgroupdriver=cgroupfs",
             "docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/troubleshooting.html"]
    missing = [w for w in words if w not in last["Output"]]
    assert last["ExitCode"] == 1 and not missing, f"the health log should say {missing}: {last}"

    # The advised fix: a restart gives the nodes back (--device) and a fresh record.
    c.restart(timeout=10)
    wait_for_health(c, "healthy", timeout=90)


@pytest.mark.parametrize("smi", ["absent", "failing from the start"])
def test_container_started_without_a_gpu_stays_healthy(start_container, tmp_path, smi):
    """Container started without a GPU should stay healthy: it has no GPU to lose, even when an
    nvidia-smi there fails."""
    kwargs = {} if smi == "absent" else {"volumes": nvidia_smi(tmp_path, FAILING_NVIDIA_SMI)}
    c = start_and_wait(start_container, MODES["command"], **kwargs)
    wait_for_health(c, "healthy", timeout=60)
    code, out = c.exec_run(["sh", "-c", "ls /run/team/gpus /tmp/team-run/gpus 2>&1"])
    assert code != 0, f"no GPU at start should leave no GPU record: {out!r}"
    # Three more checks (Docker keeps the last five), all passing; those before the container
    # was healthy may have seen the setup steps still running.
    seen = {h["Start"] for h in health_log(c)}

    def new_checks():
        return [h for h in health_log(c) if h["Start"] not in seen]
    wait_until(lambda: len(new_checks()) >= 3, 30, lambda: f"the healthcheck stopped running: {health_log(c)}")
    checks = new_checks()
    assert all(h["ExitCode"] == 0 and "command mode" in h["Output"] for h in checks), (
        f"a GPU-less container should pass every check: {checks}")


def test_healthcheck_neither_runs_nor_trusts_a_gpu_record_that_dev_wrote(start_container):
    """Container healthcheck (root) should ignore a GPU record dev planted in /tmp/team-run:
    not run it (dev -> root) and not count its GPU (a false unhealthy)."""
    c = start_and_wait(start_container, MODES["command"])
    wait_for_health(c, "healthy", timeout=60)
    planted = "gpu 0, NVIDIA H100 80GB HBM3\\nnode /dev/nvidia0\\ntouch /tmp/ran-as-root\\n"
    code, out = c.exec_run(["sh", "-c", f"mkdir -p /tmp/team-run && printf '{planted}' > /tmp/team-run/gpus"],
                           user="dev")
    assert code == 0, f"dev could not write /tmp/team-run: {out!r}"
    seen = {h["Start"] for h in health_log(c)}
    wait_until(lambda: len([h for h in health_log(c) if h["Start"] not in seen]) >= 3, 30,
               lambda: f"the healthcheck stopped running: {health_log(c)}")
    code, _ = c.exec_run(["test", "-e", "/tmp/ran-as-root"])
    assert code != 0, "the root healthcheck ran a line of a file dev wrote"
    checks = [h for h in health_log(c) if h["Start"] not in seen]
    assert all(h["ExitCode"] == 0 for h in checks), f"a record dev wrote should not count: {checks}"
