"""The command line resolved once, before any work, into a Plan: the device, the autocast
dtype, whether the model is compiled (and tuned) and replayed as CUDA graphs. The trainer, the
benchmark and --compare read the Plan; nothing writes back into the argparse namespace. (The
--decode choice needs the data set's file list: the trainer makes it once, at load_data.)"""
import dataclasses
import os
import sys

import torch

from .amp import cpu_bf16, resolve_amp
from .checkpoint import check_checkpoint_dir
from .errors import PROG, UsageError
from .launch import pick_device
from .model import check_compiler, check_model_name, use_compile, use_cuda_graphs


@dataclasses.dataclass(frozen=True)
class Plan:
    device: torch.device
    amp_dtype: torch.dtype | None  # None: FP32
    compile: bool  # torch.compile the model
    tuned: bool  # with Inductor's coordinate-descent tuning (--compile tuned)
    cuda_graphs: bool  # replay the compiled model as CUDA graphs


def resolve_plan(args, device, ranks):
    """The Plan of args on device, without check_args' checks: for callers that run a job
    from their own namespace (benchmarks, tests, --compare's runs)."""
    compiled = use_compile(args, device)
    return Plan(device, resolve_amp(args.amp, device), compiled, args.compile == "tuned",
                use_cuda_graphs(args, device, ranks, compiled))


def check_args(args, ranks):
    """Every check of the command line that argparse cannot make, in one place, before any
    work: a UsageError (exit 2, one line with the fix) for anything that cannot work here.
    -> the Plan the rest of the run reads (args as parse_args left them: defaults filled)."""
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
    compiled = use_compile(args, device)
    graphs = use_cuda_graphs(args, device, ranks, compiled)  # needs --compile, a GPU, 1 process
    if args.compile in ("on", "tuned"):
        check_compiler(device)
    if args.data not in ("synthetic", "digits") and not os.path.isdir(args.data):
        raise UsageError(f"--data {args.data}: no such directory: give an ImageFolder path,"
                         " or 'synthetic' or 'digits'")
    check_model_name(args.model)
    check_checkpoint_dir(args, ranks)  # last: it creates the directory
    return Plan(device, amp_dtype, compiled, args.compile == "tuned", graphs)
