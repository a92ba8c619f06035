#!/usr/bin/env python3
"""bench_input.py: does the input pipeline keep up with AMP training? Trains train_amp.py
on synthetic data and on an ImageNet-like JPEG set it makes, per --decode path, and prints
images/s over whole epochs (the first, warm-up/compile epoch excluded) and the JPEG/synthetic ratio.

    python benchmarks/bench_input.py --out /tmp/bench_input.json

Every row is train_amp.train() with the default flags (AMP, channels_last, torch.compile on a
GPU), in this process, one after the other (--repeat N: all the rows N times, interleaved,
reported as median and range). The JPEGs are written (or, already there, read) by this script
just before, so they are in the page cache (the report says so and how big the set is): the
figures are the warm-cache rate of a data set that fits in RAM, the case where the CPU or GPU,
not the disk, sets the pace. --device cpu with a tiny model is the CI smoke test of this script."""
import argparse
import contextlib
import io
import json
import multiprocessing
import os
import pathlib
import statistics
import sys
import tarfile
import time

HERE = pathlib.Path(__file__).resolve().parent
# train_amp is imported the one documented way (see trainamp/api.py): its folder first
# on sys.path. It lives at the repository root, and at /usr/local/bin in the image.
for p in (HERE.parent, pathlib.Path("/usr/local/bin")):
    if (p / "train_amp.py").is_file():
        sys.path.insert(0, str(p))
        break
import torch

import train_amp
import trainamp.data.device  # row_settings' decode counter replaces decode_jpegs there

# The device-gil row's thread switch interval (Python's default: 5 ms).
GIL_SWITCH_S = 0.0005
# The ablation rows: a row with one thing changed (row_settings, extra flags): name -> (the
# row it changes, what the report says, train_amp flags added).
GRAPHS = " (CUDA graphs)", ["--cuda-graphs"]
ABLATIONS = {"device-roi": ("device", " (crop by roi_align)", []),
             "device-gil": ("device", f" (switch interval {GIL_SWITCH_S * 1000:g} ms)", []),
             "device-graphs": ("device", *GRAPHS),
             "device-cpu30": ("device", " (workers decode 30%: 12 of them)",
                              ["--decode-cpu-share", "0.3", "--num-workers", "12"]),
             "workers-full": ("workers", " (every JPEG decoded at full scale)", []),

             # Where the device path's time goes: without the loader (its first batches kept
             # and replayed), and also without the decode (each kept batch decoded once).
             "device-replay": ("device", " (batches replayed from memory: no loader)", []),
             "device-decode-once": ("device", " (replayed, each batch decoded once)", []),
             "synthetic-graphs": ("synthetic", *GRAPHS)}
# The batches device-replay and device-decode-once keep (pinned; their decoded images too).
REPLAY_BATCHES = 32
# What a user of ImageNet-like data has: 333-640 px photos, about 90 KB each at quality 90.
MIN_SIDE, MAX_SIDE, NOISE = 333, 640, 14


def make_jpeg(job):
    """One JPEG: a smooth colour field plus grain (the grain sets the file size), 333-640 px,
    three landscape for one portrait."""
    import numpy as np
    from PIL import Image
    path, seed, max_side = job
    rng = np.random.default_rng(seed)
    long = int(rng.integers(min(400, max_side), max_side + 1))
    short = max(min(MIN_SIDE, long), int(long * rng.uniform(0.55, 0.9)))
    h, w = (short, long) if rng.random() < 0.75 else (long, short)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([np.sin(xx / rng.uniform(6, 60) + rng.uniform(0, 6)) * 60
                    + np.cos(yy / rng.uniform(6, 60)) * 60 + rng.uniform(60, 190)
                    for _ in range(3)], -1)
    img += rng.normal(0, NOISE, img.shape).astype(np.float32)
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=90)


def make_imagefolder(root, n_images, n_classes, max_side=MAX_SIDE):
    root = pathlib.Path(root)
    jobs = []
    for i in range(n_images):
        d = root / f"class{i % n_classes:03d}"
        d.mkdir(parents=True, exist_ok=True)
        jobs.append((str(d / f"{i:06d}.jpg"), i, max_side))
    with multiprocessing.Pool(train_amp.cpu_cores()) as pool:
        pool.map(make_jpeg, jobs, chunksize=16)


