#!/usr/bin/env python3
"""bench_amp.py: what AMP, channels_last and torch.compile buy on one GPU, in one process.
ResNet-50 (default), batch 256, synthetic data on the GPU: strict FP32 / TF32 / AMP fp16 /
AMP bf16, each with and without channels_last and torch.compile; then train_amp.py's default
flags, the defaults with --compile tuned, and an ImageFolder of JPEGs (input pipeline vs GPU).
Prints markdown, writes JSON.

    python benchmarks/bench_amp.py --out /tmp/bench_amp.json

Everything runs through train_amp.py's own benchmark()/train() so the figures are the tool's.
A time budget (default 450 s) skips what would not fit and says so; --only reruns a subset.
The tables also go to OUT with .md for .json; --report merges several JSON files."""
import argparse
import ast
import contextlib
import io
import json
import pathlib
import random
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
# train_amp is imported the one documented way (see trainamp/api.py): its folder first
# on sys.path. It lives at the repository root, and at /usr/local/bin in the image.
for p in (HERE.parent, pathlib.Path("/usr/local/bin")):
    if (p / "train_amp.py").is_file():
        sys.path.insert(0, str(p))
        break
import bench_input  # beside this script: its JPEG set is the one bench_amp uses
import torch

import train_amp

PRECISIONS = {  # name -> (--amp, --tf32)
    "fp32-strict": ("off", False),
    "tf32": ("off", True),
    "amp-fp16": ("fp16", False),
    "amp-bf16": ("bf16", False),
}
# Rough cost of one configuration on an H200, to decide what fits in the budget.
EST_EAGER_S, EST_COMPILE_S, EST_TUNED_S = 15, 75, 330


def bench_args(model, batch, image_size, extra):
    return train_amp.build_parser().parse_args(
        ["--benchmark", "--model", model, "--batch-size", str(batch), "--image-size",
         str(image_size), *extra])


def _skipped_key(entry):
    """'(name, amp, tf32, channels_last, compile): why' -> (name, channels_last, compile)."""
    name, _amp, _tf32, cl, comp = ast.literal_eval(entry.split(": ")[0])
    return name, cl, comp


def run_config(args, device):
    """One benchmark() in this process, cleaned up so the next starts from a fresh state."""
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    try:
        return train_amp.benchmark(args, device)
    except torch.cuda.OutOfMemoryError as e:
        return {"error": f"out of memory: {str(e).splitlines()[0][:200]}"}
    except Exception as e:  # noqa: BLE001 - one failing config must not lose the others
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    finally:
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def loader_only_ips(folder, batch, image_size, workers, pin, decode, batches_per_worker=10):
    """Images/s of the DataLoader alone, no GPU work: decode + augment + collate for
    --decode workers; only reading the files for --decode device.

    Timed from the iterator's creation to its last batch, over at least batches_per_worker
    batches for every worker (the folder repeated as needed, files read from the page cache
    as training's later epochs read them). Timing a few batches after a short warm-up instead
    times batches the workers had already prefetched (workers x prefetch_factor of them):
    that once reported 40,689 images/s for 15 workers, ten times the real rate."""
    data = train_amp.ImageFolderData(folder, image_size, decode)
    reps = max(1, -(-batches_per_worker * max(1, workers) * batch // len(data.train)))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.ConcatDataset([data.train] * reps), batch_size=batch, shuffle=True,
        num_workers=workers, pin_memory=pin, drop_last=True, prefetch_factor=4 if workers else None,
        persistent_workers=False,
        collate_fn=train_amp.collate_bytes if decode == "device" else None)
    n = 0
    t0 = time.perf_counter()
    for _, y in loader:
        n += len(y)
    return n / (time.perf_counter() - t0)


def fmt(v, spec, none="n/a"):
    return none if v is None else format(v, spec)


def div(a, b):
    return a / b if a is not None and b else None


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=25, help="timed steps per configuration")
    p.add_argument("--warmup-steps", type=int, default=8,
                   help="untimed steps (cudnn autotuning; compilation happens in the first)")
    p.add_argument("--budget-s", type=float, default=450,
                   help="skip what would end after this many seconds (default 450)")
    p.add_argument("--only", default="",
                   help="comma list of parts: matrix-eager, defaults, jpeg, matrix-compile, tuned")
    p.add_argument("--precisions", default=",".join(PRECISIONS),
                   help=f"comma list of matrix precisions (default: all: {','.join(PRECISIONS)})")
    p.add_argument("--jpeg-images", type=int, default=12288,
                   help="JPEGs to make (default 12288: enough batches per DataLoader worker)")
    p.add_argument("--jpeg-dir", default="/tmp/bench_amp_jpegs")
    p.add_argument("--out", default="bench_amp.json")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="no benchmarking: merge these result files (e.g. an eager and a compile"
                        " run) and print the combined tables and targets")
    p.add_argument("--device", default="cuda",
                   help="cuda (default); cpu only to smoke-test this script with a tiny model")
    return p


