"""torch.compile: a small model compiles (Inductor) and trains like the eager one."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from smokelib import regression_data, tiny_mlp
from torch._dynamo.utils import counters


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
    # Counted from here: equal results alone would also pass if torch.compile ran eagerly
    # (TORCH_COMPILE_DISABLE=1, a broken backend that falls back).
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(compiled_src)
    opt = torch.optim.SGD(compiled_src.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in compiled_src.parameters()]

    loss = F.mse_loss(compiled(x), y)
    loss.backward()
    ref = F.mse_loss(eager(x), y)
    ref.backward()
    opt.step()

    graphs, inductor = counters["stats"]["unique_graphs"], dict(counters["inductor"])
    assert graphs > 0 and inductor, (
        f"torch.compile compiled no graph ({graphs} graphs, Inductor counters {inductor}): the"
        f" model ran eagerly (TORCH_COMPILE_DISABLE={os.environ.get('TORCH_COMPILE_DISABLE')!r})")
    assert torch.allclose(loss, ref, rtol=1e-3, atol=1e-4), (
        f"compiled loss {loss.item()} differs from eager {ref.item()}")
    for (name, p), q in zip(compiled_src.named_parameters(), eager.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-4), f"gradient of {name} differs from eager"
    moved = [not torch.equal(a, b) for a, b in zip(before, compiled_src.parameters())]
    assert all(moved), "optimizer.step() after a compiled backward left some weights unchanged"


def test_compile_check_fails_when_compilation_is_disabled():
    """The compile test above should fail, not pass eagerly, under TORCH_COMPILE_DISABLE=1."""
    # A mutation check of the check: the same test in a child pytest with compilation off
    # (fast: nothing compiles). SMOKE_* settings (reports, --require-gpu) are not passed on.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMOKE_")}
    env["TORCH_COMPILE_DISABLE"] = "1"
    node = f"{pathlib.Path(__file__).resolve()}::test_compiled_model_trains_a_step_like_eager"
    r = subprocess.run([sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider"],
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "torch.compile compiled no graph" in out, (
        f"with TORCH_COMPILE_DISABLE=1 the compile test should fail naming the eager run;"
        f" it exited {r.returncode}:\n{out[-3000:]}")
