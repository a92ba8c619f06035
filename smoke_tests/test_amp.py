"""AMP as the PyTorch recipe prescribes: autocast places each op, GradScaler guards fp16 steps.

fp16 autocast + GradScaler also run on CPU (torch.amp.GradScaler("cpu")), so a CPU-only CI still
proves the step logic; bf16 is the CPU default for the dtype-placement tests."""
import ast
import importlib.util
import pathlib

import pytest
import torch
import torch.nn.functional as F
from smokelib import amp_train_step, regression_data, tiny_mlp

HALF = {"cpu": torch.bfloat16, "cuda": torch.float16}  # each device's default autocast dtype


def _inputs(device):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 32, generator=g), torch.randn(32, 32, generator=g)
    img, kernel = torch.randn(2, 3, 16, 16, generator=g), torch.randn(4, 3, 3, 3, generator=g)
    return x.to(device), w.to(device), img.to(device), kernel.to(device)


HALF_OPS = {
    "matmul": lambda x, w, img, k: x @ w,
    "linear": lambda x, w, img, k: F.linear(x, w),
    "conv2d": lambda x, w, img, k: F.conv2d(img, k),
}
FP32_OPS = {
    "softmax": lambda h: F.softmax(h, dim=-1),
    "log_softmax": lambda h: F.log_softmax(h, dim=-1),
    "layer_norm": lambda h: F.layer_norm(h, h.shape[-1:]),
    "mse_loss": lambda h: F.mse_loss(h, torch.zeros_like(h, dtype=torch.float32)),
    "cross_entropy": lambda h: F.cross_entropy(h, torch.zeros(h.shape[0], dtype=torch.long, device=h.device)),
}
CUDA = pytest.mark.gpus(1)
# CPU autocast's policy keeps softmax/log_softmax/layer_norm in the input dtype (only CUDA's
# promotes them to fp32), so on CPU only the losses are checked.
FP32_CASES = [pytest.param("cuda", op, marks=CUDA, id=f"cuda-{op}") for op in FP32_OPS] + [
    pytest.param("cpu", op, id=f"cpu-{op}") for op in ("mse_loss", "cross_entropy")]


@pytest.mark.parametrize("op", HALF_OPS)
def test_autocast_runs_matmul_and_conv_in_half_precision(device, op):
    """Under autocast, matmul/linear/conv2d on fp32 inputs must produce the device's half dtype."""
    inputs = _inputs(device)
    with torch.autocast(device.type, dtype=HALF[device.type]):
        out = HALF_OPS[op](*inputs)
    assert out.dtype == HALF[device.type], f"{op} under autocast on {device} gave {out.dtype}"


@pytest.mark.parametrize("device_type,op", FP32_CASES)
def test_autocast_keeps_softmax_layer_norm_and_losses_in_fp32(device_type, op):
    """Under autocast, numerically sensitive ops must run in fp32 even on half-precision inputs."""
    x, w, _, _ = _inputs(device_type)
    with torch.autocast(device_type, dtype=HALF[device_type]):
        hidden = x @ w  # half precision, as a real network's activations would be
        out = FP32_OPS[op](hidden)
    assert hidden.dtype == HALF[device_type], f"matmul gave {hidden.dtype}, expected half"
    assert out.dtype == torch.float32, f"{op} under autocast on {device_type} gave {out.dtype}"


def test_fp16_grad_scaler_training_lowers_the_loss_and_keeps_fp32_weights(device):
    """fp16 autocast + GradScaler must lower the loss, while the weights stay fp32 (no .half())."""
    x, y = regression_data(device)
    model = tiny_mlp(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device.type)
    losses = [amp_train_step(model, opt, scaler, x, y)[0].item() for _ in range(30)]
    # The scaler may skip the first steps while it backs off from 2**16: judge the trend.
    assert losses[-1] < 0.5 * losses[0], f"loss did not fall under fp16 AMP on {device}: {losses}"
    dtypes = {p.dtype for p in model.parameters()}
    assert dtypes == {torch.float32}, f"AMP must keep master weights in fp32, found {dtypes}"


def test_gradients_are_unscaled_before_clipping(device):
    """clip_grad_norm_ must see the true gradient norm (as in fp32), not one times the scale."""
    x, y = regression_data(device)
    reference = tiny_mlp(device)
    F.mse_loss(reference(x), y).backward()
    true_norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in reference.parameters()]))
    model = tiny_mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # A modest scale, so that this first step cannot overflow and be skipped.
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 8)
    _, seen = amp_train_step(model, opt, scaler, x, y)
    assert torch.isfinite(seen), f"unexpected overflow at scale 2**8 on {device}"
    assert torch.isclose(seen, true_norm, rtol=0.05), (
        f"clip_grad_norm_ saw {seen.item():.4g}, the fp32 gradient norm is {true_norm.item():.4g} "
        f"(scale {scaler.get_scale():g}): unscale_ must come before clipping")


def test_injected_inf_gradient_skips_the_step_and_lowers_the_scale(device):
    """An inf gradient must make GradScaler skip optimizer.step() and reduce the loss scale."""
    x, y = regression_data(device)
    model = tiny_mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 8)
    amp_train_step(model, opt, scaler, x, y)  # a normal step first: the scaler has state
    before = [p.detach().clone() for p in model.parameters()]
    scale_before = scaler.get_scale()
    amp_train_step(model, opt, scaler, x, y, inject_inf=True)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert unchanged, f"optimizer.step() ran despite an inf gradient on {device}"
    assert scaler.get_scale() < scale_before, (
        f"scale went {scale_before:g} -> {scaler.get_scale():g}; it must drop after an inf")


def test_bf16_autocast_trains_without_a_grad_scaler(device):
    """bf16 autocast needs no scaler: plain backward/step must lower the loss."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip(f"{torch.cuda.get_device_name()} has no bf16 support")
    x, y = regression_data(device)
    model = tiny_mlp(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            pred = model(x)
            loss = F.mse_loss(pred, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert pred.dtype == torch.bfloat16, f"bf16 autocast produced {pred.dtype} outputs"
    assert losses[-1] < 0.5 * losses[0], f"loss did not fall under bf16 autocast: {losses}"


def _half_calls(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "half"]


def test_amp_code_never_casts_models_by_hand():
    """No `.half()` call anywhere in the suite, train_amp.py or its package: autocast does the
    casting."""
    here = pathlib.Path(__file__).resolve().parent
    files = sorted(here.glob("*.py"))
    files += [p for p in (here.parent / "train_amp.py", pathlib.Path("/usr/local/bin/train_amp.py"))
              if p.is_file()]
    package = here.parent / "trainamp"
    if not package.is_dir():  # in the image: installed in the venv's site-packages
        spec = importlib.util.find_spec("trainamp")
        package = pathlib.Path(spec.origin).parent if spec else None
    files += sorted(package.rglob("*.py")) if package else []
    found = [hit for f in files for hit in _half_calls(f)]
    assert not found, f"manual .half() casts (use torch.autocast instead): {found}"
