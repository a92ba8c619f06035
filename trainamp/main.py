"""main(): parse the command line, join the job, run the mode it asks for (train, --benchmark,
--compare, --print-launch, --list-models) and turn each kind of failure into its exit status
(errors.py lists them)."""
import faulthandler
import json
import pathlib
import signal
import sys

import torch

from .cli import parse_args
from .errors import (
    EXIT_DIVERGED,
    EXIT_LAUNCH,
    EXIT_REQUEUE,
    EXIT_SAVE_FAILED,
    EXIT_USAGE,
    PROG,
    Diverged,
    LaunchError,
    SaveFailed,
    Stopped,
    UsageError,
)
from .launch import Ranks, StopRequest, print_launch, writable_home
from .model import classification_models
from .plan import check_args
from .report import compare, run_benchmark
from .trainer import train


def run(args, ranks, stop):
    """Check the command line, join the job, then run the mode it asks for."""
    ranks.check()  # several scheduler tasks that cannot form one job: refuse first
    plan = check_args(args, ranks)
    device = plan.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ranks.print_on_main(ranks.env.describe())
    ranks.init(device, args.dist_timeout)
    if args.benchmark:
        run_benchmark(args, ranks, plan)
    elif args.compare:
        compare(args, ranks, plan, stop)
    else:
        result = train(args, ranks, device, stop, plan=plan)
        if args.metrics and ranks.main:
            pathlib.Path(args.metrics).write_text(json.dumps(result, indent=2))


def main(argv=None):
    # A job that hangs (a collective waiting for a rank that is gone, a stuck file system):
    # `kill -USR2 PID` (scancel --signal=USR2 where srun's tasks are this script, not torchrun,
    # which USR2 stops) prints every thread's Python stack to stderr and training goes on.
    # USR1 is left to schedulers' "time is nearly up".
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    writable_home()  # before anything computes a cache path from HOME or the user name
    args = parse_args(argv)
    ranks = Ranks()
    if args.list_models:
        print("\n".join(classification_models()))
        return 0
    if args.print_launch:
        return print_launch(args, ranks)
    stop = StopRequest().install(ranks)
    # status: what this process exits with; clean: every rank got here the same way (the process
    # group may then be destroyed; after a failure on some ranks it is not: Ranks.close).
    status, clean = 1, False
    try:
        run(args, ranks, stop)
        # Every rank leaves together, once rank 0's last checkpoint and metrics are written:
        # tearing a process group down while a peer is still busy can hang
        # (pytorch/pytorch#75097, which suggests this barrier). One two-node Slurm test job
        # hung after its last epoch without it (about 1 run in 5; cause not confirmed).
        ranks.barrier()
        status, clean = 0, True
        return status
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
    except Stopped:  # every rank agreed to stop and passed the barrier after the save
        status, clean = (EXIT_REQUEUE if stop.requeue else 0), True
        return status
    finally:
        ranks.close(status, clean)
