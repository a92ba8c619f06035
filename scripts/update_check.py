#!/usr/bin/env python3
"""Does a team member have the image the registry publishes now? Asked quickly, said in one line.

Usage: update_check.py newer   --ref REF [--docker D]     (make run, with REGISTRY) the registry's
         digest for REF's tag is not the one here: say so, and how to take it (make pull)
       update_check.py running --ref REF --container NAME [--docker D]   (after make pull)
         make run's container still runs the image REF named before: say make stop && make run

Never fails the caller: a registry that does not answer within a few seconds, or any other
trouble, leaves it silent (make run goes on with the image here; make pull reports its own errors).
The registry query is scripts/registry.py's (the same login and digest checks as make pull).
"""
import argparse
import json
import subprocess
import sys

import registry

# make run waits this long for the registry at most: an update notice is not worth a slow start.
QUICK = 3


def inspect(o, kind, name):
    r = subprocess.run([o.docker, kind, "inspect", name], capture_output=True, text=True, timeout=15, check=False)
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout)[0]
    except (ValueError, IndexError):
        return None


def newer(o):
    local = inspect(o, "image", o.ref)
    if local is None:
        return
    registry.TIMEOUT = QUICK
    ref = registry.Ref(o.ref)
    digest, _, _ = registry.Client(ref).manifest()
    mine = [d.split("@", 1)[1] for d in local.get("RepoDigests") or [] if d.startswith(ref.name + "@")]
    if digest in mine:
        return
    was = f" (yours: {mine[0][:19]})" if mine else ""
    print(f"make run: a newer {o.ref} is published ({digest[:19]}){was}; this start uses the one here. "
          "To take it: make pull, then make stop && make run (work in /workspace stays)", file=sys.stderr)


def running(o):
    c, image = inspect(o, "container", o.container), inspect(o, "image", o.ref)
    if not c or not image or not c.get("State", {}).get("Running") or c.get("Image") == image.get("Id"):
        return
    print(f"make pull: {o.container} still runs the image {o.ref} named before this pull; to use the new "
          "one: make stop && make run (work in /workspace stays)", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("newer", "running"))
    p.add_argument("--ref", required=True)
    p.add_argument("--docker", default="docker")
    p.add_argument("--container", default=None)
    o = p.parse_args(argv)
    try:
        (newer if o.action == "newer" else running)(o)
    except (registry.RegistryError, ValueError, OSError, subprocess.SubprocessError, KeyError):
        pass  # silent by design: the caller goes on (see the docstring)
    return 0


if __name__ == "__main__":
    sys.exit(main())
