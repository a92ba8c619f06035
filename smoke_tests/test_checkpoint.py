"""Checkpoints: state saved mid-AMP-training loads into a plain fp32 setup unchanged."""
import io

import torch
from smokelib import amp_train_step, regression_data, tiny_mlp


def test_amp_checkpoint_loads_without_amp_with_the_same_weights(device):
    """Model, optimizer and GradScaler state saved under AMP must load on CPU without AMP, equal."""
    x, y = regression_data(device)
    model = tiny_mlp(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 8)
    for _ in range(3):
        amp_train_step(model, opt, scaler, x, y)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "scaler": scaler.state_dict()}, buf)

    buf.seek(0)
    ckpt = torch.load(buf, map_location="cpu", weights_only=True)
    restored = tiny_mlp("cpu", seed=1)  # different initial weights: loading must overwrite them
    restored.load_state_dict(ckpt["model"])
    restored_opt = torch.optim.Adam(restored.parameters(), lr=1e-2)
    restored_opt.load_state_dict(ckpt["optimizer"])
    restored_scaler = torch.amp.GradScaler("cpu")
    restored_scaler.load_state_dict(ckpt["scaler"])

    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
        assert b.dtype == torch.float32, f"{name} loaded as {b.dtype}, want fp32"
        assert torch.equal(a.cpu(), b), f"{name} changed in the checkpoint round-trip"
    saved_state, loaded_state = opt.state_dict()["state"], restored_opt.state_dict()["state"]
    for idx, state in saved_state.items():
        for key, value in state.items():
            assert torch.equal(value.cpu(), loaded_state[idx][key].cpu()), f"optimizer {key} of param {idx} changed"
    assert restored_scaler.get_scale() == scaler.get_scale(), (
        f"GradScaler scale {scaler.get_scale()} came back as {restored_scaler.get_scale()}")
    with torch.no_grad():
        # GPU and CPU fp32 kernels sum in different orders: allow float32 rounding, no more.
        assert torch.allclose(model(x).cpu(), restored(x.cpu()), rtol=1e-4, atol=1e-4), (
            "the restored fp32 model predicts differently from the trained one")