def merge_reports(files):
    """Several result files (e.g. an eager and a compile run) as one report."""
    merged = None
    for f in files:
        r = json.loads(pathlib.Path(f).read_text())
        if merged is None:
            merged = r
            continue
        merged["matrix"] += r["matrix"]
        merged["skipped"] += r["skipped"]
        merged["defaults"] = merged["defaults"] or r["defaults"]
        merged["jpeg"] = merged["jpeg"] or r["jpeg"]
    # A configuration one run skipped for time may have been measured by another.
    done = {(m["precision"] if m["compile"] != "tuned" else "tuned", m["channels_last"],
             m["compile"]) for m in merged["matrix"]}
    merged["skipped"] = [k for k in merged["skipped"] if _skipped_key(k) not in done]
    return merged


def matrix_configs(a, parts):
    """(name, amp, tf32, channels_last, compile) of every matrix row asked for, eager first."""
    configs = []
    for compile_ in (False, True):
        if ("matrix-compile" if compile_ else "matrix-eager") not in parts:
            continue
        # With compile, channels_last first: it is the layout Inductor prefers for convs.
        for cl in ((True, False) if compile_ else (False, True)):
            for name, (amp, tf32) in (reversed(PRECISIONS.items()) if compile_
                                      else PRECISIONS.items()):
                if name in a.precisions.split(","):
                    configs.append((name, amp, tf32, cl, compile_))
    return configs


