#!/usr/bin/env python3
"""train_amp.py: train a torchvision image classifier with automatic mixed precision (AMP).
Resumable (SIGTERM-safe checkpoints), runs unchanged under torchrun (DDP), and --compare
measures what AMP buys on this machine: FP32 vs AMP, as a table, JSON and a PNG chart."""
import argparse
import contextlib
import datetime
import difflib
import importlib
import json
import math
import os
import pathlib
import random
import shutil
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

PROG = "train_amp.py"
CKPT_FORMAT = "train_amp/1"
# Checkpoint fields that must match on --resume: changing any of them changes what the saved
# weights, optimizer moments or data order mean, so continuing would silently train a different job.
# --epochs/--steps may change (to train longer); the LR schedule then stretches from there on.
RESUME_KEYS = ("model", "data", "num_classes", "image_size", "batch_size", "world_size",
               "amp", "seed", "lr")
GiB = 2 ** 30

EPILOG = """\
examples:
  train_amp.py --data digits --model resnet18 --epochs 5          # real data, no download
  train_amp.py --data /data/imagenet --epochs 90 --checkpoint-dir ckpt
  train_amp.py --data /data/imagenet --epochs 90 --checkpoint-dir ckpt --resume
  train_amp.py --benchmark --model resnet50 --batch-size 256     # images/s + peak memory
  train_amp.py --compare --data digits --model resnet18 --epochs 3   # FP32 vs AMP report
  torchrun --nproc-per-node 8 /usr/local/bin/train_amp.py --data /data/imagenet
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      /usr/local/bin/train_amp.py --data /data/imagenet

AMP: autocast runs matmuls/convolutions in 16 bits while the weights stay FP32. fp16 needs
a GradScaler (scale -> backward -> unscale_ -> clip_grad_norm_ -> step -> update); bf16 has
FP32's range and needs none. --amp auto picks bf16 where the GPU has it (Ampere and newer),
else fp16; on CPU it means bf16 autocast. SIGTERM (docker stop, a scheduler's preemption)
saves a checkpoint at the end of the current step and exits 0; --resume continues there.
Errors in the command line exit with status 2 and a one-line fix."""


class UsageError(Exception):
    """A problem the user can fix by changing the command line: one line, exit status 2."""


class Stopped(Exception):
    """SIGTERM/SIGINT arrived; raised at a step boundary after the checkpoint is written."""


# ----------------------------------------------------------------------------------------
# command line

def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n")[0].split(": ", 1)[1],
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default="resnet50",
                   help="torchvision classification model name, random init (default: resnet50;"
                        " --list-models shows all)")
    g.add_argument("--list-models", action="store_true", help="print the model names and exit")
    g.add_argument("--data", default="synthetic",
                   help="'synthetic' (random images made in memory), 'digits' (scikit-learn's"
                        " bundled 8x8 handwritten digits, upscaled: real data, no download) or"
                        " the path of an ImageFolder (class subfolders; if it holds train/ and"
                        " val/, those are used) (default: synthetic)")
    g.add_argument("--image-size", type=positive_int, default=None,
                   help="side of the square training images (default: 224; 32 for digits)")
    g.add_argument("--num-classes", type=positive_int, default=None,
                   help="classes for synthetic data (default: 1000; digits: 10; ImageFolder:"
                        " its class folders)")
    g.add_argument("--synthetic-size", type=positive_int, default=4096,
                   help="images in the synthetic training set (default: 4096)")
    g.add_argument("--num-workers", type=int, default=None,
                   help="DataLoader worker processes (default: 0 for in-memory data, else"
                        " min(8, CPUs per process))")
    g.add_argument("--decode", choices=("workers", "device"), default="workers",
                   help="ImageFolder JPEGs: decode and augment in the DataLoader workers (PIL),"
                        " or only read files there and decode + augment on the training device"
                        " (nvJPEG on a GPU; for when the CPUs cannot keep up) (default: workers)")

    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, default=1, help="epochs (default: 1)")
    g.add_argument("--steps", type=positive_int, default=None,
                   help="stop after this many optimizer steps in total (overrides --epochs);"
                        " with --benchmark: measured steps (default 30)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="images per step per process (default: 256; 64 for digits)")
    g.add_argument("--lr", type=float, default=None,
                   help="peak learning rate of SGD with momentum (default: 0.1 x global batch"
                        " / 256); linear warm-up then cosine decay, per step")
    g.add_argument("--weight-decay", type=float, default=5e-5, help="(default: 5e-5)")
    g.add_argument("--warmup-steps", type=int, default=None,
                   help="LR warm-up steps (default: 5%% of the steps); with --benchmark: untimed"
                        " steps before measuring (default: 10, 20 with --compile)")
    g.add_argument("--grad-clip", type=float, default=1.0,
                   help="clip the global gradient norm to this (after unscaling); 0 = off"
                        " (default: 1.0)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    g.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels, cudnn.benchmark off (slower; for debugging)")

    g = p.add_argument_group("precision and speed")
    g.add_argument("--amp", choices=("auto", "fp16", "bf16", "off"), default="auto",
                   help="autocast dtype. auto: bf16 on GPUs that have it, else fp16 (with"
                        " GradScaler); bf16 on CPU. off: FP32 (default: auto)")
    g.add_argument("--tf32", action="store_true",
                   help="let FP32 matmuls/convolutions use TF32 tensor cores (default: off, so"
                        " --amp off is strict FP32)")
    g.add_argument("--channels-last", nargs="?", const="on", default="auto",
                   choices=("auto", "on", "off"),
                   help="NHWC memory format, faster for convolutions on tensor cores. auto: on"
                        " for conv nets on a GPU (default: auto; bare flag = on)")
    g.add_argument("--compile", nargs="?", const="on", default="auto",
                   choices=("auto", "on", "off", "tuned"),
                   help="torch.compile the model (TorchInductor; needs g++, and Triton on GPU);"
                        " the first steps take about a minute longer. auto: on for a GPU when"
                        " Triton and a C compiler are there (ResNet-50 AMP ran 1.4x faster"
                        " compiled on an H200), off on CPU. tuned: on, plus Inductor's"
                        " coordinate-descent tuning of every generated kernel: about 4 more"
                        " minutes the first time (cached in TORCHINDUCTOR_CACHE_DIR: the image's CACHE_DIR),"
                        " then about 6%% faster (ResNet-50 AMP on an H200: 7,100 images/s)"
                        " (default: auto; bare flag = on)")
    g.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="(default: auto = cuda if available)")

    g = p.add_argument_group("checkpoints and logging")
    g.add_argument("--checkpoint-dir", default="checkpoints",
                   help="where last.pt is written at each epoch end, every --save-every steps"
                        " and on SIGTERM (default: ./checkpoints; '' = never)")
    g.add_argument("--save-every", type=int, default=0,
                   help="also save every N steps (default: 0 = epoch ends and SIGTERM only)")
    g.add_argument("--resume", nargs="?", const="auto", default=None, metavar="PATH",
                   help="continue from PATH (bare flag: CHECKPOINT_DIR/last.pt); a missing,"
                        " corrupt or mismatched checkpoint is an error, never a fresh start")
    g.add_argument("--log-every", type=positive_int, default=20,
                   help="progress update every N steps (default: 20)")
    g.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default="auto",
                   help="tqdm bar, plain log lines, or nothing (default: auto = bar on a TTY)")
    g.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="write TensorBoard scalars (loss, lr, images/s, accuracy) to DIR")
    g.add_argument("--metrics", metavar="FILE", default=None,
                   help="write per-epoch metrics and the final result as JSON")

    g = p.add_argument_group("modes")
    g.add_argument("--benchmark", action="store_true",
                   help="timing only: one synthetic batch already on the device, --warmup-steps"
                        " untimed then --steps timed; prints images/s and peak memory")
    g.add_argument("--compare", action="store_true",
                   help="run the same job in FP32 (TF32 off) and with AMP, then print a markdown"
                        " table and write compare.json, compare.md and compare.png to --out")
    g.add_argument("--out", default="amp_compare",
                   help="output directory of --compare (and --benchmark JSON) (default:"
                        " ./amp_compare)")
    return p


