"""A few training steps of a timm model (resnet18, random weights, tiny images) on the CPU under
torch.autocast("cpu", dtype=torch.bfloat16), with timm's own optimizer factory. Prints one JSON
line: the losses, the logits' dtype under autocast, whether gradients were finite and the weights
moved, and the versions, for the host test to judge."""
import json

import timm
import timm.optim
import torch
from torch import nn

torch.manual_seed(0)
model = timm.create_model("resnet18", pretrained=False, num_classes=10)
optimizer = timm.optim.create_optimizer_v2(model, opt="adamw", lr=1e-3)
x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
before = model.fc.weight.detach().clone()
losses, dtypes, grads_finite = [], set(), True
for _ in range(3):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
    dtypes.add(str(logits.dtype))
    optimizer.zero_grad()
    loss.backward()
    grads_finite &= all(torch.isfinite(p.grad).all().item() for p in model.parameters() if p.grad is not None)
    optimizer.step()
    losses.append(loss.item())
print(json.dumps({
    "losses": losses, "output_dtypes": sorted(dtypes), "grads_finite": grads_finite,
    "weight_dtype": str(model.fc.weight.dtype), "weights_moved": not torch.equal(before, model.fc.weight),
    "torch": torch.__version__, "timm": timm.__version__,
}))
