"""A few steps of Lightning's own training loop on the CPU in bf16 mixed precision
(Trainer(precision="bf16-mixed")), on a tiny regression model. Prints one JSON line: the losses,
the dtype the model's output had under Lightning's autocast, whether the weights moved, and the
versions, for the host test to judge."""
import json
import tempfile

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.losses, self.output_dtypes = [], set()

    def training_step(self, batch, _):
        x, y = batch
        out = self.net(x)
        self.output_dtypes.add(str(out.dtype))
        loss = nn.functional.mse_loss(out.float(), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
data = DataLoader(TensorDataset(torch.randn(64, 16), torch.randn(64, 1)), batch_size=8)
model = Tiny()
before = model.net[0].weight.detach().clone()
with tempfile.TemporaryDirectory() as root:
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", max_steps=4,
                        default_root_dir=root, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, data)
print(json.dumps({
    "losses": model.losses, "steps": trainer.global_step, "output_dtypes": sorted(model.output_dtypes),
    "weight_dtype": str(model.net[0].weight.dtype), "weights_moved": not torch.equal(before, model.net[0].weight),
    "precision": str(trainer.precision), "torch": torch.__version__, "lightning": L.__version__,
}))