# ----------------------------------------------------------------------------------------
# process / device set-up

class Dist:
    """Who we are under torchrun (or alone). rank 0 prints and saves; everybody trains."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.enabled = self.world > 1
        self.ctrl = None  # a gloo group for tiny CPU-side control messages (stop flag)

    @property
    def main(self):
        return self.rank == 0

    def init(self, device):
        if not self.enabled:
            return
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30),
                                device_id=device if device.type == "cuda" else None)
        # The stop flag is agreed on every step; on gloo (CPU) that never waits for the GPU.
        self.ctrl = dist.new_group(backend="gloo") if backend == "nccl" else None

    def any_true(self, flag):
        if not self.enabled:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl)
        return bool(t.item())

    def barrier(self):
        if self.enabled:
            dist.barrier(group=self.ctrl)

    def close(self):
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def say(ctx, *a, **k):
    if ctx.main:
        print(*a, **k, flush=True)


def pick_device(args, d):
    if args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA GPU is visible: run the container with"
                         " --gpus all, or drop --device cuda")
    return torch.device("cuda", d.local_rank)


def resolve_amp(mode, device):
    """The autocast dtype for --amp on this device (None = FP32)."""
    if mode == "off":
        return None
    if device.type == "cpu":
        if mode == "fp16":
            raise UsageError("--amp fp16 needs a CUDA GPU (float16 autocast with GradScaler);"
                             " on CPU use --amp bf16 (or auto), or --amp off")
        return torch.bfloat16
    # bf16 tensor cores arrived with Ampere (sm_80); older GPUs only emulate it, slowly.
    has_bf16 = torch.cuda.get_device_capability(device)[0] >= 8
    if mode == "bf16" and not has_bf16:
        raise UsageError(f"{torch.cuda.get_device_name(device)} has no bf16 tensor cores:"
                         " use --amp fp16 (or auto)")
    if mode == "auto":
        return torch.bfloat16 if has_bf16 else torch.float16
    return torch.bfloat16 if mode == "bf16" else torch.float16


def amp_name(dtype):
    return {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def check_compiler(device):
    """Fail early with the fix instead of a long Inductor traceback after the first step."""
    supported = getattr(torch._dynamo, "is_dynamo_supported", lambda: True)
    if not supported():
        raise UsageError(f"--compile is not supported on Python {sys.version.split()[0]} with"
                         f" torch {torch.__version__}: drop --compile")
    # On CPU Inductor compiles C++ kernels with $CXX (default g++); on a GPU it writes Triton
    # kernels, and Triton builds its launchers with $CC (default: the first of cc/gcc/clang).
    cxx = os.environ.get("CXX") or "g++"
    if device.type == "cpu" and shutil.which(cxx) is None:
        raise UsageError(f"--compile needs a C++ compiler and {cxx!r} was not found: install g++"
                         " (apt-get install g++) or set CXX, or drop --compile")
    if device.type == "cuda":
        cc = os.environ.get("CC")
        if (shutil.which(cc) if cc else next(filter(shutil.which, ("cc", "gcc", "clang")),
                                            None)) is None:
            raise UsageError("--compile on a GPU needs a C compiler for Triton: install gcc"
                             " or set CC, or drop --compile")
        try:
            import triton  # noqa: F401
        except ImportError:
            raise UsageError("--compile on a GPU needs Triton: pip install triton (the version"
                             " torch pins), or drop --compile") from None


def use_compile(args, device):
    """--compile on/tuned/off as given; auto: on for a GPU when compiling can work, else off."""
    if args.compile != "auto":
        return args.compile in ("on", "tuned")
    if device.type != "cuda":
        return False  # on CPU, compiling costs more than it saves on all but long runs
    try:
        check_compiler(device)
    except UsageError:
        return False
    return True


def use_channels_last(args, device, net):
    """--channels-last on/off as given; auto: on for conv nets on a GPU (tensor-core NHWC)."""
    return args.channels_last == "on" or (
        args.channels_last == "auto" and device.type == "cuda" and is_conv_net(net))


def wrap_model(net, args, device, d):
    """DDP when distributed, then torch.compile when on: (the model to call, compiled?)."""
    model = net
    if d.enabled:
        model = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None)
    compiled = use_compile(args, device)
    if compiled:
        # Inductor reads its config when it compiles, at the first call: set it either way so
        # one process (scripts/bench_amp.py) can run tuned and untuned configurations in turn.
        # Coordinate descent re-times each generated kernel's block sizes around the
        # heuristic's pick; on ResNet-50 that speeds up the BatchNorm/ReLU kernels.
        inductor_config().coordinate_descent_tuning = args.compile == "tuned"
    return (torch.compile(model) if compiled else model), compiled


def inductor_config():
    return importlib.import_module("torch._inductor.config")  # not loaded by "import torch"


def tuning_on():
    """What Inductor will do (read back, so logs and results report the setting in force)."""
    return inductor_config().coordinate_descent_tuning


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


def configure_backends(args, device):
    # Strict FP32 unless asked: TF32 changes results and would blur the FP32-vs-AMP comparison.
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    # cudnn.benchmark times the convolution algorithms once per input shape and keeps the fastest.
    torch.backends.cudnn.benchmark = device.type == "cuda" and not args.deterministic
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


# ----------------------------------------------------------------------------------------
# model

def classification_models():
    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_model_name(name):
    names = classification_models()
    if name not in names:
        near = difflib.get_close_matches(name, names, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else "see --list-models"
        raise UsageError(f"unknown model {name!r}: {hint} (torchvision classification models"
                         " only, e.g. resnet50)")


def build_model(name, num_classes, image_size):
    check_model_name(name)
    kwargs = {"weights": None, "num_classes": num_classes}
    if name.startswith(("vit_", "swin_v2", "maxvit")):
        kwargs["image_size"] = image_size
    if name in ("inception_v3", "googlenet"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = True
    try:
        return torchvision.models.get_model(name, **kwargs)
    except TypeError:
        kwargs.pop("image_size", None)
        return torchvision.models.get_model(name, **kwargs)


def logits_of(out):
    # A few torchvision models return named tuples in training mode.
    return out.logits if hasattr(out, "logits") else out


def is_conv_net(model):
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


# ----------------------------------------------------------------------------------------
# data: every source yields (uint8 or float CPU tensors, labels); to_device() finishes the
# preprocessing on the device, so the CPU side stays cheap and the copy small.

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
_NORM = {}  # device -> (mean, std): a copy from pageable memory per step would stall the GPU


def _norm_on(device):
    if device not in _NORM:
        _NORM[device] = (MEAN.to(device), STD.to(device))
    return _NORM[device]


class LowResDataset(Dataset):
    """Small float images kept in memory, upscaled on the device (digits and synthetic)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def digits_split():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # 1797 x 1 x 8 x 8
    y = torch.tensor(d.target, dtype=torch.int64)
    # A fixed split (not --seed) so every run, FP32 or AMP, is scored on the same images. 40%
    # (719 images) for validation: with 20% one image is 0.28 points and two equally good
    # models often differ by more than a point by chance alone.
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    n_val = len(y) * 2 // 5
    val, train = perm[:n_val], perm[n_val:]
    return LowResDataset(x[train], y[train]), LowResDataset(x[val], y[val])


