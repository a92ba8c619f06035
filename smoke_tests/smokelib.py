"""Helpers shared by the smoke tests: expected-version files, tiny deterministic data and models,
the AMP training step in the order the PyTorch AMP recipe prescribes, multi-process workers.

Kept free of pytest so that processes started by torch.multiprocessing can import it."""
import datetime
import json
import pathlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VERSION_KEYS = ("torch", "torchvision", "torchaudio", "cuda", "cudnn", "nccl", "python")


def load_expectations(path):
    """Expected versions from a JSON file, keyed torch/torchvision/torchaudio/cuda/cudnn/nccl/python."""
    data = json.loads(pathlib.Path(path).read_text())
    if isinstance(data, list):  # `docker inspect IMAGE` output
        data = data[0]["Config"]["Labels"]
    out = {}
    for key, value in data.items():
        if key.startswith("team.") and key.endswith(".version"):
            key = key[len("team."):-len(".version")]
        if key in VERSION_KEYS and isinstance(value, str) and value:
            out[key] = value
    return out


def regression_data(device, n=256, features=16, seed=0):
    """A noiseless linear regression problem: a small MLP can fit it in a few steps."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    return x.to(device), (x @ w).to(device)


def tiny_mlp(device, features=16, hidden=64, seed=0):
    """An fp32 MLP with a LayerNorm, so that autocast has both half and fp32 ops to place."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(features, hidden), nn.LayerNorm(hidden), nn.ReLU(), nn.Linear(hidden, 1),
    ).to(device)


def amp_train_step(model, optimizer, scaler, x, y, dtype=torch.float16, max_norm=1.0,
                   inject_inf=False):
    """One mixed-precision step: scale -> backward -> unscale_ -> clip_grad_norm_ -> step -> update.

    unscale_ must come before clipping so that max_norm applies to the true gradients, not to
    gradients multiplied by the loss scale. Returns (loss, total gradient norm before clipping)."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        loss = F.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    if inject_inf:
        # What an fp16 overflow in the backward pass looks like to the scaler.
        next(model.parameters()).grad.view(-1)[0] = float("inf")
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach(), norm.detach()


class RandomImages(torch.utils.data.Dataset):
    """Image-sized samples, each reproducible from its index, so a test can check contents."""

    def __init__(self, length, shape=(3, 128, 128)):
        self.length, self.shape = length, shape

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return self.sample(index, self.shape), index

    @staticmethod
    def sample(index, shape):
        return torch.randn(shape, generator=torch.Generator().manual_seed(index))


def one_rank_collective_problems(device):
    """Run, in a one-rank process group, collectives whose result a no-op cannot give; return
    what came out wrong (empty: all right).

    With one rank an all_reduce(SUM) returns its input unchanged, so it cannot tell NCCL from a
    collective that does nothing. These can: all_gather_into_tensor and reduce_scatter_tensor
    write into a separate output buffer (a no-op leaves it NaN), and NCCL's PREMUL_SUM
    all_reduce multiplies each rank's input by a factor before summing (one rank: 3x input)."""
    src = torch.arange(1, 9, dtype=torch.float32, device=device)
    got = {}
    gathered = torch.full_like(src, float("nan"))
    dist.all_gather_into_tensor(gathered, src)
    got["all_gather_into_tensor"] = (gathered, src)
    scattered = torch.full_like(src, float("nan"))
    dist.reduce_scatter_tensor(scattered, src)
    got["reduce_scatter_tensor"] = (scattered, src)
    tripled = src.clone()
    dist.all_reduce(tripled, op=dist._make_nccl_premul_sum(3.0))
    got["all_reduce(PREMUL_SUM x3)"] = (tripled, src * 3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {name: f"gave {have.tolist()}, want {want.tolist()}"
            for name, (have, want) in got.items() if not torch.equal(have, want)}


def all_reduce_worker(rank, world_size, backend, init_file, out_dir):
    """Rank r contributes r+1 to an all_reduce(SUM) and writes what it got back to out_dir."""
    # One GPU per rank, selected before NCCL creates its communicator on the current device.
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        t = torch.full((8,), float(rank + 1), device=device)
        dist.all_reduce(t)
        pathlib.Path(out_dir, f"rank{rank}.json").write_text(json.dumps(t.cpu().tolist()))
    finally:
        dist.destroy_process_group()