def make_shards(folder, out, per_shard=1024):
    """The same images as WebDataset-style tar shards: KEY.jpg + KEY.cls (the class index)."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    classes = sorted(p.name for p in pathlib.Path(folder).iterdir() if p.is_dir())
    files = sorted((f, classes.index(f.parent.name)) for f in pathlib.Path(folder).rglob("*.jpg"))
    for s in range(0, len(files), per_shard):
        with tarfile.open(out / f"train-{s // per_shard:05d}.tar", "w") as tar:
            for f, label in files[s:s + per_shard]:
                key = f"{f.parent.name}_{f.stem}"
                tar.add(f, arcname=f"{key}.jpg")
                data = str(label).encode()
                info = tarfile.TarInfo(f"{key}.cls")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


class Replay:
    """A loader's first `keep` batches (the first epoch's, up to REPLAY_BATCHES), then those
    again in turn for the rest of its length: its workers, pin-memory thread and shared-memory
    hand-overs stop after the kept ones."""

    def __init__(self, loader, stats, keep):
        self.loader, self.stats, self.keep = loader, stats, min(keep, len(loader))

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        batches, kept = iter(self.loader), []
        for i in range(len(self.loader)):
            if i < self.keep:
                kept.append(next(batches))
                self.stats["loaded"] += 1
                if len(kept) == self.keep:
                    batches = None  # the loader's workers stop
                yield kept[-1]
            else:
                self.stats["replayed"] += 1
                yield kept[i % self.keep]


@contextlib.contextmanager
def row_settings(name):
    """What an ablation row changes, for the length of the row: device-roi crops by roi_align
    instead of the Triton kernel, device-gil shortens Python's thread switch interval,
    device-replay feeds the device path's thread from Replay, device-decode-once also decodes
    each kept batch once. Yields (the row's counts of batches loaded, replayed and decoded, the
    DecodeOptions to train with)."""
    switch = sys.getswitchinterval()
    device = trainamp.data.device  # where decode_on_device looks decode_jpegs up
    passes, decode = train_amp.DeviceBatches.passes, device.decode_jpegs
    stats = {"loaded": 0, "replayed": 0, "decoded": 0}
    decoded = {}

    def replaying(batches):
        if not isinstance(batches.loader, Replay):
            batches.loader = Replay(batches.loader, stats,
                                    min(REPLAY_BATCHES, batches.plan[0][2]))
        return passes(batches)

    def counting(datas, paths, device):
        once = name == "device-decode-once"
        if once and datas[0].data_ptr() in decoded:
            return decoded[datas[0].data_ptr()]
        stats["decoded"] += 1
        result = decode(datas, paths, device)
        if once:
            decoded[datas[0].data_ptr()] = result
        return result

    options = train_amp.DecodeOptions(fused_crop=name != "device-roi",
                                      jpeg_draft=name != "workers-full")
    if name == "device-gil":
        sys.setswitchinterval(GIL_SWITCH_S)
    if name in ("device-replay", "device-decode-once"):
        train_amp.DeviceBatches.passes, device.decode_jpegs = replaying, counting
    try:
        yield stats, options
    finally:
        sys.setswitchinterval(switch)
        train_amp.DeviceBatches.passes, device.decode_jpegs = passes, decode


def run(label, a, data, extra=(), options=None):
    argv = ["--data", data, "--model", a.model, "--batch-size", str(a.batch_size),
            "--image-size", str(a.image_size), "--epochs", str(a.epochs), "--checkpoint-dir", "",
            "--progress", "none", "--device", a.device, *extra]
    args = train_amp.build_parser().parse_args(argv)
    train_amp.fill_defaults(args)
    torch._dynamo.reset()
    if a.device == "cuda":
        torch.cuda.empty_cache()
    row, t0 = {"label": label, "argv": argv}, time.perf_counter()
    try:
        trainer = train_amp.Trainer(args, train_amp.Ranks(), a.dev, train_amp.StopRequest(),
                                    label=f"[{label}]",
                                    options=options or train_amp.DecodeOptions())
        r = trainer.run()
        eps = [h["steps"] * a.batch_size / h["epoch_time_s"] for h in r["history"]]
        row.update(epoch_ips=eps, ips=statistics.median(eps[1:]) if len(eps) > 1 else eps[0],
                   compile=r["compile"], cuda_graphs=r["cuda_graphs"], amp=r["config"]["amp"],
                   channels_last=r["channels_last"], decode=trainer.decode,
                   train_acc=r["history"][-1]["train_acc"])
        if row["decode"] == "workers":
            row.update(steps_per_epoch=r["history"][0]["steps"], num_workers=(
                args.num_workers if args.num_workers is not None
                else train_amp.default_workers(train_amp.SampleFormat.DECODED)))
    except Exception as e:  # noqa: BLE001 - report it, keep the other rows
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    # The row's wall time, set-up and compilation included: where a slow run's time went.
    row["wall_s"] = time.perf_counter() - t0
    print(f"  {label}: {row.get('ips', 0):.0f} images/s (epochs:"
          f" {', '.join(f'{v:.0f}' for v in row.get('epoch_ips', []))}; row {row['wall_s']:.0f} s)"
          f" {row.get('error', '')}", flush=True)
    return row


def write_digits(root, side=64):
    """scikit-learn's digits (real handwriting, bundled) as JPEGs in train/ and val/ class
    folders, with train_amp.py's fixed digits split; upscaled to side px before encoding."""
    from PIL import Image
    train, val = train_amp.digits_split()
    for split, ds in (("train", train), ("val", val)):
        for i in range(len(ds)):
            x, y = ds[i]
            d = pathlib.Path(root) / split / f"digit{int(y)}"
            d.mkdir(parents=True, exist_ok=True)
            img = Image.fromarray((x[0].numpy() * 255).clip(0, 255).astype("uint8"))
            img.resize((side, side), Image.BILINEAR).convert("RGB").save(
                d / f"{i:04d}.jpg", "JPEG", quality=95)


