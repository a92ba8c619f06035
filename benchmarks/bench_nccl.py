#!/usr/bin/env python3
"""NCCL all-reduce bandwidth across the GPUs of one host, in the units nccl-tests prints.

    torchrun --nproc-per-node 2 benchmarks/bench_nccl.py            # 1 MiB .. 1 GiB, float32
    torchrun --nproc-per-node 8 benchmarks/bench_nccl.py --json out.json

For each message size: the median time of --iters timed all-reduces (after --warmup untimed ones),
algbw = bytes / time and busbw = algbw * 2 (n - 1) / n: the figure to compare with the link's
peak, because a ring all-reduce moves 2 (n - 1) / n of the message over each link (the formula
nccl-tests documents in doc/PERFORMANCE.md). Rank 0 prints the table and, where nvidia-smi can
tell, the NVLink peak of GPU 0 beside it. With one process busbw is 0 by definition: the script
still runs (a dry run of the set-up), and says so.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

import torch
import torch.distributed as dist


def sizes(low, high):
    size = low
    while size <= high:
        yield size
        size *= 2


def nvlink_peak_gbs():
    """Sum of GPU 0's active NVLink links' speeds (GB/s per direction), or None if unknown."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "nvlink", "-s", "-i", "0"], capture_output=True,
                             text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    speeds = [float(v) for v in re.findall(r"Link \d+: ([\d.]+) GB/s", out)]
    return sum(speeds) if speeds else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    args = p.parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit("run under torchrun, e.g. torchrun --nproc-per-node 2 benchmarks/bench_nccl.py")
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible: NCCL bandwidth needs GPUs")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        times = []
        for _ in range(args.iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(buf)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        # The slowest rank bounds a collective: take the max of the per-rank medians.
        t = torch.tensor([statistics.median(times)], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        seconds = t.item()
        algbw = nbytes / seconds / 1e9
        rows.append({"bytes": nbytes, "time_us": seconds * 1e6, "algbw_gbs": algbw,
                     "busbw_gbs": algbw * 2 * (world - 1) / world})
        del buf
    if rank == 0:
        peak = nvlink_peak_gbs()
        print(f"NCCL all_reduce, float32, {world} GPU(s) ({torch.cuda.get_device_name()}), "
              f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, torch {torch.__version__}")
        print(f"{'size':>10} {'time (us)':>12} {'algbw GB/s':>11} {'busbw GB/s':>11}")
        for r in rows:
            print(f"{r['bytes']:>10} {r['time_us']:>12.1f} {r['algbw_gbs']:>11.1f} {r['busbw_gbs']:>11.1f}")
        print(f"NVLink peak of GPU 0 per direction: {f'{peak:.0f} GB/s' if peak else 'unknown'}")
        if world == 1:
            print("one process: busbw is 0 by definition (nothing crosses a link); a set-up dry run")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world, "nvlink_peak_gbs": peak, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
