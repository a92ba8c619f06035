"""From a --data choice to batches on the device: which data set and which --decode path
(load_data, pick_decode), how many DataLoader workers, the resumable sampler, and to_device,
which finishes each batch on the device."""
import math
import os
import pathlib
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from ..errors import PROG, BadImageError, UsageError
from .bad import BadImages
from .device import decode_on_device, normalise
from .options import CORES_FOR_WORKER_DECODE, DEFAULT
from .sources import (
    JPEG_SUFFIXES,
    ImageFolderData,
    SampleFormat,
    digits_split,
    synthetic_split,
)


def nvjpeg_available(device):
    """Whether torchvision can decode JPEGs on this device (built with nvJPEG)."""
    if device.type != "cuda":
        return False
    try:
        from torchvision.io import decode_jpeg, encode_jpeg
        data = encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))
        decode_jpeg([data], device=device)
        return True
    except Exception:  # noqa: BLE001 - any failure means: decode on the CPU
        return False


def cgroup_cpu_limit(root="/sys/fs/cgroup"):
    """The container's CPU limit in cores (docker --cpus, a Kubernetes CPU limit), or None:
    cgroup v2's cpu.max ("max 100000" is none), else v1's cfs quota and period (-1 is none)."""
    try:
        quota, period = pathlib.Path(root, "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(pathlib.Path(root, "cpu", "cpu.cfs_quota_us").read_text())
        period = int(pathlib.Path(root, "cpu", "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def cpu_cores(local_world=1):
    """CPU cores this process may use, shared among the processes on this node: the fewer of
    its affinity mask (docker --cpuset-cpus, taskset, Slurm's binding) and the container's CPU
    limit, rounded up. os.cpu_count() counts the host's cores whatever the container may use."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit:
        cores = min(cores, math.ceil(limit))
    return max(1, cores // max(1, local_world))


def large_jpeg_note(paths, image_size, sample=32):
    """A note when the data set's JPEGs are far larger than the training crop needs (their
    median shorter side at least 4x image_size, read from the headers of up to `sample` files
    spread over the set), else None. Decoding such photos, not the model, sets the pace."""
    from PIL import Image
    jpegs = [p for p in paths if p.lower().endswith(JPEG_SUFFIXES)]
    picked = jpegs[::max(1, -(-len(jpegs) // sample))]
    sizes = []
    for path in picked:
        try:
            with Image.open(path) as img:  # the header only: nothing is decoded
                sizes.append(img.size)
        except (OSError, Image.DecompressionBombError):
            continue  # an unreadable (or too large) file is reported when it is loaded
    if not sizes:
        return None
    short = statistics.median(min(s) for s in sizes)
    if short < 4 * image_size:
        return None
    w, h = (statistics.median(s[i] for s in sizes) for i in (0, 1))
    return (f"note: the JPEGs are large (median {w:.0f} x {h:.0f} px over {len(sizes)} sampled,"
            f" shorter side {short / image_size:.0f}x the {image_size} px crop): decoding them,"
            " not the model, will likely set the pace; pre-resizing their shorter side to"
            f" {image_size * 8 // 7} px (README: Pre-resize) removes most of that cost")


def pick_decode(args, device, paths, local_world=1):
    """--decode auto -> ('workers' or 'device', why)."""
    if args.decode != "auto":
        return args.decode, "as asked"
    cores = cpu_cores(local_world)
    if device.type != "cuda":
        return "workers", f"no GPU: the {cores} CPU core(s) decode"
    others = sum(1 for p in paths if not p.lower().endswith(JPEG_SUFFIXES))
    if others:
        return "workers", (f"{others} of {len(paths)} images are not JPEGs (the GPU decodes"
                           " JPEG only)")
    if cores >= CORES_FOR_WORKER_DECODE:
        return "workers", (f"{cores} CPU cores per GPU decode fast enough (>="
                           f" {CORES_FOR_WORKER_DECODE}); the GPU keeps all its time for"
                           " the model")
    if not nvjpeg_available(device):
        return "workers", "this torchvision cannot decode JPEGs on the GPU (no nvJPEG)"
    return "device", (f"{cores} CPU cores per GPU cannot decode as fast as the GPU trains"
                      f" (workers need about {CORES_FOR_WORKER_DECODE}): nvJPEG + crop on the"
                      " GPU, overlapped with training")


def load_data(args, device=None, ranks=None, options=DEFAULT):
    """-> (train_set, val_set or None, num_classes, the SampleFormat its loader yields). For an
    ImageFolder or tar shards the --decode choice is made here, once: SampleFormat.JPEG_BYTES
    (device) or DECODED (workers) says which (decode_path)."""
    if args.data == "digits":
        train, val = digits_split()
        return train, val, 10, SampleFormat.LOW_RES
    if args.data == "synthetic":
        train, val = synthetic_split(args.synthetic_size, args.num_classes or 1000, args.seed)
        return train, val, args.num_classes or 1000, SampleFormat.LOW_RES
    if not os.path.isdir(args.data):
        raise UsageError(f"--data {args.data}: no such directory: give an ImageFolder path,"
                         " or 'synthetic' or 'digits'")
    device = device or torch.device("cpu")
    folder = ImageFolderData(args.data, args.image_size, "workers", options)
    decode, why = pick_decode(args, device, folder.paths, ranks.local_world if ranks else 1)
    if ranks is None or ranks.main:
        for loop in folder.loops[:5]:
            print(f"{PROG}: warning: --data: {loop} leads back into a folder that contains it"
                  f" (a symlink loop, to {os.path.realpath(loop)}): not followed; its images"
                  " are counted once", file=sys.stderr, flush=True)
        if args.decode == "auto":
            print(f"--decode auto: {decode} ({why})", flush=True)
        note = large_jpeg_note(folder.paths, args.image_size)
        if note:
            print(note, flush=True)
    if decode == "device":
        folder.to_bytes()
    return (folder.train, folder.val, len(folder.classes),
            SampleFormat.JPEG_BYTES if decode == "device" else SampleFormat.DECODED)


def decode_path(sample_format):
    """The --decode path a SampleFormat means: 'device', 'workers', or None (in-memory data)."""
    return {SampleFormat.JPEG_BYTES: "device", SampleFormat.DECODED: "workers"}.get(sample_format)


def default_workers(sample_format, local_world=1):
    """DataLoader workers when --num-workers is not given: none for in-memory data; for
    decoding in the workers every core of this process's share but one (on an H200 with 16
    cores, 15 workers trained at 2,473 images/s, 8 at 1,642); for --decode device, where they
    only read files (and decode --decode-cpu-share of them), up to 8."""
    cores = cpu_cores(local_world)
    if sample_format is SampleFormat.LOW_RES:
        return 0
    return max(1, cores - 1) if sample_format is SampleFormat.DECODED else min(8, cores)


def to_device(x, y, sample_format, image_size, device, channels_last, train=True,
              bad_images=None, options=DEFAULT):
    """A loader batch -> (normalised images, labels) on the device. For ImageFolder data the
    unreadable samples are dropped (and reported to bad_images, which may stop the run)."""
    if sample_format is SampleFormat.DECODED:
        x, bad = x
        (BadImages() if bad_images is None else bad_images).report(bad)
        if x is None:
            raise BadImageError(f"no image of a batch of {len(bad)} could be read (the first:"
                                f" {bad[0][0]}): check the data set")
    if sample_format is SampleFormat.JPEG_BYTES:
        x, keep = decode_on_device(x, train, image_size, device, bad_images,
                                   channels_last=channels_last, options=options)
        y = y[list(keep)] if len(keep) != len(y) else y
        return x, y.to(device, non_blocking=True)
    if sample_format is SampleFormat.ON_DEVICE:
        return x, y
    y = y.to(device, non_blocking=True)
    x = x.to(device, non_blocking=True)
    if sample_format is SampleFormat.LOW_RES:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = (x - 0.5) / 0.25
    elif sample_format is SampleFormat.DECODED:
        return normalise(x, device, channels_last), y
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    else:
        x = x.contiguous()
    return x, y


class ResumableSampler(DistributedSampler):
    """DistributedSampler whose epoch can start part-way: a resumed run sees exactly the
    batches the interrupted run had not reached, in the same order."""

    def __init__(self, dataset, ranks, seed):
        super().__init__(dataset, num_replicas=ranks.world, rank=ranks.rank, shuffle=True,
                         seed=seed,
                         drop_last=True)
        self.start = 0

    def __iter__(self):
        return iter(list(super().__iter__())[self.start:])

    def __len__(self):
        return self.num_samples - self.start