def digits_accuracy(a, root):
    """Final val accuracy on the digits JPEGs per decode path and seed (eager: compiling
    changes no accuracy, only time)."""
    if not (root / "val").is_dir():
        write_digits(root)
    res = {}
    for decode in ("workers", "device"):
        for seed in range(a.accuracy):
            argv = ["--data", str(root), "--model", "resnet18", "--image-size", "32",
                    "--batch-size", "64", "--lr", "0.05", "--epochs", str(a.accuracy_epochs),
                    "--seed", str(seed), "--decode", decode, "--compile", "off",
                    "--checkpoint-dir", "", "--progress", "none", "--device", a.device]
            args = train_amp.build_parser().parse_args(argv)
            train_amp.fill_defaults(args)
            with contextlib.redirect_stdout(io.StringIO()):
                r = train_amp.train(args, train_amp.Ranks(), a.dev,
                                    train_amp.StopRequest())
            res.setdefault(decode, []).append(r["final"]["val_acc"])
    for decode, accs in res.items():
        print(f"  digits JPEGs --decode {decode}: val_acc {', '.join(f'{v:.2f}' for v in accs)}"
              f" (mean {statistics.mean(accs):.2f}%)", flush=True)
    return res


def cpu_decode_rate(folder, image_size, files=256, rounds=3):
    """Images/s of one CPU core running the workers' transforms (open, decode, crop or resize,
    flip, to tensor) on the set's first `files` JPEGs, JPEGs decoded at a reduced scale where
    the crop allows (DecodeOptions.jpeg_draft) and at full scale, in alternating rounds
    (medians)."""
    paths = sorted(pathlib.Path(folder).rglob("*.jpg"))[:files]
    times = {}
    for _ in range(rounds):
        for draft in (True, False):
            transforms = train_amp.image_transforms(image_size,
                                                    train_amp.DecodeOptions(jpeg_draft=draft))
            for split, tf in zip(("train", "val"), transforms):
                torch.manual_seed(0)
                t0 = time.perf_counter()
                for p in paths:
                    tf(train_amp.open_image(p))
                times.setdefault((split, draft), []).append(time.perf_counter() - t0)
    rate = {f"{split} {'reduced' if draft else 'full'}": len(paths) / statistics.median(t)
            for (split, draft), t in times.items()}
    for split in ("train", "val"):
        print(f"  workers' {split} transform, one core: {rate[split + ' reduced']:.0f} images/s"
              f" (JPEGs at full scale: {rate[split + ' full']:.0f}; x"
              f"{rate[split + ' reduced'] / rate[split + ' full']:.2f})", flush=True)
    return rate