def synthetic_split(n_train, num_classes, seed):
    """Class-dependent low-res patterns plus noise: a learnable task, made in memory."""
    g = torch.Generator().manual_seed(10_000 + seed)
    patterns = torch.randn(num_classes, 3, 8, 8, generator=g)

    def make(n):
        y = torch.randint(num_classes, (n,), generator=g)
        # Scaled to the digits' range (mean 0.5, about 0.25 spread): to_device() normalises both.
        x = 0.5 + 0.2 * (patterns[y] + 0.8 * torch.randn(n, 3, 8, 8, generator=g))
        return LowResDataset(x, y)

    return make(n_train), make(max(256, n_train // 8))


class FileBytes(Dataset):
    """An ImageFolder's files, undecoded: for --decode device the workers only read files."""

    def __init__(self, folder):
        self.samples, self.classes = folder.samples, folder.classes

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        return torchvision.io.read_file(path), label


def collate_bytes(batch):
    # One flat tensor + lengths: a worker hands the main process one shared-memory block per
    # batch; a list of 256 small tensors would need 256 file descriptors ("Bad file descriptor").
    lengths = torch.tensor([len(b[0]) for b in batch])
    return (torch.cat([b[0] for b in batch]), lengths), torch.tensor([b[1] for b in batch])


class ImageFolderData:
    def __init__(self, root, image_size, decode="workers"):
        import torchvision.transforms.v2 as T
        root = pathlib.Path(root)
        train_dir, val_dir = (root / "train", root / "val") if (root / "train").is_dir() else (
            root, None)
        train_tf = T.Compose([T.RandomResizedCrop(image_size, antialias=True),
                              T.RandomHorizontalFlip(), T.PILToTensor()])
        val_tf = T.Compose([T.Resize(int(image_size * 8 / 7), antialias=True),
                            T.CenterCrop(image_size), T.PILToTensor()])
        try:
            self.train = torchvision.datasets.ImageFolder(str(train_dir), transform=train_tf)
            self.val = (torchvision.datasets.ImageFolder(str(val_dir), transform=val_tf)
                        if val_dir and val_dir.is_dir() else None)
        except (FileNotFoundError, OSError) as e:
            raise UsageError(f"--data {root}: no images found ({e}); an ImageFolder needs"
                             " class subfolders holding .jpg/.png files") from None
        self.classes = self.train.classes
        if decode == "device":
            self.train = FileBytes(self.train)
            self.val = FileBytes(self.val) if self.val is not None else None


def decode_on_device(packed, train, image_size, device):
    """--decode device: JPEG decode on the device (nvJPEG on a GPU, batched), then a random
    resized crop + flip (train) or a centre crop (val), each image resized to image_size."""
    from torchvision.io import ImageReadMode, decode_jpeg
    flat, lengths = packed
    datas = list(torch.split(flat, lengths.tolist()))
    try:
        imgs = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
    except RuntimeError as e:
        raise UsageError(f"--decode device could not decode a batch ({str(e).splitlines()[0]});"
                         " only JPEG files decode on the device: use --decode workers") from None
    out = []
    for img in imgs:
        h, w = img.shape[-2:]
        if train:
            # torchvision's RandomResizedCrop parameters: 8-100% of the area, aspect 3/4-4/3.
            for _ in range(10):
                area = h * w * random.uniform(0.08, 1.0)
                aspect = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
                cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
                if 0 < cw <= w and 0 < ch <= h:
                    break
            else:
                ch = cw = min(h, w)
            top, left = random.randint(0, h - ch), random.randint(0, w - cw)
            crop = img[:, top:top + ch, left:left + cw]
            if random.random() < 0.5:
                crop = crop.flip(-1)
        else:
            side = round(min(h, w) * 7 / 8)  # the same field of view as Resize(8/7) + CenterCrop
            top, left = (h - side) // 2, (w - side) // 2
            crop = img[:, top:top + side, left:left + side]
        out.append(F.interpolate(crop[None].float(), size=(image_size, image_size),
                                 mode="bilinear", antialias=True, align_corners=False))
    return torch.cat(out)


def load_data(args):
    """-> (train_set, val_set or None, num_classes, kind) with kind 'lowres' or 'images'."""
    if args.data == "digits":
        train, val = digits_split()
        return train, val, 10, "lowres"
    if args.data == "synthetic":
        train, val = synthetic_split(args.synthetic_size, args.num_classes or 1000, args.seed)
        return train, val, args.num_classes or 1000, "lowres"
    if not os.path.isdir(args.data):
        raise UsageError(f"--data {args.data}: no such directory: give an ImageFolder path,"
                         " or 'synthetic' or 'digits'")
    folder = ImageFolderData(args.data, args.image_size, args.decode)
    return (folder.train, folder.val, len(folder.classes),
            "bytes" if args.decode == "device" else "images")


def to_device(x, y, kind, image_size, device, channels_last, train=True):
    y = y.to(device, non_blocking=True)
    if kind == "bytes":
        mean, std = _norm_on(device)
        x = (decode_on_device(x, train, image_size, device).div_(255) - mean) / std
    else:
        x = x.to(device, non_blocking=True)
    if kind == "lowres":
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = (x - 0.5) / 0.25
    elif kind == "images":
        mean, std = _norm_on(device)
        x = (x.float().div_(255) - mean) / std
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    else:
        x = x.contiguous()
    return x, y


class ResumableSampler(DistributedSampler):
    """DistributedSampler whose epoch can start part-way: a resumed run sees exactly the
    batches the interrupted run had not reached, in the same order."""

    def __init__(self, dataset, d, seed):
        super().__init__(dataset, num_replicas=d.world, rank=d.rank, shuffle=True, seed=seed,
                         drop_last=True)
        self.start = 0

    def __iter__(self):
        return iter(list(super().__iter__())[self.start:])

    def __len__(self):
        return self.num_samples - self.start


# ----------------------------------------------------------------------------------------
# one training step, the way the article prescribes

def autocast(device_type, amp_dtype):
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=amp_dtype)


def train_step(model, x, y, optimizer, scaler, amp_dtype, grad_clip, device_type):
    """autocast forward; then scale -> backward -> unscale_ -> clip_grad_norm_ -> step -> update.
    With bf16 or FP32 the scaler is disabled and those calls are pass-throughs."""
    with autocast(device_type, amp_dtype):
        logits = logits_of(model(x))
        # The loss in FP32: log-softmax over 16-bit logits loses the small probabilities.
        loss = F.cross_entropy(logits.float(), y)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if grad_clip > 0:
        # Unscale first, or the threshold would apply to the scaled (e.g. x65536) gradients.
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)  # skips the step if the unscaled gradients hold inf/NaN
    scaler.update()
    return loss.detach(), logits.detach()


