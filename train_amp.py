#!/usr/bin/env python3
"""train_amp.py: train a torchvision image classifier with automatic mixed precision (AMP).
Resumable (SIGTERM-safe checkpoints), runs unchanged under torchrun (DDP), and --compare
measures what AMP buys on this machine: FP32 vs AMP, as a table, JSON and a PNG chart."""
import argparse
import collections
import contextlib
import copy
import dataclasses
import datetime
import difflib
import enum
import errno
import faulthandler
import fcntl
import getpass
import importlib
import io
import json
import math
import os
import pathlib
import queue
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import typing

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

try:  # the GPU crop kernel (crop_to_batch); without Triton the roi_align path does that work
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

# Imported as a module by scripts/bench_amp.py, tests/test_train_amp.py and
# smoke_tests/test_train_amp.py, always the same way: the folder holding this file (the
# repository root; /usr/local/bin in the image) first on sys.path, then `import train_amp`.
# The names they use (keep them, or change those files with them): bench_amp.py sets up with
# writable_home/build_parser/fill_defaults/check_model_name, times with benchmark and train
# (a Ranks and a StopRequest), and its loader alone with ImageFolderData/collate_bytes,
# sizing pools and workers with cpu_cores (as bench_input.py does);
# bench_input.py also times the --decode device stages (decode_jpegs, random_crop_boxes,
# batch_generator, crop_to_batch, FUSED_CROP) and the workers' transforms (image_transforms,
# open_image, JPEG_DRAFT), and writes digits_split out as JPEGs; the tests
# call main in-process, spy on build_model/train_step/load_checkpoint, step with make_optimizer,
# compare random_crop_boxes/decode_on_device/crop_resize with torchvision's CPU transforms and
# crop_to_batch's kernel with its roi_align path (use_fused_crop, PAD_GROUP_ELEMS), the
# workers' share of the decoding with the device's (CollateBytes, BadImages), one loader pass
# for the job (Trainer, its sampler and train_set), CUDA graphs (wrap_model, build_model) and
# the workers' transforms with torchvision's (image_transforms, draft_jpeg, JPEG_DRAFT).
__all__ = [
    "BadImages", "CollateBytes", "ImageFolderData", "Ranks", "StopRequest", "Trainer",
    "UsageError", "batch_generator", "benchmark",
    "build_model", "build_parser", "check_model_name", "collate_bytes", "cpu_cores", "crop_resize",
    "crop_to_batch", "decode_jpegs", "decode_on_device", "device_name", "digits_split",
    "draft_jpeg", "fill_defaults", "image_transforms",
    "load_checkpoint", "main", "make_optimizer", "normalise", "open_image", "random_crop_boxes",
    "train",
    "train_step", "wrap_model", "writable_home",
]

PROG = "train_amp.py"
CKPT_FORMAT = "train_amp/1"
# Checkpoint fields that must match on --resume: changing any of them changes what the saved
# weights, optimizer moments or data order mean, so continuing would silently train a different job.
# --epochs/--steps may change (to train longer); the LR schedule then stretches from there on.
RESUME_KEYS = ("model", "data", "num_classes", "image_size", "batch_size", "world_size",
               "amp", "seed", "lr")