def profile_device_path(a, folder, batches=12):
    """Milliseconds per batch of each --decode device stage alone, the GPU synchronised after
    each: where the time goes when the device path does not keep up."""
    data = train_amp.ImageFolderData(folder, a.image_size, "device")
    loader = torch.utils.data.DataLoader(data.train, batch_size=a.batch_size, shuffle=True,
                                         num_workers=8, collate_fn=train_amp.collate_bytes,
                                         pin_memory=a.device == "cuda", drop_last=True)
    fused = train_amp.use_fused_crop(a.dev)
    crops = {"crop+resize+flip+normalise" + (" (Triton kernel)" if fused else ""): fused}
    if fused:
        crops["the same by roi_align, flip, normalise"] = False
    times = {"read (loader, host)": [], "decode (nvJPEG)": [], **{k: [] for k in crops}}

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    it = iter(loader)
    for k in range(min(batches + 2, len(loader))):
        t0 = time.perf_counter()
        b, _labels = next(it)
        t1 = time.perf_counter()
        imgs, _, _ = train_amp.decode_jpegs(list(torch.split(b.flat, b.lengths.tolist())),
                                            b.paths, a.dev)
        sync()
        t2 = time.perf_counter()
        gen = train_amp.batch_generator(k)
        boxes = train_amp.random_crop_boxes([im.shape[-2:] for im in imgs], gen)
        flip = torch.rand(len(imgs), generator=gen) < 0.5
        spent = [t1 - t0, t2 - t1]
        for use_fused in crops.values():
            t3 = time.perf_counter()
            train_amp.crop_to_batch(imgs, boxes, flip, a.image_size, True,
                                    train_amp.DecodeOptions(fused_crop=use_fused))
            sync()
            spent.append(time.perf_counter() - t3)
        if k >= 2:
            for name, v in zip(times, spent):
                times[name].append(1000 * v)
    prof = {k: statistics.median(v) for k, v in times.items()}
    print("  device path per batch (ms, median): " + ", ".join(
        f"{k} {v:.1f}" for k, v in prof.items()), flush=True)
    return prof


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--images", type=int, default=8192, help="JPEGs to make (default 8192)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--max-side", type=int, default=MAX_SIDE, help="largest JPEG side (640)")
    p.add_argument("--epochs", type=int, default=5,
                   help="epochs per row; the figure is the median of epochs 2.. (default 5)")
    p.add_argument("--rows", default="synthetic,workers,device,auto,tar",
                   help="comma list: synthetic, workers, workers-all (one worker per core but"
                        " one), device, device-roi (device with the crop by roi_align instead"
                        " of the Triton kernel), device-gil (device with Python's thread switch"
                        f" interval at {GIL_SWITCH_S * 1000:g} ms instead of 5: the decode thread"
                        " waits less for the interpreter lock), device-cpu30 (12 workers"
                        " decode 30%% of each batch on the CPU), device-graphs and"
                        " synthetic-graphs (--cuda-graphs), device-replay (device without"
                        " the loader: its first epoch's batches, up to"
                        f" {REPLAY_BATCHES}, replayed), device-decode-once (device-replay with"
                        " each kept batch decoded once), auto (no --decode: what the"
                        " default picks), tar (the JPEGs as tar shards, default decode),"
                        " workers-full (workers, every JPEG decoded at full scale)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run the rows N times, interleaved (all rows, then all again): the"
                        " report gives each row's median and the range of its ratios, since"
                        " the device path varies from run to run far more than synthetic data")
    p.add_argument("--jpeg-dir", default="/tmp/bench_input")
    p.add_argument("--out", default="bench_input.json")
    p.add_argument("--device", default="cuda", help="cuda (default); cpu: smoke test only")
    p.add_argument("--accuracy", type=int, default=0, metavar="SEEDS",
                   help="also train on scikit-learn's digits written out as JPEGs, --decode"
                        " workers vs device, this many seeds each, and print val accuracy")
    p.add_argument("--accuracy-epochs", type=int, default=15)
    p.add_argument("--profile", action="store_true",
                   help="also time each stage of --decode device alone, per batch")
    p.add_argument("--cpu-decode", action="store_true",
                   help="also time the workers' transforms on one CPU core, JPEGs decoded at a"
                        " reduced scale where the crop allows vs at full scale (no GPU needed"
                        " for this part: with --rows '' it is all that runs)")
    return p


def jpeg_set(a, folder):
    """The ImageNet-like JPEGs (made, or already there and read into the page cache) -> (their
    paths, whether this run made them)."""
    made = not any(folder.rglob("*.jpg"))
    if made:
        make_imagefolder(folder, a.images, a.classes, a.max_side)
    files = list(folder.rglob("*.jpg"))
    if not made:
        # A set left by an earlier run may have left the page cache since: read it once, so
        # the rows measure what the report says (a warm cache), not the disk.
        for f in files:
            f.read_bytes()
    return files, made