class Bench:
    """One benchmark run: the report it fills, saved after every row, and the time budget."""

    def __init__(self, a):
        self.a, self.t_start, self.out = a, time.perf_counter(), pathlib.Path(a.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.common = ["--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps)]
        self.report = {"gpu": train_amp.device_name(a.dev), "torch": str(torch.__version__),
                       "cudnn": torch.backends.cudnn.version(), "model": a.model,
                       "batch_size": a.batch_size, "image_size": a.image_size,
                       "steps": a.steps, "matrix": [], "defaults": None, "jpeg": None,
                       "skipped": []}

    def save(self):
        self.report["elapsed_s"] = time.perf_counter() - self.t_start
        self.out.write_text(json.dumps(self.report, indent=2))

    def fits(self, cost):
        return time.perf_counter() - self.t_start + cost <= self.a.budget_s

    def run(self, extra):
        a = self.a
        return run_config(bench_args(a.model, a.batch_size, a.image_size, [*self.common, *extra]),
                          a.dev)

    def matrix_rows(self, configs, cost):
        for name, amp, tf32, cl, compile_ in configs:
            if not self.fits(cost):
                self.report["skipped"].append(f"{(name, amp, tf32, cl, compile_)}: time budget")
                print(f"  skipped {(name, amp, tf32, cl, compile_)}: time budget", flush=True)
                continue
            r = self.run(["--amp", amp, "--channels-last", on_off(cl), *(["--tf32"] if tf32 else []),
                          "--compile", on_off(compile_)])
            r.update({"precision": name, "channels_last": cl, "compile": compile_})
            self.report["matrix"].append(r)
            self.save()
            status = (f"{r['images_per_s']:8.0f} img/s  {fmt(r['peak_mem_gib'], '6.2f')} GiB"
                      f"  (warm-up {r['warmup_s']:.0f} s)" if "error" not in r else r["error"])
            print(f"  {name:12s} channels_last={cl!s:5} compile={compile_!s:5} {status}",
                  flush=True)

    def defaults(self):
        """Exactly what a user gets with no flags: --amp, --channels-last and --compile auto."""
        r = self.report["defaults"] = self.run([])
        self.save()
        print(f"  train_amp.py defaults -> amp={r.get('amp')} channels_last="
              f"{r.get('channels_last')} compile={r.get('compile')}"
              f" cudnn.benchmark={r.get('cudnn_benchmark')}:"
              f" {fmt(r.get('images_per_s'), '.0f')} img/s", flush=True)

    def tuned(self):
        """The defaults plus --compile tuned: the fastest configuration train_amp.py offers. Its
        strict-FP32 pair is the compiled (untuned) FP32 row: tuning FP32 would cost another
        five minutes of tuning for a baseline."""
        if not self.fits(EST_TUNED_S):
            self.report["skipped"].append("('tuned', 'auto', False, True, 'tuned'): time budget")
            return
        r = self.run(["--compile", "tuned"])
        r.update({"precision": f"amp-{r.get('amp')}", "compile": "tuned"})
        self.report["matrix"].append(r)
        self.save()
        print(f"  defaults + --compile tuned: {fmt(r.get('images_per_s'), '.0f')} img/s"
              f" (warm-up {fmt(r.get('warmup_s'), '.0f')} s)", flush=True)

    def finish(self):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            print_report(self.report)
        print(buf.getvalue(), end="")
        self.out.with_suffix(".md").write_text(buf.getvalue())
        self.save()


def main():
    a = build_parser().parse_args()
    # As train_amp.main does, before anything reads HOME or the user name: started without the
    # entrypoint as a UID with no passwd entry, Inductor's getpass.getuser() raises KeyError.
    train_amp.writable_home()
    if a.report:
        print_report(merge_reports(a.report))
        return
    try:  # build_model trusts the name: train_amp checks it once, in check_args
        train_amp.check_model_name(a.model)
    except train_amp.UsageError as e:
        sys.exit(f"bench_amp.py: error: {e}")
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_amp.py needs a CUDA GPU (for CPU, see tests/test_train_amp_*.py)")
    a.dev = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    parts = set(a.only.split(",")) if a.only else {"matrix-eager", "defaults", "jpeg",
                                                  "matrix-compile", "tuned"}
    bench = Bench(a)
    configs = matrix_configs(a, parts)
    print(f"# bench_amp: {a.model} batch {a.batch_size} on {bench.report['gpu']}, torch"
          f" {torch.__version__}", flush=True)
    bench.matrix_rows([c for c in configs if not c[4]], EST_EAGER_S)
    if "defaults" in parts and bench.fits(EST_COMPILE_S):
        bench.defaults()
    if "jpeg" in parts and bench.fits(90):
        bench.report["jpeg"] = bench_jpeg(a)
        bench.save()
    bench.matrix_rows([c for c in configs if c[4]], EST_COMPILE_S)
    if "tuned" in parts:
        bench.tuned()
    bench.finish()


def bench_jpeg(a):
    """End-to-end training on JPEGs vs the loader alone vs the GPU alone: which one limits."""
    folder = pathlib.Path(a.jpeg_dir)
    t0 = time.perf_counter()
    if not any(folder.rglob("*.jpg")):
        # bench_input's ImageNet-like JPEGs (333-640 px, ~90 KB): one recipe for both scripts.
        bench_input.make_imagefolder(folder, a.jpeg_images, 10)
    files = list(folder.rglob("*.jpg"))
    size, n, cores = sum(f.stat().st_size for f in files), len(files), train_amp.cpu_cores()
    res = {"images": n, "mean_kib": size / n / 1024, "make_s": time.perf_counter() - t0,
           "cpus": cores, "runs": []}
    print(f"  JPEG ImageFolder: {n} images, {res['mean_kib']:.0f} KiB each,"
          f" made in {res['make_s']:.0f} s", flush=True)
    auto_workers = min(8, cores)
    setups = [("workers", w) for w in sorted({auto_workers, max(1, cores - 1)})]
    setups.append(("device", auto_workers))
    for decode, workers in setups:
        row = {"decode": decode, "num_workers": workers}
        try:
            row["loader_only_ips"] = loader_only_ips(folder, a.batch_size, a.image_size,
                                                     workers, a.dev.type == "cuda", decode)
            args = train_amp.build_parser().parse_args(
                ["--data", str(folder), "--model", a.model, "--batch-size", str(a.batch_size),
                 "--image-size", str(a.image_size), "--epochs", "2", "--num-workers",
                 str(workers), "--decode", decode, "--checkpoint-dir", "", "--progress", "none",
                 "--compile", "off",
                 "--device", a.device])
            train_amp.fill_defaults(args)
            torch.cuda.empty_cache()
            r = train_amp.train(args, train_amp.Ranks(), a.dev, train_amp.StopRequest(),
                                label=f"[jpeg {decode}]")
            # The whole last epoch, its first batches' wait included: train_amp.py's own
            # figure leaves out an epoch's first steps, and in a short epoch the workers have
            # prefetched all the rest by then, so it shows the GPU's rate, not the loader's.
            last = r["final"]
            row["train_ips"] = last["steps"] * a.batch_size / last["epoch_time_s"]
            row["train_ips_after_first_steps"] = last["images_per_s"]
            row["amp"] = r["config"]["amp"]
            row["channels_last"] = r["channels_last"]
        except Exception as e:  # noqa: BLE001 - report it, keep the other rows
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        res["runs"].append(row)
        print(f"  JPEG --decode {decode} num_workers={workers}: loader alone"
              f" {fmt(row.get('loader_only_ips'), '.0f')} img/s, training"
              f" {fmt(row.get('train_ips'), '.0f')} img/s {row.get('error', '')}", flush=True)
    return res


def on_off(compile_):
    return {False: "off", True: "on"}.get(compile_, compile_)


def print_report(r):
    rows = [m for m in r["matrix"] if "error" not in m]
    print(f"\n## AMP benchmark: {r['model']}, batch {r['batch_size']}, {r['image_size']}px,"
          f" synthetic data on the GPU\n")
    print(f"GPU: {r['gpu']}; torch {r['torch']}; cuDNN {r['cudnn']}; {r['steps']} timed steps"
          f" per row after warm-up.\n")
    print("| precision | channels_last | torch.compile | images/s | peak memory (GiB) |"
          " vs strict FP32, same flags: speed | memory |")
    print("|---|---|---|---:|---:|---:|---:|")

    def base(m):
        for b in rows:
            # A tuned row is paired with the compiled strict-FP32 row (see main()).
            if (b["precision"], b["channels_last"], b["compile"]) == (
                    "fp32-strict", m["channels_last"], bool(m["compile"])):
                return b
        return None

    for m in r["matrix"]:
        if "error" in m:  # a failed tuned row has no channels_last: it ran with auto
            print(f"| {m['precision']} | {on_off(m.get('channels_last', 'auto'))} |"
                  f" {on_off(m['compile'])} | error |"
                  f" {m['error'][:60]} | | |")
            continue
        b = base(m)
        sp = f"{m['images_per_s'] / b['images_per_s']:.2f}x" if b else "n/a"
        mem = fmt(div(m["peak_mem_gib"], b["peak_mem_gib"]), ".2f") if b else "n/a"
        print(f"| {m['precision']} | {'on' if m['channels_last'] else 'off'} |"
              f" {on_off(m['compile'])} | {m['images_per_s']:.0f} |"
              f" {fmt(m['peak_mem_gib'], '.2f')} | {sp} | {mem} |")
    for s in r["skipped"]:
        print(f"\nskipped: {s}")
    amp_rows = [m for m in rows if m["precision"].startswith("amp")]
    fp32_rows = [m for m in rows if m["precision"] == "fp32-strict"]
    best = max(amp_rows, key=lambda m: m["images_per_s"]) if amp_rows else None
    if best and fp32_rows:
        print_targets(r, rows, best, fp32_rows, base)
    d = r.get("defaults")
    if d and "error" not in d:
        of_best = (f" = {100 * d['images_per_s'] / best['images_per_s']:.0f}% of the best AMP row"
                   f" (target >= 90%)" if best else "")
        print(f"\n- train_amp.py defaults (amp={d['amp']}, channels_last={d['channels_last']},"
              f" cudnn.benchmark={d['cudnn_benchmark']}, compile={d['compile']}):"
              f" {d['images_per_s']:.0f}"
              f" images/s, peak memory {fmt(d['peak_mem_gib'], '.2f')} GiB{of_best}")
    j = r.get("jpeg")
    if j:
        # The JPEG runs are eager (--compile off): compare them with the eager GPU rate of their
        # precision and layout, from the matrix when it has that row.
        ran = next((x for x in j["runs"] if "amp" in x), None)
        eager = [m for m in rows if ran and not m["compile"]
                 and m["precision"] == f"amp-{ran['amp']}"
                 and m["channels_last"] == ran.get("channels_last")]
        gpu_ips = eager[0]["images_per_s"] if eager else (
            d["images_per_s"] if d and "error" not in d and not d["compile"] else None)
        print_jpeg(j, gpu_ips)


def print_targets(r, rows, best, fp32_rows, base):
    best32 = max(fp32_rows, key=lambda m: m["images_per_s"])
    b = base(best)
    print("\n### Targets\n")

    def verdict(ok):
        return "MET" if ok else "NOT MET"

    print(f"- best AMP: {best['precision']} channels_last={best['channels_last']}"
          f" compile={best['compile']}: {best['images_per_s']:.0f} images/s (target >= 7000):"
          f" {verdict(best['images_per_s'] >= 7000)}")
    if b:
        sp = best["images_per_s"] / b["images_per_s"]
        mem = div(best["peak_mem_gib"], b["peak_mem_gib"])
        same = " (FP32 compiled, untuned)" if best["compile"] == "tuned" else ""
        print(f"- best AMP vs strict FP32 with the same flags{same}: {sp:.2f}x images/s"
              f" (target >= 5x:"
              f" {verdict(sp >= 5)}), peak memory ratio {fmt(mem, '.2f')} (target <= 0.55:"
              f" {verdict(mem is not None and mem <= 0.55)})")
    print(f"- best AMP vs best strict FP32 ({best32['images_per_s']:.0f} images/s):"
          f" {best['images_per_s'] / best32['images_per_s']:.2f}x")
    plain = [m for m in rows if m["precision"].startswith("amp") and not m["compile"]
             and not m["channels_last"]]
    for m in plain:
        bb = base(m)
        if bb:
            print(f"- {m['precision']} eager NCHW vs strict FP32 eager NCHW: peak memory ratio"
                  f" {fmt(div(m['peak_mem_gib'], bb['peak_mem_gib']), '.2f')}, speed"
                  f" {m['images_per_s'] / bb['images_per_s']:.2f}x")
    d = r.get("defaults")
    if d and "error" not in d:
        frac = d["images_per_s"] / best["images_per_s"]
        print(f"- train_amp.py defaults within 10% of the best: {100 * frac:.0f}%:"
              f" {verdict(frac >= 0.9)}")


def print_jpeg(j, gpu_ips):
    print(f"\n### JPEG ImageFolder ({j['images']} images, {j['mean_kib']:.0f} KiB mean,"
          f" {j['cpus']} CPUs)\n")
    print("| --decode | num_workers | DataLoader alone (images/s) | training with --data"
          " (images/s, whole epoch) | GPU alone, same flags (images/s) | bottleneck |")
    print("|---|---:|---:|---:|---:|---|")
    for row in j["runs"]:
        decode = row.get("decode", "workers")
        if "error" in row:
            print(f"| {decode} | {row['num_workers']} | error: {row['error'][:80]} | | | |")
            continue
        if gpu_ips is None:
            limit = "n/a (no GPU-only figure in this run)"
        elif row["loader_only_ips"] < 0.9 * gpu_ips:
            limit = ("input pipeline: CPU JPEG decode + augment" if decode == "workers"
                     else "input pipeline: reading the files")
        elif row["train_ips"] is not None and row["train_ips"] < 0.9 * gpu_ips:
            limit = ("GPU: decode + augment take GPU time from the model" if decode ==
                     "device" else "GPU side (copies, normalisation)")
        else:
            limit = "GPU: the model itself"
        print(f"| {decode} | {row['num_workers']} | {row['loader_only_ips']:.0f} |"
              f" {fmt(row['train_ips'], '.0f')} | {fmt(gpu_ips, '.0f')} | {limit} |")


if __name__ == "__main__":
    random.seed(0)
    main()