GiB = 2 ** 30
MiB = 2 ** 20
# Exit statuses besides 0 (done, or stopped by SIGTERM after saving) and 1 (a bug: traceback).
EXIT_USAGE, EXIT_DIVERGED, EXIT_SAVE_FAILED, EXIT_LAUNCH = 2, 3, 4, 5
# Stopped by SIGUSR1, a scheduler's "time is nearly up", after saving: sysexits' EX_TEMPFAIL
# ("try again later"), which slurm/*.sbatch turn into a requeue.
EXIT_REQUEUE = 75
# The start-up write test's file (.PID added; removed again).
PROBE_NAME = ".train_amp-write-test"

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
else fp16; on a CPU bf16 where it computes it (AVX512-BF16 or AMX), else FP32: emulated bf16
is about 10x slower (--amp bf16 still forces it, with a warning). SIGTERM (docker stop, a scheduler's preemption)
saves a checkpoint at the end of the current step and exits 0; --resume continues there.

checkpoints: a run never replaces another run's CHECKPOINT_DIR/last.pt by surprise: if one is
there, add --resume to continue it, give another --checkpoint-dir for a new run (also for one
continued with --resume PATH), or add --overwrite to replace it (at this run's first save).
--auto-resume continues last.pt when it is there and starts fresh when not: the one command
line for a job a scheduler restarts (slurm/*.sbatch and k8s/*.yaml use it).
A save goes to last.HOST.PID.tmp, is fsynced, then renamed over last.pt, so a kill or a full
disk leaves the previous last.pt intact; a temp file left by a kill -9 is removed at the next
start. A run locks its CHECKPOINT_DIR (.train_amp.lock, flock): a second run into the same
folder is refused at start, naming the first one's PID and host.
The directory is created and write-tested before any training. A checkpoint is never written
from non-finite weights.

exit status: 0 done (or stopped by SIGTERM/Ctrl-C after saving); 75 stopped by SIGUSR1 after
saving (a scheduler's warning before its time limit: requeue the job); 2 a problem in the command
line, the data or the checkpoint directory, with a one-line fix (also an unreadable image:
--skip-bad-images skips those and counts them in each epoch's summary); 3 training diverged
(the loss stayed NaN/inf; last.pt keeps the last good state); 4 a checkpoint could not be
written (e.g. disk full; the previous last.pt is kept); 5 a scheduler started several tasks
but they could not form one job (no master address, or no rendezvous within --dist-timeout):
never N separate copies of the run.

launchers: torchrun (its variables win, also torchrun inside srun); srun with one task per
process (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, also beside the RANK/LOCAL_RANK that pyxis
adds without WORLD_SIZE; master = first host of SLURM_JOB_NODELIST, port MASTER_PORT or
10000 + SLURM_JOB_ID % 20000); Kubeflow PyTorchJob pods started without
torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT: one process per pod); Kubeflow Trainer
TrainJob nodes started without torchrun (PET_NNODES/PET_NODE_RANK/PET_MASTER_*, only with
PET_NPROC_PER_NODE=1); else one process. RANK or WORLD_SIZE set alone is refused (exit 5).
The first line says which one was detected."""


class UsageError(Exception):
    """A problem the user can fix by changing the command line: one line, exit status 2."""


class BadImageError(UsageError):
    """An image file that cannot be read or decoded. Raised on the rank that read it, which
    may not be rank 0, so every rank prints it (start-up usage errors print on rank 0 only)."""
    any_rank = True


class LaunchError(Exception):
    """Several scheduler tasks that cannot form one process group: exit 5, on every rank
    (the one that fails may not be rank 0). Never train N separate copies of the job."""


class Stopped(Exception):
    """SIGTERM/SIGINT/SIGUSR1 arrived; raised at a step boundary after the checkpoint is
    written."""


class Diverged(Exception):
    """The loss stayed non-finite (or the weights did): exit 3, last.pt left as it was."""


class SaveFailed(Exception):
    """A checkpoint could not be written (disk full, I/O error): exit 4, old last.pt kept."""


# ----------------------------------------------------------------------------------------
# command line

def int_at_least(low):
    """An argparse type: an integer >= low."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


positive_int, non_negative_int = int_at_least(1), int_at_least(0)


def finite_float(low, strict, example):
    """An argparse type: a finite float >= low (> low when strict). float() alone accepts
    'nan' and 'inf', and an --lr nan run trains on and saves NaN weights with exit 0."""
    bound = f"{'>' if strict else '>='} {low:g}"

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number, e.g. {example}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}"
                                             f" (e.g. {example})")
        return value

    parse.__name__ = "number"  # argparse names the type in some messages
    return parse


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
    g.add_argument("--num-workers", type=non_negative_int, default=None,
                   help="DataLoader worker processes (default: 0 for in-memory data; CPUs per"
                        " process - 1 when they decode JPEGs; min(8, CPUs per process) when they"
                        " only read files for --decode device)")
    g.add_argument("--decode", choices=("auto", "workers", "device"), default="auto",
                   help="ImageFolder/tar JPEGs: decode and augment in the DataLoader workers"
                        " (PIL), or only read files there and decode + augment on the training"
                        " device (nvJPEG, one crop-and-resize per batch, overlapped with"
                        " training). auto: device on a GPU with fewer than"
                        f" {CORES_FOR_WORKER_DECODE} CPU cores per GPU when all files are"
                        " JPEGs, else workers; the first line says which (default: auto)")
    g.add_argument("--decode-cpu-share", type=finite_float(0, False, "--decode-cpu-share 0.3"),
                   default=DECODE_CPU_SHARE, metavar="FRACTION",
                   help="--decode device: the share of each batch the DataLoader workers decode"
                        " on the CPU while the GPU decodes the rest (nvJPEG sets the pace"
                        " beside a busy GPU; the workers otherwise only read files), e.g. 0.3"
                        " with --num-workers 12 on 16 cores; 0: the GPU decodes all (default:"
                        f" {DECODE_CPU_SHARE:g})")
    g.add_argument("--skip-bad-images", action="store_true",
                   help="ImageFolder: skip files that cannot be read or decoded (each named once"
                        " in a warning; the count is in every epoch's summary line) instead of"
                        " stopping at the first one with its name (default: stop)")

    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=positive_int, default=1, help="epochs (default: 1)")
    g.add_argument("--steps", type=positive_int, default=None,
                   help="stop after this many optimizer steps in total (overrides --epochs);"
                        " with --benchmark: measured steps (default 30)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="images per step per process (default: 256; 64 for digits)")
    g.add_argument("--lr", type=finite_float(0, True, "--lr 0.1"), default=None,
                   help="peak learning rate of SGD with momentum (default: 0.1 x global batch"
                        " / 256); linear warm-up then cosine decay, per step")
    g.add_argument("--weight-decay", type=finite_float(0, False, "--weight-decay 5e-5"),
                   default=5e-5, help="(default: 5e-5)")
    g.add_argument("--warmup-steps", type=non_negative_int, default=None,
                   help="LR warm-up steps (default: 5%% of the steps); with --benchmark: untimed"
                        " steps before measuring (default: 10, 20 with --compile)")
    g.add_argument("--grad-clip", type=finite_float(0, False, "--grad-clip 1.0"), default=1.0,
                   help="clip the global gradient norm to this (after unscaling); 0 = off"
                        " (default: 1.0)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    g.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels, cudnn.benchmark off (slower; for debugging)")

    g = p.add_argument_group("precision and speed")
    g.add_argument("--amp", choices=("auto", "fp16", "bf16", "off"), default="auto",
                   help="autocast dtype. auto: bf16 on GPUs that have it, else fp16 (with"
                        " GradScaler); on CPU bf16 where the CPU computes it (AVX512-BF16 or"
                        " AMX), else FP32 (emulated bf16 is ~10x slower). off: FP32"
                        " (default: auto)")
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
    g.add_argument("--cuda-graphs", nargs="?", const="on", default="off", choices=("on", "off"),
                   help="replay the compiled model's forward and backward as CUDA graphs"
                        " (torch.compile's reduce-overhead: two launches a step instead of"
                        " ~900 kernels); needs --compile, one GPU, one process. Helps models"
                        " whose steps are too short to hide the launches; off by default: on an"
                        " H200 ResNet-50 from synthetic data gained 1%%, and --decode device"
                        " lost 11%% (the model then leaves no gaps for the decoder's kernels)"
                        " (default: off; bare flag = on)")
    g.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="(default: auto = cuda if available)")
    g.add_argument("--dist-timeout", type=positive_int, default=1800, metavar="SECONDS",
                   help="several processes: how long to wait for the others (forming the job,"
                        " and in each collective) before failing with exit 5 (default: 1800)")

    g = p.add_argument_group("checkpoints and logging")
    g.add_argument("--checkpoint-dir", default="checkpoints",
                   help="where last.pt is written at each epoch end, every --save-every steps"
                        " and on SIGTERM (default: ./checkpoints; '' = never). If it already"
                        " holds a last.pt, the run stops unless --resume or --overwrite is given")
    g.add_argument("--overwrite", action="store_true",
                   help="start a new run (or continue --resume PATH) even though"
                        " CHECKPOINT_DIR/last.pt exists: it is replaced at this run's first"
                        " save (without this flag the run refuses to start, so an earlier run"
                        " is never lost by accident)")
    g.add_argument("--save-every", type=non_negative_int, default=0,
                   help="also save every N steps (default: 0 = epoch ends and SIGTERM only)")
    g.add_argument("--save-every-minutes", type=finite_float(0, False, "--save-every-minutes 10"),
                   default=0, metavar="M",
                   help="also save when M minutes passed since the last save: bounds what a"
                        " kill without warning (SIGKILL, a lost node) loses (default: 0 = off)")
    g.add_argument("--resume", nargs="?", const="auto", default=None, metavar="PATH",
                   help="continue from PATH (bare flag: CHECKPOINT_DIR/last.pt); a missing,"
                        " corrupt or mismatched checkpoint is an error, never a fresh start")
    g.add_argument("--auto-resume", action="store_true",
                   help="continue CHECKPOINT_DIR/last.pt when it exists, else start fresh: one"
                        " command line for every restart (Slurm requeue, torchrun"
                        " --max-restarts, Kubernetes). A last.pt of other settings, or"
                        " unreadable, is still an error, never replaced")
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
    g.add_argument("--print-launch", action="store_true",
                   help="print one line: this process's launcher, rank, world size, local rank"
                        " and the GPU it would use (also where no CUDA driver is), then exit"
                        " without forming the job or training (exit 2 if the GPUs cannot go"
                        " round, 5 if the tasks cannot form one job)")
    return p


# ----------------------------------------------------------------------------------------
# process / device set-up

# What the first line of a run calls each launch_env() result.
LAUNCHERS = {
    "torchrun": "torchrun",
    "env": "RANK/WORLD_SIZE/LOCAL_RANK set (enroot's optional PyTorch hook, or by hand)",
    "slurm": "srun, one task per process (SLURM_PROCID/SLURM_NTASKS)",
    "pytorchjob": "Kubeflow PyTorchJob pod without torchrun (RANK/WORLD_SIZE: one process"
                  " per pod)",
    "trainjob": "Kubeflow TrainJob node without torchrun (PET_NODE_RANK/PET_NNODES)",
    "single": "single process (no torchrun, srun or Kubeflow variables)",
}


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """Who this process is in the job, as its launcher told it (see launch_env)."""
    launcher: str = "single"  # torchrun | env | slurm | pytorchjob | trainjob | single
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    master_addr: str | None = None  # None with world > 1: torchrun's env:// rendezvous
    master_port: int | None = None
    problem: str | None = None  # several tasks that cannot form one job: refuse (exit 5)

    def describe(self):
        master = (f", master {self.master_addr}:{self.master_port}" if self.master_addr
                  and self.world > 1 else "")
        return (f"launch: {LAUNCHERS[self.launcher]}: rank {self.rank}, world size"
                f" {self.world}, local rank {self.local_rank} of {self.local_world}{master}")


def _env_int(env, name, default=None, low=0):
    text = (env.get(name) or "").strip()
    if not text:
        if default is None:
            raise LaunchError(f"{name} is not set")
        return default
    try:
        value = int(text)
    except ValueError:
        raise LaunchError(f"{name}={text!r} is not an integer") from None
    if value < low:
        raise LaunchError(f"{name}={value} must be at least {low}")
    return value


def _check_rank(rank, world, names):
    if rank >= world:
        raise LaunchError(f"{names[0]}={rank} is not below {names[1]}={world}")


def expand_nodelist(text):
    """Slurm's compressed host list -> host names, in pure Python like PyTorch Lightning's
    SLURMEnvironment: 'node[01-03,07],gpu-a[1-2]' -> node01 node02 node03 node07 gpu-a1 gpu-a2.
    A range keeps the zero padding of its start; several [..] groups in one name multiply."""
    hosts = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text.strip()):  # commas outside [...]
        names = [""]
        for part in re.split(r"(\[[^\]]*\])", item):
            if not part.startswith("["):
                names = [n + part for n in names]
                continue
            choices = []
            for piece in part[1:-1].split(","):
                lo, dash, hi = piece.strip().partition("-")
                if not lo.isdigit() or (dash and not hi.isdigit()):
                    raise LaunchError(f"cannot read the Slurm host list {text!r}")
                choices += ([str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
                            if dash else [lo])
            names = [n + c for n in names for c in choices]
        hosts += [n.strip() for n in names if n.strip()]
    return hosts


def first_slurm_host(nodelist):
    """The first host of a Slurm node list: `scontrol show hostnames` where Slurm's tools are
    installed (the authority on its syntax), else expand_nodelist."""
    if shutil.which("scontrol"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], text=True,
                                 capture_output=True, timeout=20, check=True).stdout.split()
            if out:
                return out[0]
    hosts = expand_nodelist(nodelist)
    return hosts[0] if hosts else None


def _from_torchrun(env):
    """torchrun (TORCHELASTIC_RUN_ID), or LOCAL_RANK with WORLD_SIZE from anything else, e.g.
    enroot's optional 50-slurm-pytorch.sh hook under pyxis. Also torchrun run by srun: its
    variables win. LOCAL_RANK without WORLD_SIZE is pyxis's own remap: _from_partial_env."""
    if "TORCHELASTIC_RUN_ID" not in env and not ("LOCAL_RANK" in env and "WORLD_SIZE" in env):
        return None
    world = _env_int(env, "WORLD_SIZE", 1, low=1)
    rank = _env_int(env, "RANK", 0)
    _check_rank(rank, world, ("RANK", "WORLD_SIZE"))
    return LaunchEnv("torchrun" if "TORCHELASTIC_RUN_ID" in env else "env", rank, world,
                     _env_int(env, "LOCAL_RANK", 0), _env_int(env, "LOCAL_WORLD_SIZE", 1, low=1))


def _from_slurm(env):
    """srun with one task per process and no torchrun. SLURM_NTASKS=1 is a single process.
    An sbatch script's own shell also has SLURM_PROCID=0 and the job's SLURM_NTASKS: started
    there without srun, it waits for the other tasks and fails (exit 5), never trains alone."""
    if "SLURM_PROCID" not in env or _env_int(env, "SLURM_NTASKS", 1, low=1) <= 1:
        return None
    world, rank = _env_int(env, "SLURM_NTASKS", low=1), _env_int(env, "SLURM_PROCID")
    _check_rank(rank, world, ("SLURM_PROCID", "SLURM_NTASKS"))
    per_node = re.match(r"\d+", env.get("SLURM_STEP_TASKS_PER_NODE")
                        or env.get("SLURM_TASKS_PER_NODE") or "1")
    # Task 0 runs on the first node of the step (srun sets SLURM_STEP_NODELIST), which is the
    # allocation's first node unless srun was given a subset.
    nodelist = next((env[k] for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                      "SLURM_NODELIST") if env.get(k)), None)
    addr = env.get("MASTER_ADDR") or (first_slurm_host(nodelist) if nodelist else None)
    if not addr:
        raise LaunchError("no master address: neither MASTER_ADDR nor SLURM_JOB_NODELIST is"
                          " set, so task 0's host is unknown")
    # A port per job, so two jobs sharing a node do not collide (PyTorch Lightning's
    # SLURMEnvironment also derives it from SLURM_JOB_ID); MASTER_PORT wins.
    job = (env.get("SLURM_JOB_ID") or "").strip()
    port = _env_int(env, "MASTER_PORT", 10000 + int(job) % 20000 if job.isdigit() else 29500)
    return LaunchEnv("slurm", rank, world, _env_int(env, "SLURM_LOCALID", 0),
                     int(per_node.group()) if per_node else 1, addr, port)


def _nproc_hint(env):
    nproc = (env.get("PET_NPROC_PER_NODE") or "1").strip()
    if nproc != "1":
        raise LaunchError(f"PET_NPROC_PER_NODE={nproc} asks for torchrun's processes per node:"
                          " start the job with torchrun (it reads PET_NNODES, PET_NODE_RANK and"
                          " PET_MASTER_* itself), or set numProcPerNode to 1")


def _from_pytorchjob(env):
    """Kubeflow Training Operator v1 PyTorchJob: MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK per pod
    (training-operator pkg/controller.v1/pytorch/envvar.go). Started without torchrun, one
    process per pod: RANK is this process's rank."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world, rank = _env_int(env, "WORLD_SIZE", low=1), _env_int(env, "RANK")
    _check_rank(rank, world, ("RANK", "WORLD_SIZE"))
    if world == 1:
        return LaunchEnv("pytorchjob")
    _nproc_hint(env)
    if not env.get("MASTER_ADDR"):
        raise LaunchError("WORLD_SIZE > 1 but MASTER_ADDR is not set")
    return LaunchEnv("pytorchjob", rank, world, 0, 1, env["MASTER_ADDR"],
                     _env_int(env, "MASTER_PORT", 29500))


def _from_trainjob(env):
    """Kubeflow Trainer v2 TrainJob: PET_NNODES/PET_NPROC_PER_NODE/PET_NODE_RANK/PET_MASTER_*
    (trainer pkg/runtime/framework/plugins/torch/torch.go), meant for torchrun. Started
    directly, with PET_NPROC_PER_NODE=1: one process per node, rank = PET_NODE_RANK."""
    if "PET_NNODES" not in env and "PET_NODE_RANK" not in env:
        return None
    nnodes = _env_int(env, "PET_NNODES", 1, low=1)
    if nnodes == 1:
        return LaunchEnv("trainjob")  # one node, one process: nothing can be duplicated
    _nproc_hint(env)
    rank = _env_int(env, "PET_NODE_RANK", 0)
    _check_rank(rank, nnodes, ("PET_NODE_RANK", "PET_NNODES"))
    addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
    if not addr:
        raise LaunchError("PET_NNODES > 1 but PET_MASTER_ADDR is not set")
    return LaunchEnv("trainjob", rank, nnodes, 0, 1, addr,
                     _env_int(env, "PET_MASTER_PORT", 29500))


def _from_partial_env(env):
    """Last: RANK/WORLD_SIZE/LOCAL_RANK that no launcher above accounted for. pyxis copies
    SLURM_PROCID -> RANK and SLURM_LOCALID -> LOCAL_RANK into every task of an image that sets
    PYTORCH_VERSION, and no WORLD_SIZE (pyxis_slurmstepd.c, pytorch_remap_list): with several
    tasks _from_slurm has taken it, so here it is a Slurm task of one. Anything else that sets
    RANK or WORLD_SIZE alone describes a job it does not give: refuse, never train as rank 0
    of 1 beside the job's other processes."""
    rank, world = ((env.get(k) or "").strip() for k in ("RANK", "WORLD_SIZE"))
    procid = (env.get("SLURM_PROCID") or "").strip()
    if procid and not world and rank in ("", procid):
        return None  # pyxis's remap in a single-task step
    if rank and not world:
        raise LaunchError(f"RANK={rank} is set but WORLD_SIZE is not: for a job of several"
                          " processes start it with torchrun (or set WORLD_SIZE, MASTER_ADDR"
                          " and MASTER_PORT too); for one process unset RANK")
    if world and world != "1" and not rank:
        raise LaunchError(f"WORLD_SIZE={world} is set but RANK is not: for a job of several"
                          " processes start it with torchrun (or set RANK, MASTER_ADDR and"
                          " MASTER_PORT too); for one process unset WORLD_SIZE")
    if "LOCAL_RANK" in env:  # e.g. LOCAL_RANK=1 alone: which GPU, in a job of one
        return LaunchEnv("env", 0, 1, _env_int(env, "LOCAL_RANK", 0),
                         _env_int(env, "LOCAL_WORLD_SIZE", 1, low=1))
    return None


def launch_env(env=None):
    """How this process was started, in this order: torchrun's variables (also torchrun inside
    srun), srun tasks (SLURM_NTASKS > 1 with SLURM_PROCID; also with pyxis's RANK/LOCAL_RANK),
    a Kubeflow PyTorchJob pod, a Kubeflow TrainJob node, an incomplete RANK/WORLD_SIZE
    (refused), else a single process. Never raises: a launcher whose variables
    say "several processes" but that cannot form one job comes back with .problem set."""
    env = os.environ if env is None else env
    for launcher, detect in (("torchrun", _from_torchrun), ("slurm", _from_slurm),
                             ("pytorchjob", _from_pytorchjob), ("trainjob", _from_trainjob),
                             ("env", _from_partial_env)):
        try:
            found = detect(env)
        except LaunchError as e:
            if launcher == "torchrun" and "TORCHELASTIC_RUN_ID" not in env:
                launcher = "env"
            return LaunchEnv(launcher, problem=f"{LAUNCHERS[launcher]}: {e}")
        if found:
            return found
    return LaunchEnv()


class Ranks:
    """This process's place in the job (see launch_env), or alone: rank 0 prints and saves;
    every rank trains. any_true/barrier are the collectives the training loop needs."""

    def __init__(self, env=None):
        self.env = launch_env() if env is None else env
        self.world, self.rank = self.env.world, self.env.rank
        self.local_rank, self.local_world = self.env.local_rank, self.env.local_world
        self.enabled = self.world > 1
        self.ctrl = None  # a gloo group for tiny CPU-side control messages (stop flag)

    @property
    def main(self):
        return self.rank == 0

    def check(self):
        """Refuse before any work when the launcher's tasks cannot form one job."""
        if self.env.problem:
            raise LaunchError(f"{self.env.problem}. Refusing to train: each task would run its"
                              " own copy of the job and overwrite the same checkpoint")

    def init(self, device, timeout_s=1800):
        if not self.enabled:
            return
        backend = "nccl" if device.type == "cuda" else "gloo"
        where = {}
        if self.env.master_addr:  # not torchrun: rendezvous at the address the launcher gave
            host = self.env.master_addr
            host = f"[{host}]" if ":" in host else host  # an IPv6 address
            where = {"init_method": f"tcp://{host}:{self.env.master_port}", "rank": self.rank,
                     "world_size": self.world}
        try:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                                    device_id=device if device.type == "cuda" else None,
                                    **where)
            # The stop flag is agreed on every step; on gloo (CPU) that never waits for the GPU.
            self.ctrl = dist.new_group(backend="gloo") if backend == "nccl" else None
        except (RuntimeError, ValueError, OSError) as e:  # DistError is a RuntimeError
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300].rstrip(".")
            raise LaunchError(
                f"{self.env.describe()}: could not form the {self.world}-process job within"
                f" --dist-timeout {timeout_s} s ({reason}). Refusing to train alone: check that"
                " every task started, that the master address resolves and its port is"
                " reachable from here, and the other tasks' logs (one may have stopped with an"
                " error)") from None

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

    def print_on_main(self, *args, **kwargs):
        """print() on rank 0 only (flushed: the logs of several processes interleave)."""
        if self.main:
            print(*args, **kwargs, flush=True)


def writable_home():
    """Started without the entrypoint (pyxis, Kubernetes `command:`, `docker run --entrypoint
    ''`, Apptainer) as a UID with no passwd entry, the environment has HOME=/ (or none) and no
    user name. Then getpass.getuser() raises KeyError (Inductor names its cache
    /tmp/torchinductor_<user> with it), and Triton (~/.triton), torch hub, matplotlib and pip
    cannot write under HOME. Only in that case: a user name of uid<N> and a private HOME
    under the temp dir (the one folder a read-only root filesystem leaves writable). In the
    image the venv's start-up hook (team_uid_env.py) has done so already; this is for elsewhere."""
    try:
        getpass.getuser()
    except (KeyError, OSError):  # no LOGNAME/USER and no passwd entry for this UID
        os.environ["USER"] = f"uid{os.getuid()}"
    home = os.environ.get("HOME")
    if home and os.path.isdir(home) and os.access(home, os.W_OK):
        return
    fallback = pathlib.Path(tempfile.gettempdir(), f"home-{os.getuid()}")
    with contextlib.suppress(OSError):
        fallback.mkdir(mode=0o700, exist_ok=True)
    try:  # someone else's folder of that name (a shared /tmp) is never used
        ok = fallback.stat().st_uid == os.getuid() and os.access(fallback, os.W_OK)
    except OSError:
        ok = False
    if not ok:
        try:
            fallback = pathlib.Path(tempfile.mkdtemp(prefix=f"home-{os.getuid()}-"))
        except OSError:
            return  # nothing writable at all: leave HOME as it is
    os.environ["HOME"] = str(fallback)


def visible_gpus(env, count=None):
    """The GPUs this process can use, in CUDA's order (cuda:i is the i-th): the entries of
    CUDA_VISIBLE_DEVICES up to the first CUDA would reject (it ignores the rest), else
    0..count-1. Slurm sets the variable per task from gres.conf, so the list is known on a host
    without a GPU driver too; with a driver, `count` (torch.cuda.device_count()) caps it."""
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return [str(i) for i in range(count or 0)]
    ids = []
    for item in text.split(","):
        if not re.fullmatch(r"\d+|(GPU|MIG)-[\w/-]+", item.strip()):
            break
        ids.append(item.strip())
    return ids if count is None else ids[:count]


def node_gpus(env):
    """How many GPUs Slurm gave the step's tasks on this node (SLURM_GPUS_ON_NODE, the same in
    every task however they are bound), or None where nothing says (also 0: GPUs that Slurm does
    not manage): then every process on the node is taken to see the same GPUs."""
    text = (env.get("SLURM_GPUS_ON_NODE") or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def choose_gpu(local_rank, local_world, visible, on_node=None):
    """-> (index into `visible`, None), or (None, why not): which GPU a process uses.
    - One GPU visible: it (Slurm's --gpus-per-task=1 or --gpu-bind=single:1 show each task its
      own; else the node's only one).
    - At least one per process on the node: the local rank's (torchrun; srun showing every task
      all of the node's GPUs).
    - Fewer than the node's processes but more than one: Slurm showed each task its part of
      the node's GPUs, so local rank % N. With --gpus-per-task=N every task's set is its own;
      with --gpu-bind=closest the tasks of a socket share one, and get different GPUs of it
      when they are consecutive local ranks (--distribution=*:block). Where they are not, two
      land on one GPU and NCCL stops at start-up ("Duplicate GPU detected").
    Processes that must share a GPU (fewer on the node than processes) are an error, not a
    silent collision. `on_node`: the GPUs the node has for all its processes when the launcher
    says (node_gpus); else the visible ones."""
    n, on_node = len(visible), len(visible) if on_node is None else on_node
    shown = f"CUDA_VISIBLE_DEVICES={','.join(visible)}" if visible else "no GPU visible"
    if n == 0:
        return None, f"no GPU is visible to local rank {local_rank}"
    if on_node < local_world:
        return None, (f"{local_world} processes on this node but {on_node} GPU(s) for them"
                      f" ({shown}): processes would share a GPU. Start one process per GPU"
                      " (--ntasks-per-node or torchrun's --nproc-per-node = GPUs per node)")
    if n == 1:
        return 0, None
    if n >= local_world:
        if local_rank >= n:
            return None, (f"local rank {local_rank} but {n} GPUs visible ({shown}): start one"
                          " process per GPU, or show each process its own GPU")
        return local_rank, None
    return local_rank % n, None


def pick_device(args, ranks):
    if args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA GPU is visible: run the container with"
                         " --gpus all, or drop --device cuda")
    # srun --gpus-per-task or --gpu-bind (and other schedulers) may show each process only its
    # own GPUs, so the index comes from what this process sees, not from the local rank alone.
    visible = visible_gpus(os.environ, torch.cuda.device_count())
    index, problem = choose_gpu(ranks.local_rank, ranks.local_world, visible,
                                node_gpus(os.environ))
    if problem:
        raise UsageError(problem)
    return torch.device("cuda", index)


def print_launch(args, ranks, env=None):
    """--print-launch: the launch plan in one line, without a process group or a model, so a
    scheduler's binding can be checked (also on nodes without a GPU driver) -> exit status."""
    env = os.environ if env is None else env
    e = ranks.env
    if e.problem:
        print(f"{PROG}: error: {e.problem}", file=sys.stderr, flush=True)
        return EXIT_LAUNCH
    visible = visible_gpus(env, torch.cuda.device_count() if torch.cuda.is_available() else None)
    device, problem = "cpu", None
    if args.device != "cpu" and (visible or args.device == "cuda"):
        index, problem = choose_gpu(e.local_rank, e.local_world, visible, node_gpus(env))
        device = "none" if problem else f"cuda:{index} gpu={visible[index]}"
    master = f" master={e.master_addr}:{e.master_port}" if e.master_addr and e.world > 1 else ""
    print(f"launch plan: launcher={e.launcher} rank={e.rank} world={e.world}"
          f" local_rank={e.local_rank} local_world={e.local_world} device={device}"
          f" CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')}{master}",
          flush=True)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    return 0


# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below AVX512_CORE_BF16: oneDNN then emulates bf16.
EMULATED_BF16_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                      "AVX512_CORE_VNNI")


def cpu_bf16():
    """(native, why): whether this CPU computes bf16 in hardware (x86 AVX512-BF16 or AMX),
    and why, in words for the start line. Elsewhere oneDNN emulates bf16: a resnet18 step
    then takes about 10x as long as in FP32 (13x measured at 64 px; benchmarks/results/
    2026-12-05-cpu-bf16.md). With the hardware, bf16 is the faster choice at real image sizes
    (1.65x FP32 at 224 px on an AVX512-BF16 EPYC)."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "")
    if cap.upper() in EMULATED_BF16_ISAS:
        return False, f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN off the CPU's bf16 instructions"
    # torch's own checks (cpuinfo, what its kernels dispatch on); /proc/cpuinfo where absent.
    checks = {"AMX": "_is_amx_tile_supported", "AVX512-BF16": "_is_avx512_bf16_supported"}
    if all(hasattr(torch.cpu, f) for f in checks.values()):
        have = [name for name, f in checks.items() if getattr(torch.cpu, f)()]
    else:
        flags = set(re.findall(r"\w+", pathlib.Path("/proc/cpuinfo").read_text()
                               if os.path.exists("/proc/cpuinfo") else ""))
        have = [name for name, f in (("AMX", "amx_bf16"), ("AVX512-BF16", "avx512_bf16"))
                if f in flags]
    if have:
        return True, f"this CPU has {have[0]}"
    return False, "this CPU has no AVX512-BF16 or AMX: bf16 would be emulated, about 10x slower"


def resolve_amp(mode, device):
    """The autocast dtype for --amp on this device (None = FP32)."""
    if mode == "off":
        return None
    if device.type == "cpu":
        if mode == "fp16":
            raise UsageError("--amp fp16 needs a CUDA GPU (float16 autocast with GradScaler);"
                             " on CPU use --amp bf16 (or auto), or --amp off")
        return torch.bfloat16 if mode == "bf16" or cpu_bf16()[0] else None
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


def amp_choice(mode, device, dtype):
    """--amp as the start line shows it: the dtype, and for auto on a CPU, why."""
    if mode != "auto":
        return amp_name(dtype)
    return f"{amp_name(dtype)} (auto{': ' + cpu_bf16()[1] if device.type == 'cpu' else ''})"


def check_compiler(device):
    """Fail early with the fix instead of a long Inductor traceback after the first step."""
    supported = getattr(torch._dynamo, "is_dynamo_supported", lambda: True)
    if not supported():
        raise UsageError(f"--compile is not supported on Python {sys.version.split()[0]} with"
                         f" torch {torch.__version__}: drop --compile")
    # On CPU Inductor compiles C++ kernels with $CXX (default g++); on a GPU it writes Triton
    # kernels, and Triton builds its launchers with $CC (default: the first of cc/gcc/clang).
    # Inductor dlopens the kernels it builds from its cache: on a noexec mount (Docker's
    # --tmpfs /tmp is noexec) every compile fails after minutes with a long traceback.
    cache = pathlib.Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or tempfile.gettempdir())
    if on_noexec_mount(cache):
        raise UsageError(f"--compile: Inductor's cache {cache} is on a noexec filesystem, so the"
                         " kernels it builds cannot be loaded: set TORCHINDUCTOR_CACHE_DIR to a"
                         " writable folder that allows exec (docker: --tmpfs /tmp:exec), or"
                         " drop --compile")
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


def on_noexec_mount(path):
    """Whether the filesystem that holds path (or would: its nearest existing parent) is
    mounted noexec."""
    path = pathlib.Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return bool(os.statvfs(path).f_flag & getattr(os, "ST_NOEXEC", 0))
    except OSError:
        return False


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


def use_cuda_graphs(args, device, ranks, compiled):
    """--cuda-graphs on: checked, it needs what it replays. Not with DDP: its bucketed
    all-reduce splits the compiled graph and runs between the pieces, untested here."""
    if args.cuda_graphs != "on":
        return False
    if not (compiled and device.type == "cuda"):
        raise UsageError("--cuda-graphs replays the compiled model on a GPU: it needs --compile"
                         " and a CUDA device; drop --cuda-graphs")
    if ranks.enabled:
        raise UsageError("--cuda-graphs is for one process on one GPU (with DDP's all-reduce it"
                         " is untested): drop --cuda-graphs")
    return True


def wrap_model(net, args, device, ranks):
    """DDP when distributed, then torch.compile when on: (the model to call, compiled?,
    CUDA graphs?)."""
    model = net
    if ranks.enabled:
        model = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None)
    compiled = use_compile(args, device)
    graphs = use_cuda_graphs(args, device, ranks, compiled)
    if compiled:
        # Inductor reads its config when it compiles, at the first call: set it either way so
        # one process (scripts/bench_amp.py) can run tuned and untuned configurations in turn.
        # Coordinate descent re-times each generated kernel's block sizes around the
        # heuristic's pick; on ResNet-50 that speeds up the BatchNorm/ReLU kernels.
        inductor_config().coordinate_descent_tuning = args.compile == "tuned"
        # CUDA graphs (what mode="reduce-overhead" sets): one replay instead of launching
        # ~940 kernels a step from Python.
        inductor_config().triton.cudagraphs = graphs
    return (torch.compile(model) if compiled else model), compiled, graphs


def cuda_graph_skips():
    """How often Inductor compiled a graph without CUDA graphs although asked (say a mutated
    input): it logs why only under TORCH_LOGS=perf_hints and runs on, slower. Process-wide."""
    from torch._dynamo.utils import counters
    return counters["inductor"].get("cudagraph_skips", 0)


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
    """A randomly initialised torchvision classifier (the name is checked by check_args)."""
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

class SampleFormat(enum.Enum):
    """What a data source's DataLoader yields, and so what to_device() still has to do."""
    LOW_RES = "small float images in memory (digits, synthetic): upscaled on the device"
    DECODED = "uint8 images decoded and augmented by the DataLoader workers (ImageFolder)"
    JPEG_BYTES = "undecoded JPEG files (--decode device): decoded and augmented on the device"
    ON_DEVICE = "JPEG_BYTES batches DeviceBatches already decoded, augmented and normalised"


MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
# Normalising 0..255 images is one affine map per channel: x * UINT8_SCALE + UINT8_SHIFT.
UINT8_SHIFT, UINT8_SCALE = -MEAN / STD, 1 / (255 * STD)
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
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # 1797 x 1 x 8 x 8
    y = torch.tensor(digits.target, dtype=torch.int64)
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


# An ImageFolder sample that could not be read or decoded, returned by a DataLoader worker in
# place of (image, label): an exception there would reach the main process as a traceback that
# names neither the file nor the fix. The collate functions list these as (path, reason) and
# to_device() hands them to BadImages, which stops naming the file or (--skip-bad-images)
# counts them.
BadSample = collections.namedtuple("BadSample", "path reason")


def error_text(e):
    """'Type: first line of the message', without the C++ source location torchvision adds."""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {re.sub(r'^.*?[.](?:cpp|h):[0-9]+, ', '', first)[:200]}"


class CheckedImageFolder(torchvision.datasets.ImageFolder):
    """ImageFolder that returns BadSample(path, reason) for a file it cannot load."""

    def __getitem__(self, i):
        try:
            return super().__getitem__(i)
        except Exception as e:  # noqa: BLE001 - whatever PIL or a transform raises, the file is unusable
            return BadSample(self.samples[i][0], error_text(e))


def split_bad(batch):
    """-> (the usable samples, [(path, reason)] of the BadSamples)."""
    good = [b for b in batch if not isinstance(b, BadSample)]
    return good, [(b.path, b.reason) for b in batch if isinstance(b, BadSample)]


def collate_images(batch):
    """((images or None, bad), labels): unreadable samples left out and listed in bad."""
    good, bad = split_bad(batch)
    if not good:
        return (None, bad), torch.zeros(0, dtype=torch.int64)
    x, y = torch.utils.data.default_collate(good)
    return (x, bad), y


class FileBytes(Dataset):
    """An ImageFolder's files, undecoded: for --decode device the workers only read files."""

    def __init__(self, folder):
        self.samples, self.classes = folder.samples, folder.classes

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        try:
            return torchvision.io.read_file(path), label, path
        except Exception as e:  # noqa: BLE001 - an unreadable file, named by the main process
            return BadSample(path, error_text(e))


class JpegBatch(typing.NamedTuple):
    """A --decode device batch from the loader. flat/lengths: the files nvJPEG decodes, one
    flat uint8 tensor; paths: theirs, to name one that fails; unread: [(path, reason)] of files
    that could not be read. pixels/shapes: the images the workers decoded already (CHW uint8,
    one flat tensor, and their heights and widths); they come first in the batch's order."""
    flat: torch.Tensor
    lengths: torch.Tensor
    paths: list
    unread: list
    pixels: torch.Tensor = torch.zeros(0, dtype=torch.uint8)
    shapes: torch.Tensor = torch.zeros(0, 2, dtype=torch.int64)


class CollateBytes:
    """collate_fn of --decode device: (JpegBatch, labels). Runs in the DataLoader workers, and
    there decodes the first cpu_share of each batch's files on the CPU (libjpeg-turbo), so that
    nvJPEG gets fewer: on an H200 its batch of 256 took 15.5 ms alone but 24-45 ms beside the
    training, the pace-setter of the whole pipeline, while the workers only read files. A file
    the CPU cannot decode stays bytes: nvJPEG decodes it or names it."""

    def __init__(self, cpu_share=0.0):
        self.cpu_share = cpu_share

    def __call__(self, batch):
        # One flat tensor (+ lengths or shapes) each: a worker hands the main process one
        # shared-memory block apiece; 256 small tensors would need 256 file descriptors.
        good, bad = split_bad(batch)
        decoded, files, on_cpu = [], [], round(self.cpu_share * len(good))
        for i, sample in enumerate(good):
            img = cpu_decode(sample[0]) if i < on_cpu else None
            (files if img is None else decoded).append((img, sample))
        order = decoded + files
        flat = (torch.cat([s[0] for _, s in files]) if files
                else torch.zeros(0, dtype=torch.uint8))
        pixels = (torch.cat([im.reshape(-1) for im, _ in decoded]) if decoded
                  else torch.zeros(0, dtype=torch.uint8))
        packed = JpegBatch(
            flat, torch.tensor([len(s[0]) for _, s in files], dtype=torch.int64),
            [s[2] for _, s in files], bad, pixels,
            torch.tensor([im.shape[-2:] for im, _ in decoded], dtype=torch.int64).reshape(-1, 2))
        return packed, torch.tensor([s[1] for _, s in order], dtype=torch.int64)


collate_bytes = CollateBytes()  # the GPU decodes every file


def cpu_decode(data):
    """JPEG bytes -> CHW uint8 RGB image on the CPU, or None when it cannot be decoded."""
    from torchvision.io import ImageReadMode, decode_jpeg
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB)
    except RuntimeError:
        return None


class BadImages:
    """What to do with unreadable images: stop naming the first one, or (--skip-bad-images)
    warn once per file and count them; take() hands over the count since the last take()."""

    def __init__(self, args=None):
        self.skip = bool(args and args.skip_bad_images)
        self.device_decode = bool(args and getattr(args, "decode_used", args.decode)
                                  == "device")
        self.count, self.warned = 0, set()

    def report(self, bad):
        if not bad:
            return
        if not self.skip:
            path, reason = bad[0]
            hint = ("; --decode device reads JPEG files only (for other formats use --decode"
                    " workers)" if self.device_decode else "")
            raise BadImageError(f"cannot read image {path} ({reason}): delete or replace it, or"
                                f" add --skip-bad-images to skip unreadable images{hint}")
        self.count += len(bad)
        for path, reason in bad:
            if path not in self.warned:
                self.warned.add(path)
                print(f"{PROG}: warning: skipping unreadable image {path} ({reason})",
                      file=sys.stderr, flush=True)

    def take(self):
        n, self.count = self.count, 0
        return n


# --decode workers: decode a JPEG at 1/2, 1/4 or 1/8 scale where the crop allows (draft_jpeg).
# Off only to measure what it saves (bench_input.py) or to compare with torchvision's pixels.
JPEG_DRAFT = True


def open_image(path):
    """The workers' loader: the file's header read, its pixels not yet decoded, so that the
    transform can decode a JPEG at a reduced scale (draft_jpeg). PIL closes the file once the
    pixels are loaded."""
    from PIL import Image
    return Image.open(path)


def draft_jpeg(img, need):
    """Have PIL decode a not yet loaded JPEG at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling:
    fewer pixels to decode and to resize) where it still has at least `need` (width, height)
    pixels. -> the factor from the original's coordinates to the decoded image's (1.0: full
    scale). What the crop then resizes from has at least as many pixels as it needs, so the
    output differs from a full decode only by the DCT's downscaling filter."""
    if not JPEG_DRAFT or img.format != "JPEG":
        return 1.0
    width = img.size[0]
    drafted = img.draft(None, (max(1, need[0]), max(1, need[1])))
    # (mode, box): box is the whole original image in the decoded image's coordinates.
    return drafted[1][2] / width if drafted else 1.0


class CropFlip:
    """The workers' training transform, on a PIL image not yet decoded: torchvision's
    RandomResizedCrop (RRC_SCALE, RRC_RATIO; the same draws from torch's generator) + a
    horizontal flip half the time + PILToTensor, decoding a JPEG at the smallest scale that
    leaves the crop at least `size` pixels each way. At full scale the pixels are exactly
    torchvision's (crop, then PIL's antialiased bilinear resize)."""

    def __init__(self, size):
        self.size = size

    def __call__(self, img):
        from PIL import Image
        from torchvision.transforms import RandomResizedCrop
        from torchvision.transforms.v2.functional import pil_to_tensor
        top, left, h, w = RandomResizedCrop.get_params(img, RRC_SCALE, RRC_RATIO)
        width, height = img.size
        f = draft_jpeg(img, (math.ceil(width * self.size / w), math.ceil(height * self.size / h)))
        img = img.convert("RGB")
        out = (img.crop((left, top, left + w, top + h)).resize((self.size,) * 2, Image.BILINEAR)
               if f == 1.0 else
               img.resize((self.size,) * 2, Image.BILINEAR,
                          box=(left * f, top * f, (left + w) * f, (top + h) * f)))
        if torch.rand(1) < 0.5:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return pil_to_tensor(out)


class ResizeCentreCrop:
    """The workers' validation transform, on a PIL image not yet decoded: torchvision's
    Resize(size * 8 / 7) (the shorter side) + CenterCrop(size) + PILToTensor, decoding a JPEG
    at the smallest scale that still has the resized image's pixels. At full scale the pixels
    are exactly torchvision's."""

    def __init__(self, size):
        self.size, self.short = size, int(size * 8 / 7)

    def __call__(self, img):
        from PIL import Image
        from torchvision.transforms.v2.functional import center_crop, pil_to_tensor
        width, height = img.size
        # torchvision's Resize(int) output size: the shorter side `short`, the longer rounded down.
        if width <= height:
            size = self.short, int(self.short * height / width)
        else:
            size = int(self.short * width / height), self.short
        f = draft_jpeg(img, size)
        img = img.convert("RGB")
        img = img.resize(size, Image.BILINEAR,
                         box=None if f == 1.0 else (0, 0, width * f, height * f))
        return pil_to_tensor(center_crop(img, [self.size]))


def image_transforms(image_size):
    """The CPU path's (train, val) transforms: RandomResizedCrop + flip, Resize + CenterCrop,
    on images open_image opened (JPEGs decoded at a reduced scale where the crop allows)."""
    return CropFlip(image_size), ResizeCentreCrop(image_size)


JPEG_SUFFIXES = (".jpg", ".jpeg")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class TarShards(Dataset):
    """WebDataset-style tar shards read by random access: each sample is the members that share
    a key (the file name up to its first dot), an image (KEY.jpg/.jpeg/.png...) and its class
    index (KEY.cls, a decimal integer). The shards are indexed once at start (tar headers
    only), then every sample is one pread() of its bytes: the same sampler, shuffling, resume
    and decode paths as an ImageFolder. With decode 'device' a sample is its undecoded bytes
    (like FileBytes), else a PIL image through transform (like CheckedImageFolder)."""

    def __init__(self, shards, transform=None, raw=False):
        self.transform, self.raw, self._fds = transform, raw, {}
        self.shards = [str(s) for s in shards]
        self.samples, labels = [], []
        for si, shard in enumerate(self.shards):
            members = {}
            try:
                with tarfile.open(shard, "r:") as tar:
                    try:
                        for m in tar:
                            if not m.isfile():
                                continue
                            base = m.name.rsplit("/", 1)[-1]
                            key, _, ext = base.partition(".")
                            members.setdefault(m.name[:len(m.name) - len(base)] + key, {})[
                                "." + ext.lower()] = (m.offset_data, m.size)
                    except tarfile.ReadError as e:  # e.g. "unexpected end of data"
                        raise cut_short(shard, tar, error_text(e)) from None
                    if not tar_ends_whole(tar):
                        raise cut_short(shard, tar)
                    for key, parts in members.items():
                        img = next((e for e in IMAGE_SUFFIXES if e in parts), None)
                        if img is None or ".cls" not in parts:
                            continue
                        tar.fileobj.seek(parts[".cls"][0])
                        label = int(tar.fileobj.read(parts[".cls"][1]).decode().strip())
                        self.samples.append((si, *parts[img], f"{shard}:{key}{img}", label))
                        labels.append(label)
            except (OSError, tarfile.TarError, ValueError) as e:
                raise UsageError(f"--data: cannot index tar shard {shard} ({error_text(e)}):"
                                 " each sample needs KEY.jpg (or .png ...) and KEY.cls (its"
                                 " class index)") from None
        if not self.samples:
            raise UsageError(f"--data: no samples in {len(self.shards)} tar shard(s): each"
                             " sample needs KEY.jpg (or .png ...) and KEY.cls (its class index)")
        self.num_classes = max(labels) + 1
        self.classes = [str(i) for i in range(self.num_classes)]
        self.targets = labels

    def __len__(self):
        return len(self.samples)

    def _read(self, shard, offset, size):
        # One descriptor per shard and process (DataLoader workers each open their own);
        # pread has no shared file position, so forked copies never disturb each other.
        key = (os.getpid(), shard)
        if key not in self._fds:
            self._fds[key] = os.open(self.shards[shard], os.O_RDONLY)
        data = os.pread(self._fds[key], size, offset)
        if len(data) != size:
            raise OSError(f"short read: {len(data)} of {size} bytes")
        return data

    def __getitem__(self, i):
        shard, offset, size, name, label = self.samples[i]
        try:
            data = self._read(shard, offset, size)
            if self.raw:
                return torch.frombuffer(bytearray(data), dtype=torch.uint8), label, name
            from PIL import Image
            img = Image.open(io.BytesIO(data))  # decoded by the transform (draft_jpeg)
            return (self.transform(img) if self.transform else img.convert("RGB")), label
        except Exception as e:  # noqa: BLE001 - the sample is unusable, named by the main process
            return BadSample(name, error_text(e))


def tar_ends_whole(tar):
    """Whether an archive read to its end really ends there: tarfile reads a cut archive as a
    shorter one and says nothing (the run would train on fewer images). A whole one has a zero
    block where its members end."""
    end = os.pread(tar.fileobj.fileno(), tarfile.BLOCKSIZE, tar.offset)
    return len(end) == tarfile.BLOCKSIZE and not any(end)


def cut_short(shard, tar, reason=None):
    """The UsageError for a shard that ends early (an interrupted copy or write), naming its
    last whole member: the members read so far whose data lies inside the file."""
    size = os.fstat(tar.fileobj.fileno()).st_size
    whole = [m.name for m in tar.members if m.offset_data + m.size <= size]
    last = f"its last whole member is {whole[-1]}" if whole else "no member is whole"
    return UsageError(f"--data: tar shard {shard} ends early ({size} bytes; {last}"
                      f"{'; ' + reason if reason else ''}): it was cut short (an interrupted"
                      " copy or write?): copy or write it again, or move it out of the data"
                      " directory")


def tar_shards(root):
    """-> (train shards, val shards) when root holds .tar files (directly, where val*.tar are
    the validation shards, or in train/ and val/), else None."""
    root = pathlib.Path(root)
    if sorted(root.glob("*.tar")):
        tars = sorted(root.glob("*.tar"))
        return ([t for t in tars if not t.name.startswith("val")],
                [t for t in tars if t.name.startswith("val")])
    if sorted((root / "train").glob("*.tar")):
        return sorted((root / "train").glob("*.tar")), sorted((root / "val").glob("*.tar"))
    return None


def check_class_folders(folder):
    """An ImageFolder's class subfolders that hold no image make torchvision refuse the whole
    folder ("Found no valid file for the classes ..."): name them and the fix instead. Nothing
    to say when no class has images (the caller's "no images found" says that)."""
    if folder is None or not folder.is_dir():
        return
    classes = sorted(d for d in folder.iterdir() if d.is_dir())  # as torchvision: hidden too
    empty = [d for d in classes if not any(
        f.suffix.lower() in IMAGE_SUFFIXES for f in d.rglob("*") if f.is_file())]
    if empty and len(empty) < len(classes):
        names = ", ".join(str(d) for d in empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise UsageError(f"--data: {len(empty)} class folder(s) hold no images ({names};"
                         f" images end in {', '.join(IMAGE_SUFFIXES[:3])} ...): every"
                         f" subfolder of {folder} is a class, so add their images or move the"
                         " empty folders out of it")


class ImageFolderData:
    """An ImageFolder (class subfolders; train/ and val/ if there) or tar shards, for --decode
    workers (decoded + augmented in the DataLoader workers) or device (workers read bytes)."""

    def __init__(self, root, image_size, decode="workers"):
        root = pathlib.Path(root)
        train_tf, val_tf = image_transforms(image_size)
        shards = tar_shards(root)
        if shards:
            raw = decode == "device"
            self.train = TarShards(shards[0], train_tf, raw)
            self.val = TarShards(shards[1], val_tf, raw) if shards[1] else None
            self.classes = self.train.classes
            if self.val is not None and self.val.num_classes > len(self.classes):
                self.classes = self.val.classes
            self.paths = [s[3] for s in self.train.samples]
            return
        train_dir, val_dir = (root / "train", root / "val") if (root / "train").is_dir() else (
            root, None)
        for folder in (train_dir, val_dir):
            check_class_folders(folder)
        try:
            self.train = CheckedImageFolder(str(train_dir), transform=train_tf, loader=open_image)
            self.val = (CheckedImageFolder(str(val_dir), transform=val_tf, loader=open_image)
                        if val_dir and val_dir.is_dir() else None)
        except (FileNotFoundError, OSError) as e:
            raise UsageError(f"--data {root}: no images found ({e}); an ImageFolder needs"
                             " class subfolders holding .jpg/.png files, or give a directory"
                             " of .tar shards (KEY.jpg + KEY.cls per sample)") from None
        self.classes = self.train.classes
        self.paths = [s[0] for s in self.train.samples]
        if decode == "device":
            self.to_bytes()

    def to_bytes(self):
        """For --decode device: the workers only read the files."""
        if isinstance(self.train, TarShards):
            for ds in (self.train, self.val):
                if ds is not None:
                    ds.raw = True
            return
        self.train = FileBytes(self.train)
        self.val = FileBytes(self.val) if self.val is not None else None


# --decode device: the share of each batch the DataLoader workers decode on the CPU
# (CollateBytes). 0 until measured a win over whole epochs (README: input pipeline).
DECODE_CPU_SHARE = 0.0
# CPU cores per GPU at which --decode auto lets the DataLoader workers decode: below it they
# cannot keep an H200 training ResNet-50 with AMP busy (README, input pipeline: 15 workers
# decoded + augmented 2,473 ImageNet-like JPEGs/s, ~165 per core; the GPU trains 6,648/s).
CORES_FOR_WORKER_DECODE = 40


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
        except OSError:
            continue  # an unreadable file is reported when it is loaded
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


# One stream per device on which only the JPEG decoder's images are allocated (see decode_jpegs).
_DECODE_STREAMS = {}


def decode_jpegs(datas, paths, device):
    """Decode a batch on the device -> (images, indices of the decoded ones, [(path, reason)]).
    One batched call (nvJPEG); only when that fails, one call per file to find the bad ones.
    On a GPU the caller's stream waits for the images, and the decoder is never handed memory
    that the caller's stream still has queued work on (below)."""
    if device.type != "cuda":
        return _decode_jpegs(datas, paths, device)
    # torchvision allocates the images on the current stream but writes them from a stream of
    # its own that is not ordered after the current one (and nvJPEG's hardware engine ignores
    # stream order anyway): pytorch/vision#9606. Decoding with the side stream current, the
    # last batch's images, freed while its crop kernel was still queued there, could be handed
    # to the decoder and overwritten before that kernel read them: silently wrong training
    # images. So the images are allocated on a stream where nothing else ever runs, and
    # recorded on the caller's: the allocator hands their memory out again only once the
    # caller's stream is past every use of it. No host synchronisation.
    caller = torch.cuda.current_stream(device)
    own = _DECODE_STREAMS.get(device)
    if own is None:
        own = _DECODE_STREAMS[device] = torch.cuda.Stream(device)
    with torch.cuda.stream(own):
        imgs, keep, bad = _decode_jpegs(datas, paths, device)
    caller.wait_stream(own)
    for im in imgs:
        im.record_stream(caller)
    return imgs, keep, bad


def _decode_jpegs(datas, paths, device):
    """decode_jpegs with whatever stream is current."""
    from torchvision.io import ImageReadMode, decode_jpeg
    try:
        return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device), range(len(datas)), []
    except RuntimeError:
        pass
    imgs, keep, bad = [], [], []
    for i, (data, path) in enumerate(zip(datas, paths)):
        try:
            imgs.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
            keep.append(i)
        except RuntimeError as e:
            bad.append((path, error_text(e)))
    return imgs, keep, bad


# torchvision's RandomResizedCrop defaults: 8-100% of the area, aspect 3/4-4/3.
RRC_SCALE, RRC_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def random_crop_boxes(sizes, gen, scale=RRC_SCALE, ratio=RRC_RATIO, tries=10):
    """RandomResizedCrop.get_params for a whole batch at once -> (N, 4) float64 boxes
    (x1, y1, x2, y2) in pixels. sizes: (N, 2) heights and widths. The same distribution as
    torchvision's loop: up to `tries` (area, aspect) draws, the first that fits wins, else its
    centre-crop fallback; drawing all tries at once and taking the first fit is equivalent."""
    sizes = torch.as_tensor(sizes, dtype=torch.float64).reshape(-1, 2)
    h, w = sizes[:, :1], sizes[:, 1:]
    n = len(sizes)
    area = h * w * torch.empty(n, tries, dtype=torch.float64).uniform_(*scale, generator=gen)
    aspect = torch.exp(torch.empty(n, tries, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=gen))
    cw, ch = torch.round(torch.sqrt(area * aspect)), torch.round(torch.sqrt(area / aspect))
    fits = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
    first = fits.to(torch.uint8).argmax(1, keepdim=True)
    found = fits.any(1)
    cw, ch = cw.gather(1, first)[:, 0], ch.gather(1, first)[:, 0]
    h, w = h[:, 0], w[:, 0]
    # torchvision's fallback: the whole image, cut to the nearest allowed aspect, centred.
    in_ratio = w / h
    fw = torch.where(in_ratio > ratio[1], torch.round(h * ratio[1]), w)
    fh = torch.where(in_ratio < ratio[0], torch.round(w / ratio[0]), h)
    cw, ch = torch.where(found, cw, fw), torch.where(found, ch, fh)
    u = torch.rand(n, 2, dtype=torch.float64, generator=gen)
    top = torch.where(found, torch.floor(u[:, 0] * (h - ch + 1)), torch.round((h - ch) / 2))
    left = torch.where(found, torch.floor(u[:, 1] * (w - cw + 1)), torch.round((w - cw) / 2))
    return torch.stack([left, top, left + cw, top + ch], 1)


def centre_crop_boxes(sizes):
    """The validation crop: the field of view of Resize(size * 8/7) + CenterCrop(size)."""
    sizes = torch.as_tensor(sizes, dtype=torch.float64).reshape(-1, 2)
    h, w = sizes[:, 0], sizes[:, 1]
    side = torch.round(torch.minimum(h, w) * 7 / 8)
    top, left = torch.floor((h - side) / 2), torch.floor((w - side) / 2)
    return torch.stack([left, top, left + side, top + side], 1)


# Elements of one padded group of images in crop_resize: bounds the memory a batch with a few
# huge photos takes (a 4000x3000 image padded into every slot would need 12 GB for 256).
PAD_GROUP_ELEMS = 3 * 2 ** 26


def crop_resize(imgs, boxes, size, dtype=None):
    """Crop boxes[i] of each CHW uint8 image imgs[i] (any sizes) and resize it to size x size:
    one torchvision.ops.roi_align per group of similar sizes instead of a crop + interpolate
    per image. roi_align with aligned=True samples each output pixel's bin on a grid of
    ceil(bin) x ceil(bin) points and averages them: an area filter when shrinking (the
    antialiasing of resize(antialias=True)), plain bilinear when enlarging. -> (N, 3, size,
    size) of dtype (float16 on a GPU: exact for 0..255, half the traffic; float32 on CPU)."""
    from torchvision.ops import roi_align
    device = imgs[0].device
    dtype = dtype or (torch.float16 if device.type == "cuda" else torch.float32)
    hw = [tuple(im.shape[-2:]) for im in imgs]
    order = sorted(range(len(imgs)), key=lambda i: hw[i][0] * hw[i][1])
    groups, cur, ch, cw = [], [], 0, 0
    for i in order:
        h, w = hw[i]
        nh, nw = max(ch, h + 1), max(cw, w + 1)
        if cur and (len(cur) + 1) * 3 * nh * nw > PAD_GROUP_ELEMS:
            groups.append((cur, ch, cw))
            cur, nh, nw = [], h + 1, w + 1
        cur.append(i)
        ch, cw = nh, nw
    groups.append((cur, ch, cw))
    boxes = torch.as_tensor(boxes, dtype=torch.float32)
    out = torch.empty(len(imgs), 3, size, size, dtype=dtype, device=device)
    for idx, gh, gw in groups:
        # Unused padding stays uninitialised: the samples never reach it. One replicated row and
        # column past each image's edge: a bilinear sample in its last pixel reads one beyond.
        # Per image only a view; the copies are one foreach call and the edges two batched
        # index operations (a Python loop of 3 copies per image cost 20 ms a batch on the host).
        pad = torch.empty(len(idx), 3, gh, gw, dtype=torch.uint8, device=device)
        views = [pad[j, :, :hw[i][0], :hw[i][1]] for j, i in enumerate(idx)]
        srcs = [imgs[i] for i in idx]
        if hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(views, srcs)
        else:
            for v, src in zip(views, srcs):
                v.copy_(src)
        hs = to_dev(torch.tensor([hw[i][0] for i in idx]), device)
        ws = to_dev(torch.tensor([hw[i][1] for i in idx]), device)
        j = torch.arange(len(idx), device=device)
        # column w <- column w - 1 (all rows), then row h <- row h - 1 (all columns)
        pad[j, :, :, ws] = pad[j, :, :, ws - 1]
        pad[j, :, hs, :] = pad[j, :, hs - 1, :]
        rois = torch.cat([torch.arange(len(idx), dtype=torch.float32)[:, None], boxes[idx]], 1)
        res = roi_align(pad.to(dtype), to_dev(rois.to(dtype), device), (size, size),
                        spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        if len(groups) == 1:
            out = res.index_select(0, to_dev(torch.as_tensor(
                sorted(range(len(idx)), key=idx.__getitem__)), device))
        else:
            out[to_dev(torch.as_tensor(idx), device)] = res
    return out


# Threads per program of the fused crop kernel's grid (one program: BLOCK output pixels of one
# image, all three channels).
CROP_BLOCK = 256
# False: crop_to_batch takes the roi_align path on a GPU too (scripts/bench_input.py compares).
FUSED_CROP = True


def use_fused_crop(device):
    """Whether crop_to_batch runs the Triton kernel: on a GPU when Triton is there (the image
    has it: torch.compile needs it), and on CPU only in Triton's interpreter (the tests)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return FUSED_CROP and triton is not None and (device.type == "cuda" or interpreted)


def crop_to_batch(imgs, boxes, flip, size, channels_last):
    """Crop boxes[i] (x1, y1, x2, y2) of each CHW uint8 image imgs[i], resize it to size x size,
    mirror it where flip[i] (None: no flips), normalise -> one float32 (N, 3, size, size) batch
    in the model's memory format. On a GPU all of it is one Triton kernel per batch that reads
    the decoded images once and writes the batch once (the same samples as crop_resize's
    roi_align, in float32); elsewhere crop_resize, a flip by index and normalise."""
    device = imgs[0].device
    if not use_fused_crop(device):
        x = crop_resize(imgs, boxes, size)
        if flip is not None:
            # Flip by index: one select over the batch, not a flip kernel per image.
            x = torch.where(to_dev(flip.view(-1, 1, 1, 1), device), x.flip(-1), x)
        return normalise(x, device, channels_last)
    n = len(imgs)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty((n, 3, size, size), dtype=torch.float32, device=device, memory_format=fmt)
    shift, scale = UINT8_SHIFT.flatten().tolist(), UINT8_SCALE.flatten().tolist()
    # Per image: where it starts in its group's buffer, height, width, flipped? Built whole,
    # not element by element: this runs on the thread that shares the GIL with training.
    meta = torch.zeros(n, 4, dtype=torch.int64)
    meta[:, 1:3] = torch.tensor([im.shape[-2:] for im in imgs], dtype=torch.int64)
    if flip is not None:
        meta[:, 3] = flip.to(torch.int64)
    # The images of a group are concatenated into one buffer (one copy) for the kernel to
    # index; groups bound the memory a batch of huge photos takes, as in crop_resize.
    groups, first, elems, starts = [], 0, 0, []
    for i, numel in enumerate((3 * meta[:, 1] * meta[:, 2]).tolist()):
        if i > first and elems + numel > PAD_GROUP_ELEMS:
            groups.append((first, i))
            first, elems = i, 0
        starts.append(elems)
        elems += numel
    groups.append((first, n))
    meta[:, 0] = torch.tensor(starts, dtype=torch.int64)
    meta = to_dev(meta, device)
    boxes = to_dev(torch.as_tensor(boxes, dtype=torch.float32).contiguous(), device)
    for a, b in groups:
        flat = torch.cat([im.reshape(-1) for im in imgs[a:b]])
        grid = (b - a, triton.cdiv(size * size, CROP_BLOCK))
        _crop_kernel[grid](flat, meta[a:b], boxes[a:b], out[a:b], *out.stride(), *shift, *scale,
                           S=size, BLOCK=CROP_BLOCK)
    return out


def to_dev(t, device):
    """A small CPU tensor to the device without blocking the host: a copy from pageable memory
    first waits for everything queued on the stream; from pinned memory it is just queued."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def batch_generator(seed):
    return torch.Generator().manual_seed(seed)


def decode_on_device(packed, train, image_size, device, bad_images=None, gen=None,
                     channels_last=False):
    """--decode device: JPEG decode on the device (nvJPEG on a GPU, one batched call), then a
    random resized crop + flip (train) or a centre crop (val) of the whole batch at once,
    normalised. -> (float32 images in the model's memory format, indices of the batch's
    samples they are): unreadable files go to bad_images. gen: the torch.Generator of the
    crops."""
    b = JpegBatch(*packed)
    imgs, keep, bad = [], [], []
    if len(b.lengths):
        imgs, keep, bad = decode_jpegs(list(torch.split(b.flat, b.lengths.tolist())), b.paths,
                                       device)
    if len(b.shapes):  # the images the workers decoded come first
        pixels = b.pixels.to(device, non_blocking=True)  # pinned by the loader: queued
        hw = b.shapes.tolist()
        imgs = [p.view(3, h, w) for p, (h, w) in zip(
            torch.split(pixels, [3 * h * w for h, w in hw]), hw)] + list(imgs)
        keep = list(range(len(hw))) + [len(hw) + k for k in keep]
    failed = b.unread + bad
    (BadImages() if bad_images is None else bad_images).report(failed)
    if not imgs:
        raise BadImageError(f"no image of a batch of {len(failed)} could be read (the first:"
                            f" {failed[0][0]}): check the data set")
    sizes = [im.shape[-2:] for im in imgs]
    flip = None
    if train:
        gen = gen or batch_generator(random.getrandbits(62))
        boxes = random_crop_boxes(sizes, gen)
        flip = torch.rand(len(imgs), generator=gen) < 0.5
    else:
        boxes = centre_crop_boxes(sizes)
    return crop_to_batch(imgs, boxes, flip, image_size, channels_last), keep


def normalise(x, device, channels_last):
    """uint8-range images -> (x / 255 - mean) / std as float32, in the model's memory format:
    one fused kernel (addcmul into a tensor that already has the layout)."""
    if device not in _NORM_AFFINE:
        _NORM_AFFINE[device] = (UINT8_SHIFT.to(device), UINT8_SCALE.to(device))
    shift, scale = _NORM_AFFINE[device]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty(x.shape, dtype=torch.float32, device=device, memory_format=fmt)
    return torch.addcmul(shift, x, scale, out=out)


_NORM_AFFINE = {}


if triton is not None:
    @triton.jit
    def _tap(base, off, wt, m):
        return tl.load(base + off, mask=m, other=0).to(tl.float32) * wt

    @triton.jit
    def _edge(pos, size):
        """roi_align's bilinear sample along one axis of `size` pixels: -> (the pixel at or
        before pos, the one after, the weight of the one after); clamped to the edge pixel."""
        pos = tl.maximum(pos, 0.0)
        lo = pos.to(tl.int32)
        last = lo >= size - 1
        lo = tl.where(last, size - 1, lo)
        return lo, tl.where(last, size - 1, lo + 1), tl.where(last, 0.0, pos - lo.to(tl.float32))

    @triton.jit
    def _crop_kernel(src, meta, boxes, out, s_n, s_c, s_y, s_x, shift0, shift1, shift2,
                     scale0, scale1, scale2, S: tl.constexpr, BLOCK: tl.constexpr):
        """crop_to_batch on a GPU. Program (n, k): output pixels k*BLOCK.. of image n. Each
        output pixel averages a ceil(bin) x ceil(bin) grid of bilinear samples of its bin,
        exactly as torchvision's roi_align(aligned=True, sampling_ratio=-1) does (an area
        filter when shrinking, bilinear when enlarging), edges clamped as there."""
        n = tl.program_id(0)
        pix = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = pix < S * S
        oy = pix // S
        ox = pix % S
        start = tl.load(meta + 4 * n)
        h = tl.load(meta + 4 * n + 1).to(tl.int32)
        w = tl.load(meta + 4 * n + 2).to(tl.int32)
        flip = tl.load(meta + 4 * n + 3)
        hf, wf = h.to(tl.float32), w.to(tl.float32)
        x1, y1 = tl.load(boxes + 4 * n), tl.load(boxes + 4 * n + 1)
        x2, y2 = tl.load(boxes + 4 * n + 2), tl.load(boxes + 4 * n + 3)
        sx = tl.where(flip != 0, S - 1 - ox, ox).to(tl.float32)
        sy = oy.to(tl.float32)
        bin_w, bin_h = (x2 - x1) / S, (y2 - y1) / S
        gw = tl.maximum(tl.ceil(bin_w).to(tl.int32), 1)
        gh = tl.maximum(tl.ceil(bin_h).to(tl.int32), 1)
        plane = h.to(tl.int64) * w
        c0 = src + start
        c1 = c0 + plane
        c2 = c1 + plane
        acc0 = tl.zeros([BLOCK], tl.float32)
        acc1 = tl.zeros([BLOCK], tl.float32)
        acc2 = tl.zeros([BLOCK], tl.float32)
        # while, not range(gh): Triton's interpreter (the CPU tests) cannot range over a
        # loaded value.
        iy = 0
        while iy < gh:
            y = y1 - 0.5 + sy * bin_h + (iy + 0.5) * bin_h / gh
            yin = (y >= -1.0) & (y <= hf)
            ya, yb, ly = _edge(y, h)
            ix = 0
            while ix < gw:
                x = x1 - 0.5 + sx * bin_w + (ix + 0.5) * bin_w / gw
                m = valid & yin & (x >= -1.0) & (x <= wf)
                xa, xb, lx = _edge(x, w)
                w00, w01 = (1 - ly) * (1 - lx), (1 - ly) * lx
                w10, w11 = ly * (1 - lx), ly * lx
                p00, p01, p10, p11 = ya * w + xa, ya * w + xb, yb * w + xa, yb * w + xb
                acc0 += (_tap(c0, p00, w00, m) + _tap(c0, p01, w01, m)
                         + _tap(c0, p10, w10, m) + _tap(c0, p11, w11, m))
                acc1 += (_tap(c1, p00, w00, m) + _tap(c1, p01, w01, m)
                         + _tap(c1, p10, w10, m) + _tap(c1, p11, w11, m))
                acc2 += (_tap(c2, p00, w00, m) + _tap(c2, p01, w01, m)
                         + _tap(c2, p10, w10, m) + _tap(c2, p11, w11, m))
                ix += 1
            iy += 1
        count = (gh * gw).to(tl.float32)
        dst = out + n * s_n + oy * s_y + ox * s_x
        tl.store(dst, acc0 / count * scale0 + shift0, mask=valid)
        tl.store(dst + s_c, acc1 / count * scale1 + shift1, mask=valid)
        tl.store(dst + 2 * s_c, acc2 / count * scale2 + shift2, mask=valid)
# Batches decoded ahead of training on the GPU: enough to ride out one slow batch and the
# start of the next epoch's loader iteration (each is 154 MB at 256 x 224 px).
PREFETCH_BATCHES = 4


class PendingBadImages(list):
    """Unreadable files of a batch decoded ahead, reported when the batch is trained on (to the
    epoch it belongs to, not the one running when it was decoded)."""

    def report(self, bad):
        self.extend(bad)


class PlanBatches:
    """Batch sampler over every pass of a job: the batches of its (epoch, first batch) passes
    one after the other, as the trainer's loader gives each epoch (the sampler's order for that
    epoch, from batch `first`, whole batches only), so that one DataLoader iteration spans the
    job and its workers read on across epoch ends. A new iteration per epoch restarted them:
    the next epoch's first batches came late (about 0.1-0.2 s an epoch on an H200, 0.4 s when
    the workers also decode). Each pass draws its order from a copy of the sampler: the trainer
    sets the epoch on its own one, maybe while this runs ahead. lengths: batches per pass."""

    def __init__(self, sampler, batch_size, plan):
        self.sampler, self.batch_size, self.plan = sampler, batch_size, list(plan)
        self.lengths = [(self.sampler.num_samples - first * batch_size) // batch_size
                        for _, first in self.plan]

    def __iter__(self):
        for (epoch, first), n in zip(self.plan, self.lengths):
            sampler = copy.copy(self.sampler)
            sampler.set_epoch(epoch)
            sampler.start = first * self.batch_size
            order = list(sampler)
            for b in range(n):
                yield order[b * self.batch_size:(b + 1) * self.batch_size]

    def __len__(self):
        return sum(self.lengths)


class DeviceBatches:
    """--decode device batches, decoded, augmented and normalised on the GPU by one thread of
    their own up to PREFETCH_BATCHES ahead, on a side CUDA stream: decode and crop overlap the
    model and the training loop never waits for them on the host. The thread iterates the
    loader once; plan: the passes it makes of it, in order, as (epoch, first batch, batches);
    it goes from one pass straight on to the next, so an epoch starts with its first batches
    ready (PlanBatches makes such a loader for the whole job). The crops of batch k of epoch e
    come from a generator seeded with (seed, e, k): the same whatever the prefetch depth, and a
    resumed epoch draws what the uninterrupted one drew. Iterating the object itself makes its
    (single) pass."""

    def __init__(self, loader, image_size, device, channels_last, train, bad_images,
                 plan=None, seed=0):
        self.loader, self.image_size, self.device = loader, image_size, device
        self.channels_last, self.train, self.bad_images = channels_last, train, bad_images
        self.plan, self.seed = list(plan or [(0, 0, len(loader))]), seed
        self.queue, self.stopping, self.worker, self.inline = None, threading.Event(), None, None

    def prepare(self, epoch, k, x, y):
        gen = (batch_generator((self.seed * 1000 + epoch) * 1_000_003 + k) if self.train
               else None)
        bad = PendingBadImages()
        x, keep = decode_on_device(x, self.train, self.image_size, self.device, bad, gen,
                                   self.channels_last)
        y = y[list(keep)] if len(keep) != len(y) else y
        return x, y.to(self.device, non_blocking=True), bad

    def passes(self):
        """(epoch, batch or None at the end of its pass) for every pass of the plan."""
        batches = iter(self.loader)
        for epoch, first, n in self.plan:
            for k, (x, y) in zip(range(first, first + n), batches):
                yield epoch, self.prepare(epoch, k, x, y)
            yield epoch, None

    def __iter__(self):
        return self.epoch(self.plan[0][0])

    def epoch(self, epoch):
        """The batches (images, labels) of the plan's next pass, which must be this epoch's."""
        if self.device.type != "cuda":
            self.inline = self.inline or self.passes()  # no thread: prepared when asked for
            items = self.inline
        else:
            if self.worker is None:
                self._start()
            items = iter(self._take, ())
        for pass_epoch, batch in items:
            if pass_epoch != epoch:
                raise RuntimeError(f"DeviceBatches: epoch {epoch} asked, {pass_epoch} prepared")
            if batch is None:
                if self.inline is not None and pass_epoch == self.plan[-1][0]:
                    # The plan is done: end the generator now, which drops the loader's
                    # iterator and so shuts its workers down here and now. Left in its cycle
                    # (the generator holds self, self holds it), the iterator lived on, workers
                    # and all, until the garbage collector ran its __del__ - once inside a
                    # worker that a later DataLoader had forked, which broke that loader's
                    # pipes: its next batch never came (EOFError) and the run died (seen in CI
                    # on CPU, in validation, after two epochs).
                    self.close()
                return
            x, y, bad = batch
            self.bad_images.report(bad)
            yield x, y

    def _take(self):
        item = self.queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        pass_epoch, batch, ready = item
        if batch is not None:
            main = torch.cuda.current_stream(self.device)
            main.wait_event(ready)  # the GPU waits, not the host
            # Allocated on the side stream, used on the main one: not reusable before that.
            batch[0].record_stream(main)
            batch[1].record_stream(main)
        return pass_epoch, batch

    def _start(self):
        # A thread of its own: nvJPEG holds the calling thread until its batch is decoded (and
        # behind the queued training work), which on the training thread left the GPU idle
        # for that time each step (3,474 images/s vs 6,648 synthetic on an H200). The thread
        # drops the GIL inside decode and the copies; its kernels go on a high-priority side
        # stream so they slot in between the model's.
        self.queue = queue.Queue(maxsize=PREFETCH_BATCHES)

        def produce():
            # Everything inside the try: a thread that died before its first put (a failed
            # set_device or stream) left the training thread waiting on the queue for ever.
            try:
                torch.cuda.set_device(self.device)
                side = torch.cuda.Stream(self.device, priority=-1)
                with torch.cuda.stream(side):
                    for item in self.passes():
                        ready = torch.cuda.Event()
                        ready.record(side)
                        if not self._put((*item, ready)):
                            return
            except BaseException as e:  # noqa: BLE001 - re-raised on the training thread
                self._put(e)

        self.worker = threading.Thread(target=produce, name="device-batches", daemon=True)
        self.worker.start()

    def _put(self, item):
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def close(self):
        """Stop the thread (it may be preparing batches nobody will train on), or end the
        inline generator of a job stopped part-way (above: why not leave it to the collector)."""
        if self.inline is not None:
            self.inline.close()
            self.inline = None
        self.stopping.set()
        while self.worker is not None and self.worker.is_alive():
            try:
                self.queue.get(timeout=0.1)
            except queue.Empty:
                pass


def load_data(args, device=None, ranks=None):
    """-> (train_set, val_set or None, num_classes, the SampleFormat its loader yields)."""
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
    folder = ImageFolderData(args.data, args.image_size, "workers")
    args.decode_used, why = pick_decode(args, device, folder.paths,
                                        ranks.local_world if ranks else 1)
    if ranks is None or ranks.main:
        if args.decode == "auto":
            print(f"--decode auto: {args.decode_used} ({why})", flush=True)
        note = large_jpeg_note(folder.paths, args.image_size)
        if note:
            print(note, flush=True)
    if args.decode_used == "device":
        folder.to_bytes()
    return (folder.train, folder.val, len(folder.classes),
            SampleFormat.JPEG_BYTES if args.decode_used == "device" else SampleFormat.DECODED)


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
              bad_images=None):
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
                                   channels_last=channels_last)
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


# ----------------------------------------------------------------------------------------
# one training step: autocast forward, then the GradScaler sequence

def autocast(device_type, amp_dtype):
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=amp_dtype)


def train_step(model, x, y, optimizer, scaler, amp_dtype, grad_clip, device_type, graphs=False):
    """autocast forward; then scale -> backward -> unscale_ -> clip_grad_norm_ -> step -> update.
    With bf16 or FP32 the scaler is disabled and those calls are pass-throughs. graphs: the
    model replays CUDA graphs, whose outputs (the logits, the gradients) the next step's replay
    overwrites: only what this step computed from them is kept (loss, argmax, the update)."""
    if graphs:
        torch.compiler.cudagraph_mark_step_begin()
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


def peak_mem_gib(device, graphs=False):
    """Peak GPU memory since the last reset. With CUDA graphs the activations live in the
    graphs' private pool, which the allocated figure leaves out once recorded (ResNet-50: 0.65
    GiB instead of 10.5): then the reserved figure, which holds the pool."""
    if device.type != "cuda":
        return None
    return (torch.cuda.max_memory_reserved(device) if graphs
            else torch.cuda.max_memory_allocated(device)) / GiB


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


def temp_path(path):
    """Where this process writes a checkpoint before the rename: CHECKPOINT_DIR/last.HOST.PID.tmp,
    its own even where two runs share the folder unlocked (a file system without flock)."""
    path = pathlib.Path(path)
    return path.with_name(f"{path.stem}.{socket.gethostname()}.{os.getpid()}.tmp")


# The checkpoint folder's lock file, and the locks this process holds (until it exits: the
# kernel drops a flock with its last descriptor, also after a kill -9).
LOCK_NAME = ".train_amp.lock"
_held_locks = []


def lock_checkpoint_dir(folder):
    """Take CHECKPOINT_DIR's lock for this process, or raise UsageError naming the run that
    holds it: two runs saving into one folder would overwrite each other's last.pt. -> whether
    the folder is locked (False: its file system has no flock, e.g. Lustre without -o flock)."""
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "PID unknown"
        os.close(fd)
        raise UsageError(f"--checkpoint-dir {folder} is in use by another train_amp run"
                         f" ({holder}): wait for it to end or stop it, or give this run"
                         " another --checkpoint-dir") from None
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        return False
    os.ftruncate(fd, 0)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    os.pwrite(fd, f"PID {os.getpid()} on host {socket.gethostname()}, started {started}\n"
              .encode(), 0)
    _held_locks.append(fd)
    return True


def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tensor_bytes(obj):
    """Bytes of all tensors in a nested dict/list: about the size of the checkpoint file."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def save_checkpoint(path, state):
    """Write last.tmp, fsync it, rename it over last.pt: a kill or a full disk mid-write leaves
    the old last.pt intact. A failed write removes last.tmp (a full disk would otherwise stay
    full) and raises SaveFailed naming the directory and its free space."""
    path = pathlib.Path(path)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, tmp)
        # Some file systems (NFS, overlays) report a full disk only when the data is flushed:
        # fsync here, or the rename could put a short file in place of a good one.
        fsync(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports ENOSPC as a RuntimeError
        while e.__context__ is not None:  # the first failure says most ("file write failed")
            e = e.__context__
        reason, code = error_text(e), getattr(e, "errno", None)
    else:
        with contextlib.suppress(OSError):  # the rename durable too; not every FS can fsync a dir
            fsync(path.parent)
        return
    # Out of the except block: the exception's traceback kept torch.save's writer, and so
    # last.tmp, open; only now does removing it give the space back.
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)
    raise SaveFailed(save_failure(path, tensor_bytes(state), reason, code))


def save_failure(path, need, reason, code=None):
    """The words for a failed save, by its cause: no space (ENOSPC, a quota, or less free than
    a checkpoint needs), or anything else (a missing file or folder, permissions, I/O)."""
    folder = path.parent
    try:
        du = shutil.disk_usage(folder)
        space, full = f"{folder} has {du.free / MiB:.0f} MiB free of {du.total / MiB:.0f}", (
            du.free < need)
    except OSError:
        space, full = f"the free space in {folder} is unknown", False
    held = checkpoint_summary(path)
    partial = f"The partial {temp_path(path).name} was removed and"
    if full or code in (errno.ENOSPC, errno.EDQUOT):
        kept = (f"{path} still holds {held}: --resume continues from it once there is room"
                if held else f"there is no earlier {path.name}")
        return (f"could not write a checkpoint to {folder}{': the disk is full' if full else ''}"
                f" ({reason}). {space} MiB, and a checkpoint needs about {need / MiB:.0f} MiB"
                f" beside the previous one until it replaces it. {partial} {kept}. Free space"
                " there, or give another --checkpoint-dir")
    kept = f"{path} still holds {held}" if held else f"there is no earlier {path.name}"
    return (f"could not write a checkpoint to {folder} ({reason}). {partial} {kept}. Check"
            f" that {folder} stays writable and that nothing else (another program, a clean-up"
            " job) removes or replaces files in it")


def checkpoint_summary(path):
    """'global step N (...)' for a readable checkpoint file, else None (missing or corrupt).
    mmap: only the small pickled part is read, however large the weights."""
    try:
        c = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        step, epoch, gs = c["step_in_epoch"], c["epoch"], c["global_step"]
    except Exception:  # noqa: BLE001 - unreadable for whatever reason: say nothing about it
        return None
    return (f"global step {gs}, epoch {epoch + 1} step {step}" if step else
            f"global step {gs}, end of epoch {epoch}")


def check_checkpoint_dir(args, ranks):
    """Before any work: lock the directory against a second run, refuse to replace another
    run's last.pt by surprise, prove that the directory can be written (not only after the
    whole training), and remove the partial checkpoints that killed saves left (they can hold
    gigabytes). Rank 0 only: it is the only writer."""
    if not args.checkpoint_dir or args.benchmark or args.compare or not ranks.main:
        return  # --benchmark and --compare write no checkpoints
    folder = pathlib.Path(args.checkpoint_dir)
    last = folder / "last.pt"
    probe = folder / f"{PROBE_NAME}.{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # First the lock: a running run's last.pt and temp files are not this run's business.
        locked = lock_checkpoint_dir(folder)
        probe.write_bytes(b"train_amp.py write test\n")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"--checkpoint-dir {folder} cannot be written ({error_text(e)}): give"
                         " a directory this user can write (e.g. under /workspace), fix its"
                         " permissions, or --checkpoint-dir '' to save nothing") from None
    if last.exists() and not (args.overwrite or args.auto_resume
                              or continues(args.resume, last)):
        held = checkpoint_summary(last) or "unreadable: not a train_amp checkpoint?"
        if args.resume:  # continuing another checkpoint would save over this one
            raise UsageError(f"{last} already holds a run ({held}) and --resume {args.resume}"
                             " would replace it: give another --checkpoint-dir for the continued"
                             " run, or add --overwrite to replace it")
        raise UsageError(f"{last} already holds a run ({held}): add --resume to continue it,"
                         " give another --checkpoint-dir for a new run, or add --overwrite to"
                         " replace it")
    if not locked:
        ranks.print_on_main(f"{PROG}: warning: {folder}'s file system cannot lock files"
                            " (flock), so another run saving into it would not be noticed;"
                            " partial checkpoints left there are not removed", file=sys.stderr)
        return
    # Locked: every temp file in the folder is a partial checkpoint of a run that was killed.
    for stale in sorted({*folder.glob(f"{last.stem}.*.tmp"), folder / f"{last.stem}.tmp"}):
        with contextlib.suppress(FileNotFoundError):
            size = stale.stat().st_size
            stale.unlink()
            ranks.print_on_main(f"removed {stale} ({size / MiB:.1f} MiB): a partial checkpoint"
                                " left by a save that was interrupted (killed); last.pt was not"
                                " affected")


def continues(resume, last):
    """Whether --resume continues the run in last (CHECKPOINT_DIR/last.pt): a bare --resume,
    or a path to that same file."""
    if resume == "auto":
        return True
    try:
        return bool(resume) and os.path.samefile(resume, last)
    except OSError:  # the --resume file is missing: load_checkpoint says so
        return False


def weights_finite(net):
    """All floating-point parameters and buffers finite? (one host sync)"""
    flags = [t.isfinite().all() for t in net.state_dict().values() if t.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


class LossGuard:
    """Stops a run whose loss stays non-finite. The streak of consecutive non-finite losses is
    counted on the device (a sync per step would stall the GPU) and read only where the loop
    waits for the device anyway: at log points and before every checkpoint."""

    def __init__(self, device, scaler, hint):
        # Without a GradScaler (bf16, FP32) a non-finite loss sends NaN/inf gradients into the
        # weights, which never recover: stop after 3 in a row. With one (fp16) a step whose
        # gradients overflow is skipped and the weights kept, so a few non-finite losses (a
        # batch that overflows fp16) are survivable; each skip halves the scale, and after 16
        # in a row the default 2**16 is down to 1: more than the scaler's routine back-off.
        self.limit = 16 if scaler.is_enabled() else 3
        self.streak = torch.zeros((), dtype=torch.int32, device=device)
        self.worst = torch.zeros_like(self.streak)  # the longest streak since the last check
        self.value = torch.zeros((), device=device)  # the latest non-finite loss
        self.hint = hint

    def update(self, loss):
        bad = ~torch.isfinite(loss)
        self.streak.add_(1).mul_(bad)
        torch.maximum(self.worst, self.streak, out=self.worst)
        self.value = torch.where(bad, loss.float(), self.value)

    def check(self, ranks, global_step, net=None):
        """Raise Diverged (on every rank) if the loss stayed non-finite for self.limit steps,
        or when net is given and its weights are not all finite."""
        worst, streak, value = torch.stack([self.worst.float(), self.streak.float(),
                                            self.value.float()]).tolist()
        weights_bad = net is not None and not weights_finite(net)
        if not ranks.any_true(worst >= self.limit or weights_bad):
            self.worst.copy_(self.streak)
            return
        if worst >= self.limit and streak == worst:
            what = (f"the loss has been {value} since global step {global_step - int(streak) + 1}"
                    f" ({int(streak)} steps in a row, the limit is {self.limit})")
        elif worst >= self.limit:
            what = (f"the loss was non-finite ({value}) for {int(worst)} steps in a row before"
                    f" global step {global_step} (the limit is {self.limit})")
        elif weights_bad:
            what = f"the model's weights are no longer finite at global step {global_step}"
        else:
            what = f"the loss went non-finite on another rank by global step {global_step}"
        raise Diverged(f"training diverged: {what}; {self.hint()}")


def divergence_hint(args, lr, amp_dtype, ckpt_path):
    """The second half of the divergence error: what last.pt holds now, and the fixes."""
    def hint():
        held = checkpoint_summary(ckpt_path) if ckpt_path else None
        kept = (f"{ckpt_path} was not updated: it still holds {held}" if held
                else "no checkpoint was written" if ckpt_path else "nothing is saved"
                " (--checkpoint-dir '')")
        clip = (f"clip gradients harder (--grad-clip {args.grad_clip / 2:g})" if args.grad_clip
                else "turn gradient clipping on (--grad-clip 1.0)")
        amp = (", or use --amp bf16 where the GPU has it (FP32's range: no fp16 overflow)"
               if amp_dtype == torch.float16 else "")
        return (f"{kept}. Fix: lower --lr (now {lr:g}), {clip}{amp}; then start again with"
                " --overwrite or another --checkpoint-dir")
    return hint


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

    def __init__(self, args, ranks, epoch, epochs, total, start):
        mode = args.progress
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode if ranks.main else "none"
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

def job_config(args, num_classes, ranks, amp_dtype):
    return {"model": args.model, "data": args.data, "num_classes": num_classes,
            "image_size": args.image_size, "batch_size": args.batch_size,
            "world_size": ranks.world,
            "amp": amp_name(amp_dtype), "seed": args.seed, "lr": args.lr,
            "epochs": args.epochs, "steps": args.steps}


@torch.no_grad()
def evaluate(net, loader, sample_format, args, device, amp_dtype, channels_last, ranks,
             bad_images):
    """Loss, accuracy and skipped images on this rank's shard; summed over ranks (shards do
    not overlap)."""
    net.eval()
    tot = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, correct, count, skipped
    if sample_format is SampleFormat.JPEG_BYTES:
        loader, sample_format = DeviceBatches(loader, args.image_size, device, channels_last,
                                              False, bad_images), SampleFormat.ON_DEVICE
    for x, y in loader:
        x, y = to_device(x, y, sample_format, args.image_size, device, channels_last,
                         train=False, bad_images=bad_images)
        with autocast(device.type, amp_dtype):
            logits = logits_of(net(x))
        tot[0] += F.cross_entropy(logits.float(), y, reduction="sum")
        tot[1] += (logits.argmax(1) == y).sum()
        tot[2] += len(y)
    tot[3] = bad_images.take()
    net.train()
    if ranks.enabled:
        dist.all_reduce(tot)
    loss_sum, correct, count, skipped = tot.tolist()
    return loss_sum / max(count, 1), 100.0 * correct / max(count, 1), int(skipped)


def empty_epoch_sums():
    return {"loss": 0.0, "correct": 0, "seen": 0, "time": 0.0}


def fold_epoch_sums(sums, run_loss, run_correct, run_seen, seconds, ranks, device, skipped=0):
    """Add this stretch of steps to the epoch's sums, summed over all ranks. The totals live on
    rank 0 only (others restart from zero), so a checkpoint - which rank 0 writes - holds the
    whole epoch so far and the final all-rank sum never counts a stretch twice. skipped: this
    rank's unreadable images in the stretch (--skip-bad-images)."""
    part = torch.stack([run_loss.double(), run_correct.double(),
                        torch.tensor(float(run_seen), dtype=torch.float64, device=device),
                        torch.tensor(float(skipped), dtype=torch.float64, device=device)])
    if ranks.enabled:
        dist.all_reduce(part)
    loss, correct, seen, skipped = part.tolist()
    if not ranks.main:
        return {"loss": 0.0, "correct": 0, "seen": 0, "skipped": 0,
                "time": sums["time"] + seconds}
    return {"loss": sums["loss"] + loss, "correct": sums["correct"] + int(correct),
            "seen": sums["seen"] + int(seen), "skipped": sums.get("skipped", 0) + int(skipped),
            "time": sums["time"] + seconds}


class EpochMeter:
    """This rank's running numbers within one epoch: loss and correct predictions summed on the
    device (read only when folded into the epoch's sums: at a save and at the epoch's end), the
    --log-every window, and the images/s clock, which leaves out the first steps (cudnn
    autotuning, compilation)."""

    def __init__(self, device, first_step, n_steps):
        self.device = device
        self.untimed = min(5, max(0, n_steps - first_step - 1) // 2)
        self.t_measure, self.measured = None, 0
        self.restart()
        self.t_log, self.log_steps = self.t_start, 0
        self.last_loss = None

    def restart(self):
        """Start a new stretch (the one so far was folded into the epoch's sums)."""
        self.loss = torch.zeros((), device=self.device)
        self.correct = torch.zeros((), device=self.device, dtype=torch.int64)
        self.seen, self.t_start = 0, time.perf_counter()

    def before_batch(self, index):
        if index == self.untimed:
            sync(self.device)
            self.t_measure = time.perf_counter()

    def add(self, loss, logits, y):
        self.log_steps += 1
        if self.t_measure is not None:
            self.measured += 1
        self.loss += loss.float() * len(y)
        self.correct += (logits.argmax(1) == y).sum()
        self.seen += len(y)
        self.last_loss = loss

    def take_log_window(self, global_batch):
        """-> (steps, images/s) since the last progress update; starts the next window."""
        now = time.perf_counter()
        steps, ips = self.log_steps, self.log_steps * global_batch / max(now - self.t_log, 1e-9)
        self.t_log, self.log_steps = now, 0
        return steps, ips

    def fold_into(self, sums, ranks, skipped, t_end=None):
        """-> sums plus this stretch (over all ranks); the next stretch starts at zero."""
        seconds = (time.perf_counter() if t_end is None else t_end) - self.t_start
        sums = fold_epoch_sums(sums, self.loss, self.correct, self.seen, seconds, ranks,
                               self.device, skipped)
        self.restart()
        return sums

    def images_per_s(self, global_batch, t_end):
        return (self.measured * global_batch / (t_end - self.t_measure)
                if self.t_measure is not None and self.measured else None)


def open_tensorboard(args, ranks):
    if not (args.tensorboard and ranks.main):
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError("--tensorboard needs the tensorboard package: pip install"
                         " tensorboard, or drop --tensorboard") from None
    return SummaryWriter(args.tensorboard)


class Trainer:
    """One training job. __init__ builds the data, model and optimizer; run() resumes when
    asked (resume), then calls run_epoch per epoch, which saves (save) at the epoch's end, every
    --save-every steps and when a stop is requested. Every rank trains; rank 0 logs and saves."""

    def __init__(self, args, ranks, device, stop, label=None):
        self.args, self.ranks, self.device, self.stop = args, ranks, device, stop
        self.amp_dtype = resolve_amp(args.amp, device)
        configure_backends(args, device)
        set_seed(args.seed)
        self._load_data()
        self._build_model()
        self._make_loaders()
        self._make_optimizer()
        self.config = job_config(args, self.num_classes, ranks, self.amp_dtype)
        self.ckpt_path = (pathlib.Path(args.checkpoint_dir) / "last.pt" if args.checkpoint_dir
                          else None)
        self.saved_at = time.monotonic()  # --save-every-minutes counts from here
        self.guard = LossGuard(device, self.scaler,
                               divergence_hint(args, self.lr, self.amp_dtype, self.ckpt_path))
        self.label = label or f"{args.model} amp={amp_name(self.amp_dtype)}"
        # Where the job stands: the next step to run, and what the steps so far measured.
        self.start_epoch, self.start_step, self.global_step, self.history = 0, 0, 0, []
        self.epoch_sums = empty_epoch_sums()
        self.model, self.compiled, self.graphs, self.tensorboard = None, False, False, None
        self.device_batches = None  # the --decode device pipeline, made at the first epoch

    # -- set-up

    def _load_data(self):
        args, world = self.args, self.ranks.world
        self.train_set, self.val_set, self.num_classes, self.sample_format = load_data(args, self.device,
                                                                               self.ranks)
        if len(self.train_set) < args.batch_size * world:
            raise UsageError(f"--batch-size {args.batch_size} x {world} process(es) is more"
                             f" than the {len(self.train_set)} training images: use a smaller"
                             " --batch-size")

    def _build_model(self):
        args, device = self.args, self.device
        self.net = build_model(args.model, self.num_classes, args.image_size).to(device)
        self.channels_last = use_channels_last(args, device, self.net)
        if self.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)

    def _make_loaders(self):
        args, ranks, device = self.args, self.ranks, self.device
        self.sampler = ResumableSampler(self.train_set, ranks, args.seed)
        workers = args.num_workers
        if workers is None:
            workers = default_workers(self.sample_format, ranks.local_world)
        # Its own generator, reseeded per epoch: worker seeds then never draw from the global
        # RNG, so a resumed run's random stream matches the uninterrupted one.
        self.loader_gen = torch.Generator()
        loader_kw = {"num_workers": workers, "pin_memory": device.type == "cuda",
                     "persistent_workers": workers > 0, "generator": self.loader_gen}
        if workers > 0:
            loader_kw["prefetch_factor"] = 4
        collate = {SampleFormat.JPEG_BYTES: CollateBytes(args.decode_cpu_share),
                   SampleFormat.DECODED: collate_images}.get(self.sample_format)
        if collate:
            loader_kw["collate_fn"] = collate
        self.bad_images = BadImages(args)
        self.loader = DataLoader(self.train_set, batch_size=args.batch_size,
                                 sampler=self.sampler, drop_last=True, **loader_kw)
        self.val_loader = None
        if self.val_set is not None:
            shard = Subset(self.val_set, range(ranks.rank, len(self.val_set), ranks.world))
            self.val_loader = DataLoader(shard, batch_size=args.batch_size, shuffle=False,
                                         num_workers=workers, pin_memory=device.type == "cuda",
                                         collate_fn=collate)

    def _make_optimizer(self):
        args, world = self.args, self.ranks.world
        self.steps_per_epoch = len(self.sampler) // args.batch_size
        self.total = args.steps if args.steps else self.steps_per_epoch * args.epochs
        self.epochs = math.ceil(self.total / self.steps_per_epoch)
        self.global_batch = args.batch_size * world
        self.lr = args.lr if args.lr is not None else 0.1 * self.global_batch / 256
        warmup = (args.warmup_steps if args.warmup_steps is not None
                  else max(1, self.total // 20))
        self.optimizer = make_optimizer(self.net, args, self.lr, self.device, self.amp_dtype)
        self.scheduler = make_scheduler(self.optimizer, warmup, self.total)
        self.scaler = torch.amp.GradScaler(self.device.type,
                                           enabled=self.amp_dtype == torch.float16)

    # -- checkpoints

    def _resuming(self):
        """--resume, or --auto-resume with a last.pt there (rank 0 looks: all ranks follow)."""
        if self.args.resume or not self.args.auto_resume:
            return bool(self.args.resume)
        found = self.ranks.any_true(self.ranks.main and self.ckpt_path.exists())
        if not found:
            self.ranks.print_on_main(f"--auto-resume: no {self.ckpt_path} yet: a fresh run")
        return found

    def resume(self):
        """Load --resume's checkpoint: weights, optimizer, scaler, LR schedule, position, RNG.
        -> False when it has already finished this job."""
        args = self.args
        path = (self.ckpt_path if args.resume == "auto" or args.auto_resume
                else pathlib.Path(args.resume))
        ckpt = load_checkpoint(path, self.config)
        try:
            self.net.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise UsageError(f"--resume: {path} does not fit this model/optimizer"
                             f" ({str(e).splitlines()[0][:120]}): resume with the flags it was"
                             " made with") from None
        self.scaler.load_state_dict(ckpt["scaler"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.start_epoch, self.start_step = ckpt["epoch"], ckpt["step_in_epoch"]
        self.global_step, self.history = ckpt["global_step"], list(ckpt["history"])
        # The sums so far live on rank 0 only (see fold_epoch_sums).
        self.epoch_sums = (dict(ckpt["epoch_acc"]) if self.ranks.main else
                           {**ckpt["epoch_acc"], "loss": 0.0, "correct": 0, "seen": 0})
        set_rng_state(ckpt["rng"])
        self.ranks.print_on_main(
            f"resumed from {path}: epoch {self.start_epoch + 1} step {self.start_step}/"
            f"{self.steps_per_epoch} (global step {self.global_step}/{self.total})")
        if self.global_step >= self.total:
            self.ranks.print_on_main("the checkpoint has already finished this job: nothing"
                                     " to do")
            return False
        if self.history and self.history[-1]["epoch"] == self.start_epoch + 1:
            self.history.pop()  # an epoch --steps ended early: its record is made again at its end
        return True

    def save(self, epoch, step_in_epoch):
        """Checkpoint the job as being at (epoch, step_in_epoch). Every rank first checks the
        loss and (when saving) the weights: a diverged model is never saved."""
        self.guard.check(self.ranks, self.global_step, self.net if self.ckpt_path else None)
        self.saved_at = time.monotonic()
        if self.ckpt_path is None or not self.ranks.main:
            return
        save_checkpoint(self.ckpt_path, {
            "format": CKPT_FORMAT, "config": self.config, "model": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
            "scheduler": self.scheduler.state_dict(), "epoch": epoch,
            "step_in_epoch": step_in_epoch, "global_step": self.global_step,
            "history": self.history, "epoch_acc": self.epoch_sums, "rng": rng_state(),
            "torch_version": str(torch.__version__)})

    # -- training

    def run(self):
        """Train to the end of the job -> its result (rank 0's view). Raises Stopped."""
        if self._resuming() and not self.resume():
            return {"config": self.config, "history": self.history,
                    "final": self.history[-1] if self.history else {}, "already_done": True}
        self.model, self.compiled, self.graphs = wrap_model(self.net, self.args, self.device,
                                                            self.ranks)
        self.tensorboard = open_tensorboard(self.args, self.ranks)
        try:
            self._log_start()
            self.net.train()
            skips = cuda_graph_skips() if self.graphs else 0
            for epoch in range(self.start_epoch, self.epochs):
                self.run_epoch(epoch)
                if self.graphs and cuda_graph_skips() > skips:
                    self.graphs = False  # Inductor compiled the model without them
                    self.ranks.print_on_main(
                        "note: Inductor ran the model without CUDA graphs (TORCH_LOGS=perf_hints"
                        " says why); training goes on, slower")
        finally:
            if self.device_batches is not None:
                self.device_batches.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
        return {"config": self.config, "channels_last": self.channels_last,
                "compile": self.compiled, "cuda_graphs": self.graphs, "tf32": self.args.tf32,
                "device": device_name(self.device), "history": self.history,
                "final": self.history[-1]}

    def run_epoch(self, epoch):
        """Train one epoch (from the saved step when resuming into it), validate, save, log."""
        first = self._start_epoch(epoch)
        n_steps = min(self.steps_per_epoch, self.total - epoch * self.steps_per_epoch)
        progress = Progress(self.args, self.ranks, epoch, self.epochs, n_steps, first)
        meter = EpochMeter(self.device, first, n_steps)
        step = first
        batches, batch_format = self._epoch_batches(epoch)
        for index, (x, y) in enumerate(batches):
            if step >= n_steps:
                break
            meter.before_batch(index)
            self._train_batch(x, y, meter, batch_format)
            step += 1
            last = step >= n_steps
            if meter.log_steps >= self.args.log_every or last:
                self._log_progress(progress, step, meter)
            self._save_or_stop(epoch, step, n_steps, last, meter, progress)
        sync(self.device)
        t_end = time.perf_counter()
        progress.close()
        self.epoch_sums = meter.fold_into(self.epoch_sums, self.ranks, self.bad_images.take(),
                                          t_end)
        record = self._epoch_record(epoch, step, meter.images_per_s(self.global_batch, t_end))
        self.history.append(record)
        # --steps may end the job inside an epoch: save the position there, so that a resume
        # with a larger --steps trains the rest of that epoch (epoch + 1, step 0 would skip it).
        self.save(*((epoch + 1, 0) if step == self.steps_per_epoch else (epoch, step)))
        self._log_epoch(record)

    def _start_epoch(self, epoch):
        """Set the epoch's data order -> its first step (the saved one when resuming into it)."""
        first = self.start_step if epoch == self.start_epoch else 0
        self._set_order(epoch, first)
        if first == 0:
            self.epoch_sums = empty_epoch_sums()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return first

    def _set_order(self, epoch, first):
        """The loader's order for an epoch from batch `first` on."""
        self.sampler.set_epoch(epoch)
        self.sampler.start = first * self.args.batch_size
        self.loader_gen.manual_seed(self.args.seed * 1000 + epoch)

    def _epoch_batches(self, epoch):
        """-> (the epoch's batches, their SampleFormat): --decode device batches come decoded,
        augmented and normalised by DeviceBatches, a step or more ahead of training, from one
        thread for the whole run."""
        if self.sample_format is not SampleFormat.JPEG_BYTES:
            return self.loader, self.sample_format
        if self.device_batches is None:
            plan = [(self.start_epoch, self.start_step)] + [
                (e, 0) for e in range(self.start_epoch + 1, self.epochs)]
            batches = PlanBatches(self.sampler, self.args.batch_size, plan)
            loader = self.loader
            # The trainer's loader, but one iteration for the whole job (PlanBatches).
            job_loader = DataLoader(
                loader.dataset, batch_sampler=batches, num_workers=loader.num_workers,
                collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
                generator=self.loader_gen)
            self.device_batches = DeviceBatches(
                job_loader, self.args.image_size, self.device, self.channels_last, True,
                self.bad_images, [(e, f, n) for (e, f), n in zip(plan, batches.lengths)],
                self.args.seed)
        return self.device_batches.epoch(epoch), SampleFormat.ON_DEVICE

    def _train_batch(self, x, y, meter, batch_format):
        x, y = to_device(x, y, batch_format, self.args.image_size, self.device,
                         self.channels_last, bad_images=self.bad_images)
        loss, logits = train_step(self.model, x, y, self.optimizer, self.scaler, self.amp_dtype,
                                  self.args.grad_clip, self.device.type, self.graphs)
        self.guard.update(loss)
        self.scheduler.step()
        self.global_step += 1
        meter.add(loss, logits, y)

    def _save_or_stop(self, epoch, step, n_steps, last, meter, progress):
        """At a step boundary all ranks agree whether a stop was requested; then save when
        stopping, or every --save-every steps (the epoch's last step is saved by its end)."""
        stop_now = self.ranks.any_true(self.stop.requested)
        every, minutes = self.args.save_every, self.args.save_every_minutes
        due = every and self.global_step % every == 0
        if minutes and not (stop_now or due or last):  # any rank's clock: all save together
            due = self.ranks.any_true(time.monotonic() - self.saved_at >= 60 * minutes)
        if not (stop_now or (due and not last)):
            return
        self.epoch_sums = meter.fold_into(self.epoch_sums, self.ranks, self.bad_images.take())
        self.save(epoch, step)
        self.ranks.barrier()
        if stop_now:
            progress.close()
            where = (f"checkpoint saved to {self.ckpt_path}; continue with --resume (or the"
                     " same command with --auto-resume)" if self.ckpt_path else
                     "no --checkpoint-dir, nothing saved")
            if self.stop.signal_name == "SIGUSR1":
                where += f"; exit status {EXIT_REQUEUE}: requeue the job"
            self.ranks.print_on_main(
                f"stopped by {self.stop.signal_name} at epoch {epoch + 1} step {step}/{n_steps}"
                f" (global step {self.global_step}/{self.total}): {where}")
            raise Stopped()

    def _epoch_record(self, epoch, steps, images_per_s):
        sums = self.epoch_sums
        record = {"epoch": epoch + 1, "steps": steps,
                  "train_loss": sums["loss"] / max(sums["seen"], 1),
                  "train_acc": 100.0 * sums["correct"] / max(sums["seen"], 1),
                  "epoch_time_s": sums["time"], "images_per_s": images_per_s,
                  "peak_mem_gib": peak_mem_gib(self.device, self.graphs)}
        val_skipped = 0
        if self.val_loader is not None:
            record["val_loss"], record["val_acc"], val_skipped = evaluate(
                self.net, self.val_loader, self.sample_format, self.args, self.device,
                self.amp_dtype, self.channels_last, self.ranks, self.bad_images)
        if self.args.skip_bad_images:
            record["skipped_images"] = sums.get("skipped", 0) + val_skipped
        return record

    # -- output

    def _log_start(self):
        args = self.args
        self.ranks.print_on_main(
            f"{self.label}: data={args.data} ({len(self.train_set)} train images,"
            f" {self.num_classes} classes, {args.image_size}px) device={self.device.type}"
            f" world_size={self.ranks.world} batch={args.batch_size}/process"
            f" amp={amp_choice(args.amp, self.device, self.amp_dtype)}"
            f" grad_scaler={self.scaler.is_enabled()}"
            f" channels_last={self.channels_last} compile={self.compiled}"
            f"{' (tuned)' if self.compiled and tuning_on() else ''}"
            f" cuda_graphs={self.graphs} tf32={args.tf32}"
            f" steps/epoch={self.steps_per_epoch} total_steps={self.total} lr={self.lr:g}")

    def _log_progress(self, progress, step, meter):
        # .item() waits for the GPU: only here, every --log-every steps.
        steps, ips = meter.take_log_window(self.global_batch)
        loss = meter.last_loss.item()
        progress.update(step, steps, loss, ips, peak_mem_gib(self.device, self.graphs))
        if self.tensorboard is not None:
            self.tensorboard.add_scalar("train/loss", loss, self.global_step)
            self.tensorboard.add_scalar("train/images_per_s", ips, self.global_step)
            self.tensorboard.add_scalar("train/lr", self.scheduler.get_last_lr()[0],
                                        self.global_step)
        self.guard.check(self.ranks, self.global_step)

    def _log_epoch(self, record):
        if self.tensorboard is not None:
            for key, value in record.items():
                if value is not None and key != "epoch":
                    self.tensorboard.add_scalar(f"epoch/{key}", value, record["epoch"])
        ips = f"{record['images_per_s']:.0f}" if record["images_per_s"] else "n/a"
        mem = (f"{record['peak_mem_gib']:.2f} GiB" if record["peak_mem_gib"] is not None
               else "n/a (CPU)")
        val = (f" val_loss {record['val_loss']:.4f} val_acc {record['val_acc']:.2f}%"
               if "val_loss" in record else "")
        skipped = (f", skipped {record['skipped_images']} unreadable image(s)"
                   if "skipped_images" in record else "")
        self.ranks.print_on_main(
            f"epoch {record['epoch']}/{self.epochs}: train_loss {record['train_loss']:.4f}"
            f" train_acc {record['train_acc']:.2f}%{val} | {ips} img/s,"
            f" {record['epoch_time_s']:.1f} s, peak mem {mem}{skipped}")


def train(args, ranks, device, stop, label=None):
    """Run one training job -> its result dict (rank 0's view). Raises Stopped."""
    return Trainer(args, ranks, device, stop, label).run()


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


# ----------------------------------------------------------------------------------------
# --benchmark

def benchmark(args, device, ranks=None):
    """Images/s and peak memory of training steps on one synthetic batch already on the device.
    Used by --benchmark and by scripts/bench_amp.py (in-process, one config at a time)."""
    ranks = ranks or Ranks()
    amp_dtype = resolve_amp(args.amp, device)
    configure_backends(args, device)
    set_seed(args.seed)
    num_classes = args.num_classes or 1000
    net = build_model(args.model, num_classes, args.image_size).to(device)
    channels_last = use_channels_last(args, device, net)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    model, compiled, graphs = wrap_model(net, args, device, ranks)
    skips = cuda_graph_skips() if graphs else 0
    optimizer = make_optimizer(net, args, 0.1 * args.batch_size / 256, device, amp_dtype)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
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


# ----------------------------------------------------------------------------------------
# --compare

def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def compare(args, ranks, device, stop):
    out = pathlib.Path(args.out)
    # Comparison runs are measurements: no checkpoints, no resume.
    common = {**vars(args), "checkpoint_dir": "", "resume": None}
    fp32_args = argparse.Namespace(**{**common, "amp": "off", "tf32": False})
    amp_args = argparse.Namespace(**common)
    if args.amp == "auto" and device.type == "cpu":
        amp_args.amp = "bf16"  # what --compare measures, even where it is emulated (warned)
    amp_dtype = resolve_amp(amp_args.amp, device)
    if amp_dtype is None:
        raise UsageError("--compare with --amp off has nothing to compare: use --amp auto,"
                         " bf16 or fp16")
    runs = {}
    for key, a in (("fp32", fp32_args), ("amp", amp_args)):
        if device.type == "cuda":
            torch.cuda.empty_cache()
        runs[key] = train(a, ranks, device, stop, label=f"[compare {key}]")
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


# ----------------------------------------------------------------------------------------

def fill_defaults(args):
    """The defaults that depend on --data."""
    if args.batch_size is None:
        args.batch_size = 64 if args.data == "digits" else 256
    if args.image_size is None:
        args.image_size = 32 if args.data == "digits" else 224


def check_args(args, ranks):
    """Every check of the command line that argparse cannot make, in one place, before any
    work: a UsageError (exit 2, one line with the fix) for anything that cannot work here.
    Fills in the defaults that depend on --data; -> the training device."""
    fill_defaults(args)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size}: must be at least 1 (e.g."
                         " --batch-size 64)")
    if args.decode_cpu_share > 1:
        raise UsageError(f"--decode-cpu-share {args.decode_cpu_share:g}: a share of the batch,"
                         " from 0 to 1 (e.g. --decode-cpu-share 0.3)")
    if args.benchmark and args.compare:
        raise UsageError("--benchmark and --compare are separate modes: pick one")
    if args.overwrite and args.resume == "auto":
        raise UsageError("--overwrite starts a new run over CHECKPOINT_DIR/last.pt and --resume"
                         " continues it: give one of them")
    if args.resume == "auto" and not args.checkpoint_dir and not (args.benchmark
                                                                  or args.compare):
        raise UsageError("--resume without a path needs --checkpoint-dir")
    # A bare --resume beside it (a script that adds --auto-resume, a user who adds --resume)
    # is the stricter of the two: last.pt must be there.
    if args.auto_resume and (args.resume not in (None, "auto") or args.overwrite or not (
            args.checkpoint_dir or args.benchmark or args.compare)):
        raise UsageError("--auto-resume continues CHECKPOINT_DIR/last.pt or starts fresh: give"
                         " it with --checkpoint-dir, and without --resume PATH or --overwrite")
    device = pick_device(args, ranks)
    amp_dtype = resolve_amp(args.amp, device)  # --amp fp16 on CPU, bf16 on a GPU without it
    if device.type == "cpu" and (amp_dtype or args.compare and args.amp == "auto"):
        native, why = cpu_bf16()
        if not native:
            ranks.print_on_main(f"{PROG}: warning: bf16 autocast runs emulated here ({why});"
                                " --amp off trains in FP32 at full speed", file=sys.stderr)
    if args.cuda_graphs == "on":  # needs --compile and a GPU, one process
        use_cuda_graphs(args, device, ranks, use_compile(args, device))
    if args.compile in ("on", "tuned"):
        check_compiler(device)
    if args.data not in ("synthetic", "digits") and not os.path.isdir(args.data):
        raise UsageError(f"--data {args.data}: no such directory: give an ImageFolder path,"
                         " or 'synthetic' or 'digits'")
    check_model_name(args.model)
    check_checkpoint_dir(args, ranks)  # last: it creates the directory
    return device


class StopRequest:
    """Set by SIGTERM/SIGINT (docker stop, a scheduler's preemption, Ctrl-C) and SIGUSR1 (a
    scheduler's warning before its time limit). The handler only sets it: the step in flight
    finishes, then every rank saves and exits together (0, or EXIT_REQUEUE after SIGUSR1)."""

    def __init__(self):
        self.requested, self.signal_name = False, None

    def install(self, ranks):
        main_pid = os.getpid()

        def on_signal(signum, _frame):
            name = signal.Signals(signum).name
            if not self.requested and ranks.main and os.getpid() == main_pid:  # not workers
                print(f"\n{name} received: stopping after this step", file=sys.stderr,
                      flush=True)
            self.requested, self.signal_name = True, name

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # Slurm's --signal=USR1@SECONDS (the time limit is near) or a preemption warning: its
        # default action would end the process without a checkpoint.
        signal.signal(signal.SIGUSR1, on_signal)
        return self


def run_benchmark(args, ranks, device):
    result = benchmark(args, device, ranks)
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


def run(args, ranks, stop):
    """Check the command line, join the job, then run the mode it asks for."""
    ranks.check()  # several scheduler tasks that cannot form one job: refuse first
    device = check_args(args, ranks)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ranks.print_on_main(ranks.env.describe())
    ranks.init(device, args.dist_timeout)
    if args.benchmark:
        run_benchmark(args, ranks, device)
    elif args.compare:
        compare(args, ranks, device, stop)
    else:
        result = train(args, ranks, device, stop)
        if args.metrics and ranks.main:
            pathlib.Path(args.metrics).write_text(json.dumps(result, indent=2))


def main(argv=None):
    # A job that hangs (a collective waiting for a rank that is gone, a stuck file system):
    # `kill -USR2 PID` (scancel --signal=USR2 where srun's tasks are this script, not torchrun,
    # which USR2 stops) prints every thread's Python stack to stderr and training goes on.
    # USR1 is left to schedulers' "time is nearly up".
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    writable_home()  # before anything computes a cache path from HOME or the user name
    args = build_parser().parse_args(argv)
    ranks = Ranks()
    if args.list_models:
        print("\n".join(classification_models()))
        return 0
    if args.print_launch:
        return print_launch(args, ranks)
    stop = StopRequest().install(ranks)
    try:
        run(args, ranks, stop)
        # Every rank leaves together, once rank 0's last checkpoint and metrics are written:
        # tearing a process group down while a peer is still busy can hang
        # (pytorch/pytorch#75097, which suggests this barrier). One two-node Slurm test job
        # hung after its last epoch without it (about 1 run in 5; cause not confirmed).
        ranks.barrier()
        return 0
    except UsageError as e:
        if ranks.main or getattr(e, "any_rank", False):
            print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Diverged as e:  # raised on every rank
        if ranks.main:
            print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    except SaveFailed as e:  # only rank 0 saves
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_SAVE_FAILED
    except LaunchError as e:  # on every rank: the one that cannot connect may not be rank 0
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_LAUNCH
    except Stopped:
        return EXIT_REQUEUE if stop.signal_name == "SIGUSR1" else 0
    finally:
        ranks.close()


if __name__ == "__main__":
    sys.exit(main())
