"""torch.compile: a small model compiles (Inductor) and trains like the eager one."""
import torch
import torch.nn.functional as F
from smokelib import regression_data, tiny_mlp


def test_compiled_model_trains_a_step_like_eager(device):
    """A torch.compile'd MLP must give the eager loss and gradients, and its step must change weights."""
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
