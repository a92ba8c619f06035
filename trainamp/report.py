"""--benchmark (images/s and peak memory of training steps on one synthetic batch) and
--compare (the same job in FP32 and with AMP: a markdown table, compare.json/.md/.png)."""
import argparse
import dataclasses
import json
import math
import pathlib
import time

import torch

from .amp import (
    amp_name,
    cpu_bf16,
    make_optimizer,
    make_scaler,
    resolve_amp,
    train_step,
)
from .errors import GiB, UsageError
from .launch import Ranks
from .model import (
    build_model,
    configure_backends,
    cuda_graph_skips,
    device_name,
    peak_mem_gib,
    set_seed,
    sync,
    tuning_on,
    use_channels_last,
    wrap_model,
)
from .plan import resolve_plan
from .trainer import train


def benchmark(args, device, ranks=None, plan=None):
    """Images/s and peak memory of training steps on one synthetic batch already on the device.
    Used by --benchmark and by benchmarks/bench_amp.py (in-process, one config at a time)."""
    ranks = ranks or Ranks()
    plan = plan or resolve_plan(args, device, ranks)
    amp_dtype = plan.amp_dtype
    configure_backends(args, device)
    set_seed(args.seed)
    num_classes = args.num_classes or 1000
    net = build_model(args.model, num_classes, args.image_size).to(device)
    channels_last = use_channels_last(args, device, net)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    model, compiled, graphs = wrap_model(net, plan, ranks)
    skips = cuda_graph_skips() if graphs else 0
    optimizer = make_optimizer(net, args, 0.1 * args.batch_size / 256, device, amp_dtype)
    scaler = make_scaler(device, amp_dtype)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    y = torch.randint(num_classes, (args.batch_size,), device=device)
    warm = args.warmup_steps if args.warmup_steps is not None else (20 if compiled else 10)
    steps = args.steps or 30

    def timed(n):
        """n training steps, the device synchronised after: (last loss, seconds)."""
        t0 = time.perf_counter()
        for _ in range(n):
            loss, _ = train_step(model, x, y, optimizer, scaler, amp_dtype, args.grad_clip,
                                 device.type, graphs)
        sync(device)
        return loss, time.perf_counter() - t0

    _, warm_s = timed(warm)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    loss, dt = timed(steps)
    loss_v = loss.item()
    return {"model": args.model, "batch_size": args.batch_size, "image_size": args.image_size,
            "amp": amp_name(amp_dtype), "tf32": args.tf32, "channels_last": channels_last,
            "compile": compiled, "compile_tuned": compiled and tuning_on(),
            "cuda_graphs": graphs and cuda_graph_skips() == skips,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "device": device_name(device), "world_size": ranks.world,
            "images_per_s": steps * args.batch_size * ranks.world / dt,
            "step_ms": 1000 * dt / steps, "warmup_s": warm_s, "measured_steps": steps,
            "peak_mem_gib": peak_mem_gib(device, graphs),
            "peak_reserved_gib": (torch.cuda.max_memory_reserved(device) / GiB
                                  if device.type == "cuda" else None),
            "loss_is_finite": math.isfinite(loss_v),
            "torch": torch.__version__}


