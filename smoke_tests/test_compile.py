"""torch.compile: a small model compiles (Inductor) and trains like the eager one."""
import os
import shutil

import pytest
import torch
import torch.nn.functional as F
from smokelib import regression_data, tiny_mlp


def pytest_generate_tests(metafunc):
    # Compile where training will run: on a GPU host only the GPU, since Inductor's C++ build
    # for a CPU variant adds 10-100 s and the whole suite must stay under a minute there.
    # A CPU-only host runs the CPU variant and shows the GPU one as skipped.
    if "compile_device" in metafunc.fixturenames:
        gpu = pytest.param("cuda", marks=pytest.mark.gpus(1))
        metafunc.parametrize("compile_device", [gpu] if torch.cuda.is_available() else ["cpu", gpu])


def test_compiled_model_trains_a_step_like_eager(compile_device):
    """A torch.compile'd MLP must give the eager loss and gradients, and its step must change weights."""
    device = torch.device(compile_device)
    # Inductor builds C++ for CPU kernels; Triton builds a C launcher for GPU kernels.
    env, names = ("CXX", ("g++", "c++", "clang++")) if device.type == "cpu" else ("CC", ("cc", "gcc", "clang"))
    compilers = [os.environ[env]] if os.environ.get(env) else [n for n in names if shutil.which(n)]
    assert compilers, f"torch.compile on {device} needs a compiler: set {env} or install one of {names}"
    x, y = regression_data(device, n=64)
    eager, compiled_src = tiny_mlp(device), tiny_mlp(device)
    compiled = torch.compile(compiled_src)
    opt = torch.optim.SGD(compiled_src.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in compiled_src.parameters()]

    loss = F.mse_loss(compiled(x), y)
    loss.backward()
    ref = F.mse_loss(eager(x), y)
    ref.backward()
    opt.step()

    assert torch.allclose(loss, ref, rtol=1e-3, atol=1e-4), (
        f"compiled loss {loss.item()} differs from eager {ref.item()}")
    for (name, p), q in zip(compiled_src.named_parameters(), eager.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-4), f"gradient of {name} differs from eager"
    moved = [not torch.equal(a, b) for a, b in zip(before, compiled_src.parameters())]
    assert all(moved), "optimizer.step() after a compiled backward left some weights unchanged"
