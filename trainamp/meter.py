"""What a run prints and records while it trains: the progress bar or lines, the epoch's
running sums (over all ranks), the images/s clock, and the TensorBoard writer."""
import os
import sys
import time

import torch
import torch.distributed as dist

from .errors import UsageError
from .model import sync


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
