"""Collectives: NCCL on GPUs (one process; several with >= 2 GPUs), gloo on CPU as its stand-in."""
import datetime
import json
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from smokelib import all_reduce_worker, one_rank_collective_problems


def spawn_all_reduce(backend, world_size, tmp_path, timeout=120):
    """Run all_reduce_worker in world_size spawned processes; return each rank's result."""
    ctx = mp.spawn(all_reduce_worker, args=(world_size, backend, tmp_path / "init", tmp_path),
                   nprocs=world_size, join=False)
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{backend} all_reduce over {world_size} processes hung for {timeout}s")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]


def test_gloo_all_reduce_across_two_processes_sums(tmp_path):
    """Two CPU processes over gloo must each end with the sum of both ranks' values."""
    world = 2
    results = spawn_all_reduce("gloo", world, tmp_path)
    want = float(sum(range(1, world + 1)))
    assert all(v == want for r in results for v in r), f"gloo all_reduce gave {results}, want {want}"


@pytest.mark.gpus(1)
def test_nccl_collectives_in_one_process_move_data(tmp_path):
    """A one-rank NCCL process group must run collectives whose results a no-op cannot give."""
    assert dist.is_nccl_available(), "this torch build has no NCCL backend"
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=60))
    try:
        assert dist.get_backend() == "nccl", f"the process group uses {dist.get_backend()}"
        wrong = one_rank_collective_problems(torch.device("cuda", torch.cuda.current_device()))
        assert not wrong, f"one-rank NCCL collectives gave wrong results: {wrong}"
    finally:
        dist.destroy_process_group()


def test_one_rank_collective_check_catches_collectives_that_do_nothing(monkeypatch):
    """The one-rank NCCL check should report every collective replaced by a no-op."""
    # A mutation check of the test above, on the CPU: no process group is needed for no-ops.
    for name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"):
        monkeypatch.setattr(dist, name, lambda *a, **k: None)
    monkeypatch.setattr(dist, "_make_nccl_premul_sum", lambda factor: None)
    wrong = one_rank_collective_problems(torch.device("cpu"))
    assert set(wrong) == {"all_gather_into_tensor", "reduce_scatter_tensor",
                          "all_reduce(PREMUL_SUM x3)"}, f"no-op collectives went unnoticed: {wrong}"


@pytest.mark.gpus(2)
def test_nccl_all_reduce_across_processes_sums(tmp_path):
    """One process per GPU over NCCL must each end with the sum of all ranks' values."""
    world = min(torch.cuda.device_count(), 8)
    results = spawn_all_reduce("nccl", world, tmp_path)
    want = float(sum(range(1, world + 1)))
    assert all(v == want for r in results for v in r), f"NCCL all_reduce gave {results}, want {want}"