def make_optimizer(model, args, lr, device, amp_dtype):
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)  # no weight decay on BN/bias
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # fused=True: one kernel for the whole update on GPU instead of one per tensor. Not with a
    # GradScaler (fp16): fused SGD advances its momentum on the overflow steps the scaler must
    # skip, so the routine first-step overflow turns every weight into NaN (seen on an H200,
    # torch 2.11; LibreYOLO/libreyolo#771). foreach SGD skips those steps cleanly.
    fused = {"fused": True} if device.type == "cuda" and amp_dtype != torch.float16 else {}
    return torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True, **fused)


def make_scheduler(optimizer, warmup, total):
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def peak_mem_gib(device):
    return torch.cuda.max_memory_allocated(device) / GiB if device.type == "cuda" else None


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------
# checkpoints

def rng_state():
    st = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np_st = np.random.get_state()
    # Plain tensors and tuples only, so the file loads with torch.load(weights_only=True).
    st["numpy"] = (np_st[0], torch.from_numpy(np_st[1].astype(np.int64)), int(np_st[2]),
                   int(np_st[3]), float(np_st[4]))
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st):
    random.setstate(st["python"])
    torch.set_rng_state(st["torch"])
    name, keys, pos, has_gauss, cached = st["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in st and torch.cuda.is_available() and len(st["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(st["cuda"])


def save_checkpoint(path, state):
    """Write to a temp file then rename: a kill mid-write leaves the old last.pt intact."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, config):
    path = pathlib.Path(path)
    if not path.is_file():
        raise UsageError(f"--resume: no checkpoint at {path}: check --checkpoint-dir, or drop"
                         " --resume to start a fresh run")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same to the user
        raise UsageError(f"--resume: {path} is corrupt or not a train_amp checkpoint"
                         f" ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
                         ": delete it or resume from an older copy") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CKPT_FORMAT:
        raise UsageError(f"--resume: {path} is not a {CKPT_FORMAT} checkpoint: give one written"
                         " by this script, or drop --resume")
    diffs = [f"--{k.replace('_', '-')} {ckpt['config'].get(k)} (now {config.get(k)})"
             for k in RESUME_KEYS if ckpt["config"].get(k) != config.get(k)]
    if diffs:
        raise UsageError(f"--resume: {path} was made with different settings: "
                         + "; ".join(diffs) + ": rerun with the checkpoint's settings, or use"
                         " another --checkpoint-dir for a new run")
    return ckpt


# ----------------------------------------------------------------------------------------
# progress output

class Progress:
    """tqdm bar on a TTY, else one plain line every --log-every steps; rank 0 only."""

    def __init__(self, args, d, epoch, epochs, total, start):
        mode = args.progress
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode if d.main else "none"
        self.epoch, self.epochs, self.total = epoch, epochs, total
        self.bar = None
        if self.mode == "bar":
            from tqdm import tqdm
            try:
                cols = os.get_terminal_size(sys.stderr.fileno()).columns
            except OSError:
                cols = 0
            # A TTY nobody has sized yet (docker run -t, detached) reports 0x0, and tqdm then
            # draws nothing at all (it thinks there are -1 rows): fall back to a fixed size.
            size = {"dynamic_ncols": True} if cols > 0 else {"ncols": 110, "nrows": 24}
            self.bar = tqdm(total=total, initial=start, desc=f"epoch {epoch + 1}/{epochs}",
                            unit="step", file=sys.stderr, leave=False, **size)

    def update(self, step, n, loss, ips, mem):
        mem_s = f"{mem:.2f}GiB" if mem is not None else "n/a(cpu)"
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix_str(f"loss={loss:.4f} img/s={ips:.0f} mem={mem_s}",
                                     refresh=True)
        elif self.mode == "lines":
            print(f"epoch {self.epoch + 1}/{self.epochs} step {step}/{self.total}"
                  f" loss={loss:.4f} img/s={ips:.0f} mem={mem_s}", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------------------
# the training job

def job_config(args, num_classes, d, amp_dtype):
    return {"model": args.model, "data": args.data, "num_classes": num_classes,
            "image_size": args.image_size, "batch_size": args.batch_size, "world_size": d.world,
            "amp": amp_name(amp_dtype), "seed": args.seed, "lr": args.lr,
            "epochs": args.epochs, "steps": args.steps}


@torch.no_grad()
def evaluate(net, loader, kind, args, device, amp_dtype, channels_last, d):
    """Loss and accuracy on this rank's shard; summed over ranks (shards do not overlap)."""
    net.eval()
    tot = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for x, y in loader:
        x, y = to_device(x, y, kind, args.image_size, device, channels_last, train=False)
        with autocast(device.type, amp_dtype):
            logits = logits_of(net(x))
        tot[0] += F.cross_entropy(logits.float(), y, reduction="sum")
        tot[1] += (logits.argmax(1) == y).sum()
        tot[2] += len(y)
    net.train()
    if d.enabled:
        dist.all_reduce(tot)
    loss_sum, correct, count = tot.tolist()
    return loss_sum / max(count, 1), 100.0 * correct / max(count, 1)


def fold_epoch_acc(acc, run_loss, run_correct, run_seen, seconds, d, device):
    """Add this stretch of steps to the epoch's sums, summed over all ranks. The totals live on
    rank 0 only (others restart from zero), so a checkpoint - which rank 0 writes - holds the
    whole epoch so far and the final all-rank sum never counts a stretch twice."""
    part = torch.stack([run_loss.double(), run_correct.double(),
                        torch.tensor(float(run_seen), dtype=torch.float64, device=device)])
    if d.enabled:
        dist.all_reduce(part)
    loss, correct, seen = part.tolist()
    if not d.main:
        return {"loss": 0.0, "correct": 0, "seen": 0, "time": acc["time"] + seconds}
    return {"loss": acc["loss"] + loss, "correct": acc["correct"] + int(correct),
            "seen": acc["seen"] + int(seen), "time": acc["time"] + seconds}


def train(args, d, device, stop, label=None):
    """Run one training job; return its result dict (rank 0's view). Raises Stopped."""
    amp_dtype = resolve_amp(args.amp, device)
    configure_backends(args, device)
    set_seed(args.seed)
    train_set, val_set, num_classes, kind = load_data(args)
    if len(train_set) < args.batch_size * d.world:
        raise UsageError(f"--batch-size {args.batch_size} x {d.world} process(es) is more than"
                         f" the {len(train_set)} training images: use a smaller --batch-size")
    net = build_model(args.model, num_classes, args.image_size).to(device)
    channels_last = use_channels_last(args, device, net)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)

    sampler = ResumableSampler(train_set, d, args.seed)
    workers = args.num_workers
    if workers is None:
        workers = 0 if kind == "lowres" else min(8, max(1, (os.cpu_count() or 2) // d.local_world))
    # Its own generator, reseeded per epoch: worker seeds then never draw from the global RNG,
    # so a resumed run's random stream matches the uninterrupted one.
    loader_gen = torch.Generator()
    loader_kw = {"num_workers": workers, "pin_memory": device.type == "cuda",
                 "persistent_workers": workers > 0, "generator": loader_gen}
    if workers > 0:
        loader_kw["prefetch_factor"] = 4
    if kind == "bytes":
        loader_kw["collate_fn"] = collate_bytes
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        **loader_kw)
    val_loader = None
    if val_set is not None:
        shard = Subset(val_set, range(d.rank, len(val_set), d.world))
        val_loader = DataLoader(shard, batch_size=args.batch_size, shuffle=False,
                                num_workers=workers, pin_memory=device.type == "cuda",
                                collate_fn=collate_bytes if kind == "bytes" else None)

    steps_per_epoch = len(sampler) // args.batch_size
    total = args.steps if args.steps else steps_per_epoch * args.epochs
    epochs = math.ceil(total / steps_per_epoch)
    lr = args.lr if args.lr is not None else 0.1 * args.batch_size * d.world / 256
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, total // 20)
    optimizer = make_optimizer(net, args, lr, device, amp_dtype)
    scheduler = make_scheduler(optimizer, warmup, total)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)

    config = job_config(args, num_classes, d, amp_dtype)
    ckpt_path = pathlib.Path(args.checkpoint_dir) / "last.pt" if args.checkpoint_dir else None
    start_epoch, start_step, global_step, history = 0, 0, 0, []
    epoch_acc = {"loss": 0.0, "correct": 0, "seen": 0, "time": 0.0}
    if args.resume:
        path = ckpt_path if args.resume == "auto" else pathlib.Path(args.resume)
        if path is None:
            raise UsageError("--resume without a path needs --checkpoint-dir")
        ckpt = load_checkpoint(path, config)
        try:
            net.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise UsageError(f"--resume: {path} does not fit this model/optimizer"
                             f" ({str(e).splitlines()[0][:120]}): resume with the flags it was"
                             " made with") from None
        scaler.load_state_dict(ckpt["scaler"])
        scheduler.load_state_dict(ckpt["scheduler"])
        start_epoch, start_step = ckpt["epoch"], ckpt["step_in_epoch"]
        global_step, history = ckpt["global_step"], list(ckpt["history"])
        epoch_acc = dict(ckpt["epoch_acc"]) if d.main else {**ckpt["epoch_acc"], "loss": 0.0,
                                                              "correct": 0, "seen": 0}
        set_rng_state(ckpt["rng"])
        say(d, f"resumed from {path}: epoch {start_epoch + 1} step {start_step}/"
               f"{steps_per_epoch} (global step {global_step}/{total})")
        if global_step >= total:
            say(d, "the checkpoint has already finished this job: nothing to do")
            return {"config": config, "history": history, "final": history[-1] if history
                    else {}, "already_done": True}

    model, compiled = wrap_model(net, args, device, d)

    tb = None
    if args.tensorboard and d.main:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UsageError("--tensorboard needs the tensorboard package: pip install"
                             " tensorboard, or drop --tensorboard") from None
        tb = SummaryWriter(args.tensorboard)

    def checkpoint(epoch, step_in_epoch):
        if ckpt_path is None or not d.main:
            return
        save_checkpoint(ckpt_path, {
            "format": CKPT_FORMAT, "config": config, "model": net.state_dict(),
            "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
            "scheduler": scheduler.state_dict(), "epoch": epoch, "step_in_epoch": step_in_epoch,
            "global_step": global_step, "history": history, "epoch_acc": epoch_acc,
            "rng": rng_state(), "torch_version": str(torch.__version__)})

    name = label or f"{args.model} amp={amp_name(amp_dtype)}"
    say(d, f"{name}: data={args.data} ({len(train_set)} train images, {num_classes} classes,"
           f" {args.image_size}px) device={device.type} world_size={d.world}"
           f" batch={args.batch_size}/process amp={amp_name(amp_dtype)}"
           f"{' (auto)' if args.amp == 'auto' else ''} grad_scaler={scaler.is_enabled()}"
           f" channels_last={channels_last} compile={compiled}"
           f"{' (tuned)' if compiled and tuning_on() else ''} tf32={args.tf32}"
           f" steps/epoch={steps_per_epoch} total_steps={total} lr={lr:g}")

    net.train()
    global_batch = args.batch_size * d.world
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)
        sampler.start = (start_step if epoch == start_epoch else 0) * args.batch_size
        loader_gen.manual_seed(args.seed * 1000 + epoch)
        first = start_step if epoch == start_epoch else 0
        if epoch != start_epoch or first == 0:
            epoch_acc = {"loss": 0.0, "correct": 0, "seen": 0, "time": 0.0}
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        n_steps = min(steps_per_epoch, total - epoch * steps_per_epoch)
        progress = Progress(args, d, epoch, epochs, n_steps, first)
        run_loss = torch.zeros((), device=device)
        run_correct = torch.zeros((), device=device, dtype=torch.int64)
        run_seen = 0
        t_epoch = time.perf_counter()
        t_log, log_steps, step = t_epoch, 0, first
        # Images/s leaves out the first steps of a run (cudnn autotuning, compilation).
        skip = min(5, max(0, n_steps - first - 1) // 2)
        t_measure, measured = None, 0
        for i, (x, y) in enumerate(loader):
            if step >= n_steps:
                break
            if i == skip:
                sync(device)
                t_measure = time.perf_counter()
            x, y = to_device(x, y, kind, args.image_size, device, channels_last)
            loss, logits = train_step(model, x, y, optimizer, scaler, amp_dtype,
                                      args.grad_clip, device.type)
            scheduler.step()
            step += 1
            global_step += 1
            log_steps += 1
            if t_measure is not None:
                measured += 1
            run_loss += loss.float() * len(y)
            run_correct += (logits.argmax(1) == y).sum()
            run_seen += len(y)
            last = step >= n_steps
            if log_steps >= args.log_every or last:
                # .item() waits for the GPU: only here, every --log-every steps.
                now = time.perf_counter()
                ips = log_steps * global_batch / max(now - t_log, 1e-9)
                progress.update(step, log_steps, loss.item(), ips, peak_mem_gib(device))
                if tb is not None:
                    tb.add_scalar("train/loss", loss.item(), global_step)
                    tb.add_scalar("train/images_per_s", ips, global_step)
                    tb.add_scalar("train/lr", scheduler.get_last_lr()[0], global_step)
                t_log, log_steps = now, 0
            stop_now = d.any_true(stop["flag"])
            if stop_now or (args.save_every and global_step % args.save_every == 0 and not last):
                epoch_acc = fold_epoch_acc(epoch_acc, run_loss, run_correct, run_seen,
                                           time.perf_counter() - t_epoch, d, device)
                run_loss.zero_(), run_correct.zero_()
                run_seen, t_epoch = 0, time.perf_counter()
                checkpoint(epoch, step)
                d.barrier()
                if stop_now:
                    progress.close()
                    where = (f"checkpoint saved to {ckpt_path}; continue with --resume"
                             if ckpt_path else "no --checkpoint-dir, nothing saved")
                    say(d, f"stopped by {stop['signal']} at epoch {epoch + 1} step {step}/"
                           f"{n_steps} (global step {global_step}/{total}): {where}")
                    raise Stopped()
        sync(device)
        t_end = time.perf_counter()
        progress.close()
        epoch_acc = fold_epoch_acc(epoch_acc, run_loss, run_correct, run_seen, t_end - t_epoch,
                                   d, device)
        rec = {"epoch": epoch + 1, "steps": step,
               "train_loss": epoch_acc["loss"] / max(epoch_acc["seen"], 1),
               "train_acc": 100.0 * epoch_acc["correct"] / max(epoch_acc["seen"], 1),
               "epoch_time_s": epoch_acc["time"],
               "images_per_s": (measured * global_batch / (t_end - t_measure)
                                if t_measure is not None and measured else None),
               "peak_mem_gib": peak_mem_gib(device)}
        if val_loader is not None:
            rec["val_loss"], rec["val_acc"] = evaluate(net, val_loader, kind, args, device,
                                                       amp_dtype, channels_last, d)
        history.append(rec)
        start_step = 0
        checkpoint(epoch + 1, 0)
        if tb is not None:
            for k, v in rec.items():
                if v is not None and k != "epoch":
                    tb.add_scalar(f"epoch/{k}", v, epoch + 1)
        ips = f"{rec['images_per_s']:.0f}" if rec["images_per_s"] else "n/a"
        mem = f"{rec['peak_mem_gib']:.2f} GiB" if rec["peak_mem_gib"] is not None else "n/a (CPU)"
        val = (f" val_loss {rec['val_loss']:.4f} val_acc {rec['val_acc']:.2f}%"
               if "val_loss" in rec else "")
        say(d, f"epoch {epoch + 1}/{epochs}: train_loss {rec['train_loss']:.4f} train_acc"
               f" {rec['train_acc']:.2f}%{val} | {ips} img/s, {rec['epoch_time_s']:.1f} s,"
               f" peak mem {mem}")
    if tb is not None:
        tb.close()
    return {"config": config, "channels_last": channels_last, "compile": compiled,
            "tf32": args.tf32, "device": device_name(device), "history": history,
            "final": history[-1]}


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


# ----------------------------------------------------------------------------------------
# --benchmark

def benchmark(args, device, d=None):
    """Images/s and peak memory of training steps on one synthetic batch already on the device.
    Used by --benchmark and by scripts/bench_amp.py (in-process, one config at a time)."""
    d = d or Dist()
    amp_dtype = resolve_amp(args.amp, device)
    configure_backends(args, device)
    set_seed(args.seed)
    num_classes = args.num_classes or 1000
    net = build_model(args.model, num_classes, args.image_size).to(device)
    channels_last = use_channels_last(args, device, net)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    model, compiled = wrap_model(net, args, device, d)
    optimizer = make_optimizer(net, args, 0.1 * args.batch_size / 256, device, amp_dtype)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    y = torch.randint(num_classes, (args.batch_size,), device=device)
    warm = args.warmup_steps if args.warmup_steps is not None else (20 if compiled else 10)
    steps = args.steps or 30
    t0 = time.perf_counter()
    for _ in range(warm):
        loss, _ = train_step(model, x, y, optimizer, scaler, amp_dtype, args.grad_clip,
                             device.type)
    sync(device)
    warm_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss, _ = train_step(model, x, y, optimizer, scaler, amp_dtype, args.grad_clip,
                             device.type)
    sync(device)
    dt = time.perf_counter() - t0
    loss_v = loss.item()
    return {"model": args.model, "batch_size": args.batch_size, "image_size": args.image_size,
            "amp": amp_name(amp_dtype), "tf32": args.tf32, "channels_last": channels_last,
            "compile": compiled, "compile_tuned": compiled and tuning_on(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "device": device_name(device), "world_size": d.world,
            "images_per_s": steps * args.batch_size * d.world / dt,
            "step_ms": 1000 * dt / steps, "warmup_s": warm_s, "measured_steps": steps,
            "peak_mem_gib": peak_mem_gib(device),
            "peak_reserved_gib": (torch.cuda.max_memory_reserved(device) / GiB
                                  if device.type == "cuda" else None),
            "loss_is_finite": math.isfinite(loss_v),
            "torch": torch.__version__}


# ----------------------------------------------------------------------------------------
# --compare

def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def compare(args, d, device, stop):
    out = pathlib.Path(args.out)
    # Comparison runs are measurements: no checkpoints, no resume.
    common = {**vars(args), "checkpoint_dir": "", "resume": None}
    fp32_args = argparse.Namespace(**{**common, "amp": "off", "tf32": False})
    amp_args = argparse.Namespace(**common)
    amp_dtype = resolve_amp(args.amp, device)
    if amp_dtype is None:
        raise UsageError("--compare with --amp off has nothing to compare: use --amp auto,"
                         " bf16 or fp16")
    runs = {}
    for key, a in (("fp32", fp32_args), ("amp", amp_args)):
        if device.type == "cuda":
            torch.cuda.empty_cache()
        runs[key] = train(a, d, device, stop, label=f"[compare {key}]")
    if not d.main:
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
    note = ("CPU run: FP32 vs bf16 autocast (no GPU, no GradScaler); CPU speed says nothing"
            " about GPU tensor cores." if device.type == "cpu" else
            f"GPU: {device_name(device)}; AMP {aname}"
            f"{' with GradScaler' if amp_dtype == torch.float16 else ' (no GradScaler needed)'}.")
    head = (f"{args.model}, --data {args.data}, {args.image_size}px, batch {args.batch_size}"
            f" x {d.world}, {runs['amp']['history'][-1]['steps']} steps/epoch x"
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


# ----------------------------------------------------------------------------------------

def fill_defaults(args):
    if args.batch_size is None:
        args.batch_size = 64 if args.data == "digits" else 256
    if args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size}: must be at least 1 (e.g."
                         " --batch-size 64)")
    if args.image_size is None:
        args.image_size = 32 if args.data == "digits" else 224
    if args.num_workers is not None and args.num_workers < 0:
        raise UsageError("--num-workers must be 0 or more")
    if args.grad_clip < 0:
        raise UsageError("--grad-clip must be 0 (off) or positive, e.g. --grad-clip 1.0")
    if args.benchmark and args.compare:
        raise UsageError("--benchmark and --compare are separate modes: pick one")


def main(argv=None):
    args = build_parser().parse_args(argv)
    d = Dist()
    if args.list_models:
        print("\n".join(classification_models()))
        return 0
    stop = {"flag": False, "signal": None}
    main_pid = os.getpid()

    def on_signal(signum, _frame):
        # Only set a flag: the step in flight finishes, then everybody saves and exits together.
        if not stop["flag"] and d.main and os.getpid() == main_pid:  # not DataLoader workers
            print(f"\n{signal.Signals(signum).name} received: stopping after this step",
                  file=sys.stderr, flush=True)
        stop["flag"], stop["signal"] = True, signal.Signals(signum).name

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        fill_defaults(args)
        device = pick_device(args, d)
        resolve_amp(args.amp, device)  # fail on --amp fp16 on CPU before any work
        if args.compile in ("on", "tuned"):
            check_compiler(device)
        if args.data not in ("synthetic", "digits") and not os.path.isdir(args.data):
            raise UsageError(f"--data {args.data}: no such directory: give an ImageFolder path,"
                             " or 'synthetic' or 'digits'")
        check_model_name(args.model)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        d.init(device)
        if args.benchmark:
            r = benchmark(args, device, d)
            mem = f"{r['peak_mem_gib']:.2f} GiB" if r["peak_mem_gib"] is not None else "n/a (CPU)"
            say(d, f"benchmark {r['model']} batch {r['batch_size']} {r['image_size']}px"
                   f" amp={r['amp']} tf32={r['tf32']} channels_last={r['channels_last']}"
                   f" compile={r['compile']}{' (tuned)' if r['compile_tuned'] else ''} on {r['device']}: {r['images_per_s']:.1f} images/s,"
                   f" {r['step_ms']:.1f} ms/step, peak mem {mem}")
            if d.main:
                out = pathlib.Path(args.out)
                out.mkdir(parents=True, exist_ok=True)
                (out / "benchmark.json").write_text(json.dumps(r, indent=2))
        elif args.compare:
            compare(args, d, device, stop)
        else:
            result = train(args, d, device, stop)
            if args.metrics and d.main:
                pathlib.Path(args.metrics).write_text(json.dumps(result, indent=2))
        return 0
    except UsageError as e:
        if d.main:
            print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return 2
    except Stopped:
        return 0
    finally:
        d.close()


if __name__ == "__main__":
    sys.exit(main())
