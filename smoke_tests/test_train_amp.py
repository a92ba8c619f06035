"""train_amp.py's own fp16 step on the GPU: a step the GradScaler skips for overflow must leave
the weights and the optimizer untouched, and training must go on with finite weights.

Guards a real failure: torch 2.11's fused SGD advanced its momentum on skipped steps, so the
routine first-step overflow turned every weight into NaN (LibreYOLO/libreyolo#771)."""
import importlib
import pathlib
import sys

import pytest
import torch
import torch.nn.functional as F


def _train_amp():
    """train_amp imported the one documented way (see the top of train_amp.py): its folder
    first on sys.path. It is beside smoke_tests/ in the repository, in /usr/local/bin in the
    image."""
    here = pathlib.Path(__file__).resolve().parent
    for folder in (here.parent, pathlib.Path("/usr/local/bin")):
        if (folder / "train_amp.py").is_file():
            sys.path.insert(0, str(folder))
            return importlib.import_module("train_amp")
    pytest.skip("train_amp.py is neither beside smoke_tests/ nor in /usr/local/bin")


@pytest.mark.gpus(1)
def test_train_amp_fp16_overflow_step_is_skipped_and_training_stays_finite():
    """train_amp's fp16 step should skip an overflow step cleanly and then train on."""
    ta = _train_amp()
    dev = torch.device("cuda", 0)
    args = ta.build_parser().parse_args(["--amp", "fp16"])
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    opt = ta.make_optimizer(net, args, 0.05, dev, torch.float16)
    # A loss scale far beyond fp16's range: the first backward overflows, as real runs often do.
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 40)
    x, y = torch.randn(256, 32, device=dev), torch.randint(4, (256,), device=dev)
    before = [p.detach().clone() for p in net.parameters()]
    ta.train_step(net, x, y, opt, scaler, torch.float16, 1.0, "cuda")
    assert scaler.get_scale() < 2.0 ** 40, "the scaler should have lowered its scale after an overflow"
    for b, p in zip(before, net.parameters()):
        assert torch.equal(b, p.detach()), "a skipped step changed the weights"
    first = F.cross_entropy(net(x).float(), y).item()
    for _ in range(60):
        loss, _ = ta.train_step(net, x, y, opt, scaler, torch.float16, 1.0, "cuda")
    assert all(torch.isfinite(p).all() for p in net.parameters()), "weights went non-finite after a skipped step"
    assert loss.item() < first, f"loss should fall after the skipped step: {first:.4f} -> {loss.item():.4f}"