def run_benchmark(args, ranks, plan):
    result = benchmark(args, plan.device, ranks, plan)
    mem = (f"{result['peak_mem_gib']:.2f} GiB" if result["peak_mem_gib"] is not None
           else "n/a (CPU)")
    ranks.print_on_main(
        f"benchmark {result['model']} batch {result['batch_size']} {result['image_size']}px"
        f" amp={result['amp']} tf32={result['tf32']} channels_last={result['channels_last']}"
        f" compile={result['compile']}{' (tuned)' if result['compile_tuned'] else ''} on"
        f" {result['device']}: {result['images_per_s']:.1f} images/s,"
        f" {result['step_ms']:.1f} ms/step, peak mem {mem}")
    if ranks.main:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "benchmark.json").write_text(json.dumps(result, indent=2))


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def compare(args, ranks, plan, stop):
    """Train the job twice, in FP32 (TF32 off) and with the Plan's AMP; print and write the
    report (rank 0) -> its result dict."""
    out, device = pathlib.Path(args.out), plan.device
    # What --compare measures on a CPU with --amp auto: bf16, even where it is emulated (warned).
    amp = "bf16" if args.amp == "auto" and device.type == "cpu" else args.amp
    amp_dtype = plan.amp_dtype if amp == args.amp else resolve_amp(amp, device)
    if amp_dtype is None:
        raise UsageError("--compare with --amp off has nothing to compare: use --amp auto,"
                         " bf16 or fp16")
    # Comparison runs are measurements: no checkpoints, no resume.
    common = {**vars(args), "checkpoint_dir": "", "resume": None}
    jobs = {"fp32": (argparse.Namespace(**{**common, "amp": "off", "tf32": False}),
                     dataclasses.replace(plan, amp_dtype=None)),
            "amp": (argparse.Namespace(**{**common, "amp": amp}),
                    dataclasses.replace(plan, amp_dtype=amp_dtype))}
    runs = {}
    for key, (a, p) in jobs.items():
        if device.type == "cuda":
            torch.cuda.empty_cache()
        runs[key] = train(a, ranks, device, stop, label=f"[compare {key}]", plan=p)
    if not ranks.main:
        return None
    f, m = runs["fp32"]["final"], runs["amp"]["final"]

    def acc(r):
        return r.get("val_acc", r["train_acc"])

    def loss(r):
        return r.get("val_loss", r["train_loss"])

    acc_kind = "validation" if "val_acc" in f else "training"
    rows = [("images/s", f["images_per_s"], m["images_per_s"], ".0f"),
            ("epoch time (s)", f["epoch_time_s"], m["epoch_time_s"], ".2f"),
            ("peak GPU memory (GiB)", f["peak_mem_gib"], m["peak_mem_gib"], ".2f"),
            (f"final {acc_kind} loss", loss(f), loss(m), ".4f"),
            (f"final {acc_kind} accuracy (%)", acc(f), acc(m), ".2f")]
    aname = amp_name(amp_dtype)
    table = [f"| metric | FP32 (TF32 off) | AMP {aname} | AMP/FP32 |", "|---|---:|---:|---:|"]
    for name, a, b, spec in rows:
        r = ratio(b, a) if "accuracy" not in name else None
        extra = fmt(r, ".2f") + "x" if r is not None else (
            f"{b - a:+.2f} pt" if "accuracy" in name and a is not None else "n/a")
        table.append(f"| {name} | {fmt(a, spec)} | {fmt(b, spec)} | {extra} |")
    note = ("CPU run: FP32 vs bf16 autocast (no GPU, no GradScaler"
            f"{'' if cpu_bf16()[0] else '; bf16 emulated: ' + cpu_bf16()[1]}); CPU speed says"
            " nothing about GPU tensor cores." if device.type == "cpu" else
            f"GPU: {device_name(device)}; AMP {aname}"
            f"{' with GradScaler' if amp_dtype == torch.float16 else ' (no GradScaler needed)'}.")
    head = (f"{args.model}, --data {args.data}, {args.image_size}px, batch {args.batch_size}"
            f" x {ranks.world}, {runs['amp']['history'][-1]['steps']} steps/epoch x"
            f" {len(runs['amp']['history'])} epochs, seed {args.seed}, torch {torch.__version__}")
    md = "\n".join([f"## FP32 vs AMP: {head}", "", *table, "", note, ""])
    print(md, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    result = {"setup": head, "note": note, "device": device_name(device), "amp": aname,
              "fp32": runs["fp32"], "amp_run": runs["amp"],
              "ratios": {"images_per_s": ratio(m["images_per_s"], f["images_per_s"]),
                         "epoch_time": ratio(m["epoch_time_s"], f["epoch_time_s"]),
                         "peak_mem": ratio(m["peak_mem_gib"], f["peak_mem_gib"]),
                         "accuracy_diff_pt": acc(m) - acc(f)}}
    (out / "compare.json").write_text(json.dumps(result, indent=2))
    (out / "compare.md").write_text(md)
    plot_compare(out / "compare.png", rows, aname, head)
    print(f"wrote {out / 'compare.md'}, {out / 'compare.json'}, {out / 'compare.png'}",
          flush=True)
    return result


def plot_compare(path, rows, aname, title):
    import matplotlib
    matplotlib.use("Agg")  # no display in a container
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.4))
    for ax, (name, a, b, _) in zip(axes, rows):
        if a is None or b is None:  # e.g. GPU memory on a CPU run
            ax.set_title(name, fontsize=9)
            ax.text(0.5, 0.5, "n/a on this device", ha="center", va="center", fontsize=9)
            ax.set_axis_off()
            continue
        vals = [a, b]
        ax.bar(["FP32", f"AMP {aname}"], vals, color=["#888888", "#76b900"])
        ax.set_title(name, fontsize=9)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
