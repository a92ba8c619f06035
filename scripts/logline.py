"""The host scripts' one log helper: `LEVEL [hh:mm:ss] [who: ]message` on stderr, UTC, the
entrypoint's format (docker/rootfs/usr/local/lib/team/log.sh), so make's output reads as one log."""
import datetime
import sys


def log(level, message, who=""):
    print(f"{level:<5} [{datetime.datetime.now(datetime.UTC):%H:%M:%S}] {who + ': ' if who else ''}{message}",
          file=sys.stderr, flush=True)
