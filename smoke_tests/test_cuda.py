"""CUDA: every visible GPU does real work, not just torch.cuda.is_available()."""
import os
import shutil
import subprocess

import pytest
import torch


@pytest.mark.gpus(1)
def test_cuda_sees_the_expected_number_of_gpus(pytestconfig, required_gpus):
    """torch must see as many GPUs as asked for (or as nvidia-smi lists), and at least one."""
    count = torch.cuda.device_count()
    assert count >= max(1, required_gpus), f"{count} GPU(s) visible, {required_gpus} required"
    expected = pytestconfig.getoption("expect_gpus")
    if expected is None and shutil.which("nvidia-smi") and "CUDA_VISIBLE_DEVICES" not in os.environ:
        listed = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=60)
        # MIG slices are listed under their GPU but CUDA enumerates them differently: skip those.
        if listed.returncode == 0 and "MIG" not in listed.stdout:
            expected = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    if expected is not None:
        assert count == expected, f"torch sees {count} GPU(s), expected {expected}"


@pytest.mark.gpus(1)
def test_tensor_op_and_copy_to_host_on_every_gpu(gpu_index):
    """A matmul on each GPU must match the CPU result after a device-to-host copy."""
    g = torch.Generator().manual_seed(gpu_index)
    a, b = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    dev = torch.device("cuda", gpu_index)
    on_gpu = a.to(dev) @ b.to(dev)
    host = torch.empty_like(on_gpu, device="cpu").pin_memory()
    host.copy_(on_gpu, non_blocking=True)
    torch.cuda.synchronize(dev)
    # TF32 may be on for matmuls: allow its ~1e-3 relative error.
    assert torch.allclose(host, a @ b, rtol=1e-2, atol=1e-1), (
        f"cuda:{gpu_index} matmul differs from CPU by {(host - a @ b).abs().max().item()}")


@pytest.mark.gpus(1)
def test_gpu_compute_capability_is_in_the_arch_list(gpu_index):
    """torch must ship kernels (SASS of the same major, or PTX to JIT) for each GPU's capability."""
    major, minor = torch.cuda.get_device_capability(gpu_index)
    arches = torch.cuda.get_arch_list()
    sass = [a for a in arches if a.startswith("sm_")]
    ptx = [a for a in arches if a.startswith("compute_")]

    def cap(arch):
        digits = arch.split("_")[1].rstrip("af")
        return int(digits[:-1]), int(digits[-1])

    # Cubins run on later minors of the same major; arch-specific ones (sm_90a) need the exact one.
    runs = [a for a in sass if cap(a)[0] == major and cap(a)[1] <= minor
            and (not a.endswith(("a", "f")) or cap(a) == (major, minor))]
    jit = [a for a in ptx if cap(a) <= (major, minor)]
    assert runs or jit, (
        f"cuda:{gpu_index} is sm_{major}{minor} ({torch.cuda.get_device_name(gpu_index)}); "
        f"torch was built for {arches}")
