"""cuDNN: enabled and running a convolution forward and backward with autotuning on."""
import pytest
import torch
import torch.nn.functional as F


@pytest.mark.gpus(1)
def test_cudnn_is_enabled_and_reports_a_version():
    """cuDNN must be available to torch, enabled, and accept a CUDA float tensor."""
    assert torch.backends.cudnn.is_available(), "torch cannot load cuDNN"
    assert torch.backends.cudnn.enabled, "torch.backends.cudnn.enabled is False"
    assert torch.backends.cudnn.version() > 0, "cuDNN reports no version"
    x = torch.randn(1, 3, 8, 8, device="cuda")
    assert torch.backends.cudnn.is_acceptable(x), "cuDNN does not accept a CUDA float32 tensor"


@pytest.mark.gpus(1)
def test_cudnn_conv2d_forward_and_backward_with_benchmark_match_cpu():
    """Conv2d with cudnn.benchmark=True must give the CPU's output and gradients."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 3, 32, 32, generator=g)
    w = torch.randn(16, 3, 3, 3, generator=g)
    upstream = torch.randn(8, 16, 32, 32, generator=g)

    def run(device):
        xd, wd = x.to(device).requires_grad_(), w.to(device).requires_grad_()
        out = F.conv2d(xd, wd, padding=1)
        out.backward(upstream.to(device))
        return out.detach().cpu(), xd.grad.cpu(), wd.grad.cpu()

    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        gpu = run("cuda")
        torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.benchmark = previous
    cpu = run("cpu")
    # cuDNN may pick TF32 algorithms (10-bit mantissa): allow 1% of each result's magnitude.
    for name, a, b in zip(("output", "input grad", "weight grad"), gpu, cpu):
        assert (a - b).abs().max() <= 1e-2 * b.abs().max(), (
            f"cuDNN conv2d {name} differs from CPU by {(a - b).abs().max().item()}")
