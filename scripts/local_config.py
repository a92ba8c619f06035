#!/usr/bin/env python3
"""Remember make settings a team member gives once (REGISTRY) in local.mk, which the Makefile
includes before its defaults, so every later target (run, shell, smoke, pull, doctor, ...) uses it.

Usage: local_config.py remember --file local.mk NAME VALUE   VALUE empty: forget NAME

Why a file and not the environment or .env: an `export REGISTRY=...` is gone in the next terminal,
SSH session or `sudo make` (sudo drops it), and a build then starts instead of a pull; .env is
the container's --env-file (every line becomes the container's environment, in Docker's own
unquoted format), not make's. local.mk is make's own syntax, untracked (.gitignore), one line per
setting. Precedence: make's command line, then the environment, then local.mk, then the default.
"""
import argparse
import pathlib
import re
import sys

# Only what is safe to write into a make file as is (no $, #, quotes, spaces or newlines): a
# registry is host[:port][/path]. scripts/pull.py checks the reference in full when it pulls.
SAFE = re.compile(r"[A-Za-z0-9._:/-]+")
NAMES = ("REGISTRY",)


def line_for(name, value):
    return f"{name} ?= {value}\n"


def remember(path, name, value):
    """Write (or drop, for an empty value) NAME's line in local.mk; say so in one line."""
    if value and not SAFE.fullmatch(value):
        print(f"ERROR: {name}={value!r} cannot be a registry (host[:port][/path], e.g. "
              f"registry.example.com/ml): not remembered", file=sys.stderr)
        return 2
    old = path.read_text().splitlines(keepends=True) if path.exists() else []
    kept = [ln for ln in old if not re.match(rf"{name}\s*\??=", ln)]
    new = kept + ([line_for(name, value)] if value else [])
    if new == old:
        return 0
    if not any(ln.startswith("#") for ln in kept):
        new.insert(0, "# make's settings for this checkout (scripts/local_config.py; untracked): "
                      "make's command line and the environment override them.\n")
    path.write_text("".join(new))
    if value:
        print(f"make: {name}={value} remembered in {path.name}: every make target uses it from now on "
              f"(another {name}=... replaces it; {name}= forgets it)", file=sys.stderr)
    else:
        print(f"make: {name} forgotten ({path.name}): make builds the image here again", file=sys.stderr)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("remember",))
    p.add_argument("--file", default="local.mk", type=pathlib.Path)
    p.add_argument("name", choices=NAMES)
    p.add_argument("value")
    o = p.parse_args(argv)
    return remember(o.file, o.name, o.value)


if __name__ == "__main__":
    sys.exit(main())
