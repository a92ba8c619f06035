"""The errors a run can end with, each with its exit status (also in --help's epilog), and
the constants every module shares."""
import re

PROG = "train_amp.py"

GiB = 2 ** 30

MiB = 2 ** 20

# Exit statuses besides 0 (done, or stopped by SIGTERM after saving) and 1 (a bug: traceback).
EXIT_USAGE, EXIT_DIVERGED, EXIT_SAVE_FAILED, EXIT_LAUNCH = 2, 3, 4, 5

# Stopped by SIGUSR1, a scheduler's "time is nearly up", after saving: sysexits' EX_TEMPFAIL
# ("try again later"), which slurm/*.sbatch turn into a requeue.
EXIT_REQUEUE = 75


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
    """SIGTERM/SIGINT/SIGHUP/SIGUSR1 arrived; raised at a step boundary after the checkpoint is
    written."""


class Diverged(Exception):
    """The loss stayed non-finite (or the weights did): exit 3, last.pt left as it was."""


class SaveFailed(Exception):
    """A checkpoint could not be written (disk full, I/O error): exit 4, old last.pt kept."""


def error_text(e):
    """'Type: first line of the message', without the C++ source location torchvision adds."""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {re.sub(r'^.*?[.](?:cpp|h):[0-9]+, ', '', first)[:200]}"
