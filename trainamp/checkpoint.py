"""Checkpoints: the atomic save (temp file, fsync, rename), the folder's lock and write test
before any work, the refusal to replace another run's last.pt, and the checks on --resume."""
import contextlib
import datetime
import errno
import fcntl
import os
import pathlib
import random
import shutil
import socket
import sys

import numpy as np
import torch

from .errors import PROG, MiB, SaveFailed, UsageError, error_text

CKPT_FORMAT = "train_amp/1"

# Checkpoint fields that must match on --resume: changing any of them changes what the saved
# weights, optimizer moments or data order mean, so continuing would silently train a different job.
# --epochs/--steps may change (to train longer); the LR schedule then stretches from there on.
RESUME_KEYS = ("model", "data", "num_classes", "image_size", "batch_size", "world_size",
               "amp", "seed", "lr")

# The start-up write test's file (.PID added; removed again).
PROBE_NAME = ".train_amp-write-test"


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
    if last.exists() and not last.is_file():
        # Found only at the first save otherwise: a whole run's training lost to one rename.
        raise UsageError(f"{last} exists but is not a file (a {file_kind(last)}), so no"
                         " checkpoint can be saved or resumed there: move it away, or give"
                         " another --checkpoint-dir")
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


def file_kind(path):
    """'directory', 'FIFO', ... for what is at path where a checkpoint file was expected."""
    path = pathlib.Path(path)
    return ("directory" if path.is_dir() else "FIFO" if path.is_fifo() else
            "socket" if path.is_socket() else "device" if path.is_block_device()
            or path.is_char_device() else "special file")


def continues(resume, last):
    """Whether --resume continues the run in last (CHECKPOINT_DIR/last.pt): a bare --resume,
    or a path to that same file."""
    if resume == "auto":
        return True
    try:
        return bool(resume) and os.path.samefile(resume, last)
    except OSError:  # the --resume file is missing: load_checkpoint says so
        return False


def load_checkpoint(path, config):
    path = pathlib.Path(path)
    if path.exists() and not path.is_file():
        raise UsageError(f"--resume: {path} is a {file_kind(path)}, not a checkpoint file: give"
                         " the path of a last.pt file (or move that one away)")
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
