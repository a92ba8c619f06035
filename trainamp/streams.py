"""Standard streams that can never cost a checkpoint: a closed stdout/stderr (`2>&-`), or one
whose reader is gone (`| tee log` ended by the same Ctrl-C or `docker stop` that asks the run to
save; an SSH session that dropped) must not raise in the middle of a step, in the signal
handler's message, or at exit. Output to such a stream is dropped, said once on the other one,
and training, the save and the exit status go on as if it were there."""
import errno
import os
import sys

# What a write to a stream whose reader is gone raises: a pipe with no reader (EPIPE; Python
# ignores SIGPIPE, so it is an exception, not a kill), a terminal that hung up (EIO), a stream
# closed under us (EBADF), a device gone (ENXIO). Other errors (ENOSPC on a log file) drop the
# text but keep the stream: the space may come back.
GONE = (errno.EPIPE, errno.EIO, errno.EBADF, errno.ENXIO)


def open_std_fds():
    """Give fds 0, 1 and 2 a target when the job was started with one closed (`2>&-`,
    `>&-`): otherwise the next file opened takes that number and stderr's text goes into it
    (a checkpoint, a data file), and faulthandler cannot register. Call before anything else
    opens files: before `import torch`."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    # Python made these None at start-up when their fd was closed; they live as long as the
    # process, as the ones Python makes do (so no `with`).
    if sys.stdout is None:
        sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


class SafeStream:
    """A text stream whose write() and flush() never raise OSError. When the stream's reader is
    gone (GONE), its fd is pointed at /dev/null, so that what is still buffered, C-level writes
    to it (faulthandler, torch's warnings) and the flush at exit all succeed quietly."""

    def __init__(self, stream, name, other=None):
        self._stream, self._name, self.other = stream, name, other
        self.gone = False

    def __getattr__(self, attr):  # fileno(), isatty(), encoding, ... as the real stream
        return getattr(self._stream, attr)

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as e:
            self._failed(e)
            return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        try:
            self._stream.flush()
        except OSError as e:
            self._failed(e)

    def isatty(self):
        return not self.gone and self._stream.isatty()

    def _failed(self, e):
        if e.errno not in GONE or self.gone:
            return
        self.gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
            self._stream.flush()  # the text still buffered now goes to /dev/null
        except (OSError, ValueError):
            pass
        other = self.other
        if other is not None and not other.gone:
            other.write(f"train_amp.py: note: {self._name} is gone ({os.strerror(e.errno)}):"
                        f" its output is dropped from here on; training, checkpoints and the"
                        f" exit status are not affected\n")
            other.flush()


def guard_std_streams():
    """open_std_fds(), then sys.stdout and sys.stderr as SafeStreams that tell each other when
    one of them is gone. Idempotent."""
    open_std_fds()
    if isinstance(sys.stdout, SafeStream):
        return
    out = SafeStream(sys.stdout, "stdout")
    err = SafeStream(sys.stderr, "stderr", other=out)
    out.other = err
    sys.stdout, sys.stderr = out, err
