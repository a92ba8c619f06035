"""The training loop: Trainer builds the data, model and optimizer from the arguments and the
Plan, resumes, trains epoch by epoch (train_step from amp.py), validates, saves and logs."""
import math
import pathlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

from .amp import (
    LossGuard,
    amp_choice,
    amp_name,
    autocast,
    make_optimizer,
    make_scaler,
    make_scheduler,
    train_step,
)
from .checkpoint import (
    CKPT_FORMAT,
    divergence_hint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from .data.bad import BadImages
from .data.cpu import CollateBytes, collate_images
from .data.loader import (
    ResumableSampler,
    decode_path,
    default_workers,
    load_data,
    to_device,
)
from .data.options import DEFAULT
from .data.prefetch import DeviceBatches, PlanBatches
from .data.sources import SampleFormat
from .errors import EXIT_REQUEUE, Stopped, UsageError
from .launch import ignore_stop_signals
from .meter import EpochMeter, Progress, empty_epoch_sums, open_tensorboard
from .model import (
    build_model,
    configure_backends,
    cuda_graph_skips,
    device_name,
    logits_of,
    peak_mem_gib,
    set_seed,
    sync,
    tuning_on,
    use_channels_last,
    wrap_model,
)
from .plan import resolve_plan


def job_config(args, num_classes, ranks, amp_dtype):
    return {"model": args.model, "data": args.data, "num_classes": num_classes,
            "image_size": args.image_size, "batch_size": args.batch_size,
            "world_size": ranks.world,
            "amp": amp_name(amp_dtype), "seed": args.seed, "lr": args.lr,
            "epochs": args.epochs, "steps": args.steps}


@torch.no_grad()
def evaluate(net, loader, sample_format, args, device, amp_dtype, channels_last, ranks,
             bad_images, options=DEFAULT):
    """Loss, accuracy and skipped images on this rank's shard; summed over ranks (shards do
    not overlap). options: the DecodeOptions of --decode device."""
    net.eval()
    tot = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, correct, count, skipped
    if sample_format is SampleFormat.JPEG_BYTES:
        loader, sample_format = DeviceBatches(loader, args.image_size, device, channels_last,
                                              False, bad_images, options=options), (
            SampleFormat.ON_DEVICE)
    for x, y in loader:
        x, y = to_device(x, y, sample_format, args.image_size, device, channels_last,
                         train=False, bad_images=bad_images, options=options)
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


class Trainer:
    """One training job. __init__ builds the data, model and optimizer; run() resumes when
    asked (resume), then calls run_epoch per epoch, which saves (save) at the epoch's end, every
    --save-every steps and when a stop is requested. Every rank trains; rank 0 logs and saves.
    plan: what the command line resolved to (check_args; made here from args when not given);
    options: the input pipeline's DecodeOptions."""

    def __init__(self, args, ranks, device, stop, label=None, plan=None, options=DEFAULT):
        self.args, self.ranks, self.device, self.stop = args, ranks, device, stop
        self.plan = plan or resolve_plan(args, device, ranks)
        self.options = options
        self.amp_dtype = self.plan.amp_dtype
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
        self.train_set, self.val_set, self.num_classes, self.sample_format = load_data(
            args, self.device, self.ranks, self.options)
        self.decode = decode_path(self.sample_format)  # 'device', 'workers' or None
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
                     "persistent_workers": workers > 0, "generator": self.loader_gen,
                     "worker_init_fn": ignore_stop_signals}
        if workers > 0:
            loader_kw["prefetch_factor"] = 4
        collate = {SampleFormat.JPEG_BYTES: CollateBytes(args.decode_cpu_share),
                   SampleFormat.DECODED: collate_images}.get(self.sample_format)
        if collate:
            loader_kw["collate_fn"] = collate
        self.bad_images = BadImages(args.skip_bad_images, self.decode == "device")
        self.loader = DataLoader(self.train_set, batch_size=args.batch_size,
                                 sampler=self.sampler, drop_last=True, **loader_kw)
        self.val_loader = None
        if self.val_set is not None:
            shard = Subset(self.val_set, range(ranks.rank, len(self.val_set), ranks.world))
            self.val_loader = DataLoader(shard, batch_size=args.batch_size, shuffle=False,
                                         num_workers=workers, pin_memory=device.type == "cuda",
                                         collate_fn=collate, worker_init_fn=ignore_stop_signals)

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
        self.scaler = make_scaler(self.device, self.amp_dtype)

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
        self.model, self.compiled, self.graphs = wrap_model(self.net, self.plan, self.ranks)
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
                generator=self.loader_gen, worker_init_fn=ignore_stop_signals)
            self.device_batches = DeviceBatches(
                job_loader, self.args.image_size, self.device, self.channels_last, True,
                self.bad_images, [(e, f, n) for (e, f), n in zip(plan, batches.lengths)],
                self.args.seed, self.options)
        return self.device_batches.epoch(epoch), SampleFormat.ON_DEVICE

    def _train_batch(self, x, y, meter, batch_format):
        x, y = to_device(x, y, batch_format, self.args.image_size, self.device,
                         self.channels_last, bad_images=self.bad_images, options=self.options)
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
        if stop_now:  # one exit status on every rank: requeue if any rank got SIGUSR1
            self.stop.requeue = self.ranks.any_true(self.stop.requeue)
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
            if self.stop.requeue:
                where += f"; exit status {EXIT_REQUEUE}: requeue the job"
            self.ranks.print_on_main(
                f"stopped by {self.stop.signal_name or 'another rank'} at epoch {epoch + 1}"
                f" step {step}/{n_steps}"
                f" (global step {self.global_step}/{self.total}): {where}")
            if self.ranks.env.launcher == "torchrun" and self.stop.signal_name:
                # A stop of the whole job signals torchrun too, which then ends with status 1
                # and a traceback below this line: say what it is before it reads as a crash.
                self.ranks.print_on_main(
                    "under torchrun: if torchrun got the signal too (a stop of the whole job), it"
                    " ends with exit status 1 and a 'SignalException: Process N got signal: N'"
                    " traceback after this line: torchrun reporting that signal, not a crash;"
                    " the run stopped after saving")
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
                self.amp_dtype, self.channels_last, self.ranks, self.bad_images, self.options)
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


def train(args, ranks, device, stop, label=None, plan=None, options=DEFAULT):
    """Run one training job -> its result dict (rank 0's view). Raises Stopped."""
    return Trainer(args, ranks, device, stop, label, plan, options).run()