def new_report(a, files, made, t0):
    """The report's head: the machine, the job, the JPEG set and its page-cache state."""
    size = sum(f.stat().st_size for f in files)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return {"gpu": train_amp.device_name(a.dev), "torch": torch.__version__,
            "cpus": train_amp.cpu_cores(), "model": a.model, "batch_size": a.batch_size,
            "image_size": a.image_size, "epochs": a.epochs, "images": len(files),
            "mean_kib": size / len(files) / 1024, "make_s": time.perf_counter() - t0,
            "page_cache": (f"warm: the {size / 2 ** 20:.0f} MiB of JPEGs were"
                           f" {'written' if made else 'read'} by this run just before"
                           f" ({mem_gib:.0f} GiB RAM), so every epoch reads them from the page"
                           " cache"), "rows": []}


def row_plan(a, folder, n_train, cpus):
    """Every row name -> (its --data, its train_amp flags)."""
    plan = {
        "synthetic": ("synthetic", ["--synthetic-size", str(n_train), "--num-classes",
                                    str(a.classes)]),
        "workers": (str(folder), ["--decode", "workers"]),
        "workers-all": (str(folder), ["--decode", "workers", "--num-workers",
                                      str(max(1, cpus - 1))]),
        "device": (str(folder), ["--decode", "device"]),
        "auto": (str(folder), []),
        "tar": (str(pathlib.Path(a.jpeg_dir) / "shards"), []),
    }
    for name, (base, _, flags) in ABLATIONS.items():
        plan[name] = (plan[base][0], plan[base][1] + flags)
    return plan


def run_rows(a, rows, plan, rep):
    """The rows, --repeat times interleaved; the JSON rewritten after each (a long run that
    dies keeps what it measured)."""
    rep["repeat"] = a.repeat
    for round_ in range(a.repeat):
        for name in rows:
            data, extra = plan[name]
            with row_settings(name) as (stats, options):
                row = run(name, a, data, extra, options)
            if any(stats.values()):
                row["batches"] = stats
            row["round"] = round_ + 1
            rep["rows"].append(row)
            pathlib.Path(a.out).write_text(json.dumps(rep, indent=2))


def write_report(rep, out):
    """Print the report and write it as markdown next to the JSON (OUT with .md)."""
    print_report(rep)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_report(rep)
    pathlib.Path(out).with_suffix(".md").write_text(buf.getvalue())


def main():
    a = build_parser().parse_args()
    if a.device == "cuda" and a.rows and not torch.cuda.is_available():
        sys.exit("bench_input.py needs a CUDA GPU (--device cpu only smoke-tests it)")
    a.dev = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    folder = pathlib.Path(a.jpeg_dir) / "jpeg"
    t0 = time.perf_counter()
    files, made = jpeg_set(a, folder)
    rows = [r for r in a.rows.split(",") if r]
    if "tar" in rows and not any((pathlib.Path(a.jpeg_dir) / "shards").glob("*.tar")):
        make_shards(folder, pathlib.Path(a.jpeg_dir) / "shards")
    rep = new_report(a, files, made, t0)
    print(f"# bench_input: {a.model} batch {a.batch_size} on {rep['gpu']} ({rep['cpus']} CPUs),"
          f" {len(files)} JPEGs, {rep['mean_kib']:.0f} KiB mean; {rep['page_cache']}", flush=True)
    plan = row_plan(a, folder, len(files), rep["cpus"])
    if a.profile:
        rep["profile"] = profile_device_path(a, folder)
    if a.cpu_decode:
        rep["cpu_decode"] = cpu_decode_rate(folder, a.image_size)
    run_rows(a, rows, plan, rep)
    if a.accuracy:
        rep["accuracy"] = digits_accuracy(a, pathlib.Path(a.jpeg_dir) / "digits")
        pathlib.Path(a.out).write_text(json.dumps(rep, indent=2))
    write_report(rep, a.out)


