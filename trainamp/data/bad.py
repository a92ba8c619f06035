"""Unreadable images: what a DataLoader worker returns for a file it cannot load, and what the
run does with it (stop naming the file, or skip and count with --skip-bad-images)."""
import collections
import sys

from ..errors import PROG, BadImageError

# An ImageFolder sample that could not be read or decoded, returned by a DataLoader worker in
# place of (image, label): an exception there would reach the main process as a traceback that
# names neither the file nor the fix. The collate functions list these as (path, reason) and
# to_device() hands them to BadImages, which stops naming the file or (--skip-bad-images)
# counts them.
BadSample = collections.namedtuple("BadSample", "path reason")


def split_bad(batch):
    """-> (the usable samples, [(path, reason)] of the BadSamples)."""
    good = [b for b in batch if not isinstance(b, BadSample)]
    return good, [(b.path, b.reason) for b in batch if isinstance(b, BadSample)]


class BadImages:
    """What to do with unreadable images: stop naming the first one, or (--skip-bad-images)
    warn once per file and count them; take() hands over the count since the last take()."""

    def __init__(self, skip=False, device_decode=False):
        self.skip, self.device_decode = skip, device_decode
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
