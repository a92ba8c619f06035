"""Beyond one machine: what schedulers and fast interconnects need from the image. RDMA verbs
for NCCL over InfiniBand/RoCE, PYTORCH_VERSION for enroot/pyxis, tini where it is not PID 1."""
import re


def test_nccl_finds_the_rdma_verbs_library_and_providers(run_in_image):
    """Container should let NCCL dlopen libibverbs (else it silently uses TCP over IB/RoCE)."""
    script = (
        "import ctypes, glob\n"
        "for name in ('libibverbs.so.1', 'librdmacm.so.1'):\n"
        "    ctypes.CDLL(name)\n"  # NCCL's own loader asks for libibverbs.so.1 the same way
        "    print('loaded', name)\n"
        "print('providers', sorted(p.rsplit('/', 1)[1] for p in glob.glob('/usr/lib/*/libibverbs/lib*.so')))\n"
    )
    code, out = run_in_image(["python", "-c", script])
    assert code == 0, f"libibverbs/librdmacm should load:\n{out}"
    assert "loaded libibverbs.so.1" in out and "loaded librdmacm.so.1" in out, out
    providers = re.search(r"^providers (.*)$", out, re.MULTILINE).group(1)
    for hca in ("libmlx5", "libefa"):  # Mellanox/NVIDIA ConnectX and AWS EFA
        assert hca in providers, f"the {hca} verbs provider should be installed: {providers}"


def test_pytorch_version_is_declared_for_enroot(run_in_image):
    """Container should set PYTORCH_VERSION (enroot's hook sets RANK/WORLD_SIZE only then)."""
    script = "import os, torch; print('env', os.environ.get('PYTORCH_VERSION'), 'torch', torch.__version__)"
    code, out = run_in_image(["python", "-c", script])
    m = re.search(r"^env (\S+) torch ([^+\s]+)", out, re.MULTILINE)
    assert code == 0 and m, f"the check should run:\n{out}"
    assert m.group(1) == m.group(2), f"PYTORCH_VERSION should be torch's version: {m.groups()}"


def test_tini_reaps_without_warning_when_it_is_not_pid_1(run_in_image):
    """Container should run its tini as a subreaper, so it works (and is quiet) under another init."""
    # --init puts Docker's own init at PID 1, as Apptainer/enroot put something else there.
    code, out = run_in_image(["bash", "-c", "echo PID1=$(cat /proc/1/comm)"], init=True)
    assert code == 0 and "PID1=docker-init" in out, f"the command should run under Docker's init:\n{out}"
    assert "not running as PID 1" not in out and "subreaper" not in out, f"tini should not warn:\n{out}"