def few_batches_cautions(rep):
    """A line for each row whose workers outnumbered half its batches an epoch. A worker makes
    whole batches, so then most of them sit idle while the last batches of each epoch are
    made: such a row (photos in a small set: 8 batches of 256 for 15 workers gave 208
    images/s on the H200) understates what the workers deliver on a larger set."""
    seen = {}
    for r in rep["rows"]:
        steps, workers = r.get("steps_per_epoch"), r.get("num_workers")
        if steps and workers and steps < 2 * workers:
            seen.setdefault(r["label"], (steps, workers))
    return [f"caution: the {label} row had {steps} batches an epoch for {workers} workers, each"
            " of which makes whole batches: its figure understates the workers on a larger set"
            f" (--images {2 * workers * rep['batch_size']} or more gives each worker two"
            " batches an epoch)" for label, (steps, workers) in seen.items()]


def print_report(rep):
    """The table; each row's ratio is to the synthetic row with the same CUDA graphs setting
    (synthetic-graphs for the -graphs rows) of the same round. With --repeat: a line per row
    name, the median of its rounds' images/s and ratios, and the ratios' range."""
    syn = {(r["label"], r.get("round", 1)): r["ips"] for r in rep["rows"]
           if r["label"].startswith("synthetic") and "ips" in r}
    named = {}
    for r in rep["rows"]:
        named.setdefault(r["label"], []).append(r)
    if rep["rows"]:  # with --rows '' only the parts asked for below are reported
        print(f"\n## Input pipeline: {rep['model']}, batch {rep['batch_size']},"
              f" {rep['image_size']}px, train_amp.py defaults\n")
        print(f"{rep['gpu']}, {rep['cpus']} CPU cores, torch {rep['torch']}; {rep['images']}"
              f" JPEGs ({rep['mean_kib']:.0f} KiB mean); median images/s of epochs"
              f" 2-{rep['epochs']} (whole epochs); page cache {rep['page_cache']}.\n")
        rounds = len(rep["rows"]) > len(named)
        # A name given twice in --rows (no --repeat) also makes several rows of one name.
        many = (f"{rep['repeat']} interleaved rounds" if rep["repeat"] > 1 else
                f"up to {max(len(v) for v in named.values())} rows of one name")
        print("| data | --decode | images/s" + (f" (median, range of {many})"
              if rounds else "") + " | vs synthetic"
              + (" (of the same round)" if rounds else "") + " |")
        print("|---|---|---:|---:|")
    for label, runs in named.items():
        base = ABLATIONS.get(label, (label,))[0]
        data = {"synthetic": "synthetic (in memory)", "tar": "tar shards"}.get(
            base, "JPEG ImageFolder")
        decode = runs[0].get("decode") or "-"
        if label in ("auto", "tar"):
            decode = f"auto -> {decode}"
        if label == "workers-all":
            decode += f" ({rep['cpus'] - 1} workers)"
        if label in ABLATIONS:
            decode += ABLATIONS[label][1]
        failed = [x for x in runs if "error" in x]
        if failed:
            print(f"| {data} | {decode} | error ({len(failed)} of {len(runs)}):"
                  f" {failed[0]['error'][:80]} | |")
            continue
        ref = "synthetic-graphs" if label.endswith("-graphs") else "synthetic"
        ratios = [x["ips"] / syn[(ref, x.get("round", 1))] for x in runs
                  if (ref, x.get("round", 1)) in syn]
        ips = [x["ips"] for x in runs]
        spread = f"{statistics.median(ips):.0f}"
        if len(ips) > 1:
            spread += f" ({min(ips):.0f}-{max(ips):.0f})"
        ratio = f"{statistics.median(ratios):.2f}" if ratios else "n/a"
        if len(ratios) > 1:
            ratio += f" ({min(ratios):.2f}-{max(ratios):.2f})"
        print(f"| {data} | {decode} | {spread} | {ratio} |")
    for line in few_batches_cautions(rep):
        print(f"\n{line}")
    if rep.get("cpu_decode"):
        print(f"\nworkers' transforms on one CPU core ({rep['images']} JPEGs,"
              f" {rep['mean_kib']:.0f} KiB mean), images/s: " + ", ".join(
            f"{k} {v:.0f}" for k, v in rep["cpu_decode"].items()))
    if rep.get("profile"):
        print("\n--decode device, each stage alone (ms per batch, median): " + ", ".join(
            f"{k} {v:.1f}" for k, v in rep["profile"].items()))
    for decode, accs in rep.get("accuracy", {}).items():
        print(f"\ndigits as JPEGs, resnet18, --decode {decode}: final val_acc"
              f" {', '.join(f'{v:.2f}%' for v in accs)}")


if __name__ == "__main__":
    main()
