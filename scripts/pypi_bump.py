#!/usr/bin/env python3
"""Propose moving versions.json's pypi_as_of forward, the update of every unpinned Python package:
what a build would install from PyPI as of the current pypi_as_of and as of a later time, package
by package, for each row on its base's Python (linux/amd64). It reads metadata only, as
check_wheels.py does (a few MB, no wheels). --write then sets the new time in versions.json, only
where something changes; a rebuild at the new time re-downloads the rest layer on every node
(docs/building.md#layers-and-reproducible-builds), so a bump is a reviewed change, not a cron's.

Usage: pypi_bump.py [--to TIME] [--write] [--markdown FILE]
  --to TIME        ISO 8601 UTC, e.g. 2027-01-05T00:00:00Z (default: today 00:00 UTC)
  --write          set versions.json's pypi_as_of to TIME when any package changes
  --markdown FILE  also write the changes as a Markdown table (a pull request's body)
Exit status: 0 done (changes or none, printed); 1 pip could not resolve a row at a time, or TIME
is not later than the current pypi_as_of; 2 PyPI could not be reached (nothing concluded).
"""
import datetime
import os
import pathlib
import re
import sys

import check_wheels
import versions


def parse_time(text):
    """An aware UTC datetime from ISO 8601 ('Z' or an offset); a clear error otherwise."""
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"pypi_bump: {text!r} is not an ISO 8601 time (e.g. 2027-01-05T00:00:00Z)") from None
    if t.tzinfo is None:
        raise SystemExit(f"pypi_bump: {text!r} has no time zone: write it in UTC, ending in Z")
    return t.astimezone(datetime.UTC)


def resolve(row, as_of, env):
    """{package: version} a build of `row` installs from PyPI as of `as_of` (pip's dry run, as
    check_wheels asks it for the row's base)."""
    have, reason, _, _, _ = check_wheels.resolve(row, "linux/amd64", row["python"], row["glibc"],
                                                 [check_wheels.PYPI], env, as_of=as_of)
    if have is None:
        raise SystemExit(f"pypi_bump: row {row['name']} does not resolve as of {as_of}:\n    " + "\n    ".join(reason))
    return have


def changes(old, new):
    """[(package, old version or None, new version or None)] for what differs, by name."""
    return [(n, old.get(n), new.get(n)) for n in sorted(old.keys() | new.keys()) if old.get(n) != new.get(n)]


def markdown(current, to, per_row):
    lines = [(f"Move versions.json's `pypi_as_of` from `{current}` to `{to}`: the unpinned Python packages"
              " (docker/build/requirements.txt ranges and torch's own dependencies) as PyPI had them then."),
             "Nodes re-download the image's rest layer once (docs/building.md#layers-and-reproducible-builds).", ""]
    for name, diff in per_row.items():
        lines += [f"### {name}", ""]
        if not diff:
            lines += ["Nothing changes.", ""]
            continue
        lines += ["| package | now | after |", "| --- | --- | --- |"]
        lines += [f"| {p} | {a or '(not installed)'} | {b or '(removed)'} |" for p, a, b in diff]
        lines.append("")
    return "\n".join(lines)


def write_as_of(to):
    """Set pypi_as_of in versions.json, its one line only (the file's layout and comments stay)."""
    text = versions.PATH.read_text()
    new, n = re.subn(r'^(\s*"pypi_as_of":\s*)"[^"]*"', lambda m: f'{m.group(1)}"{to}"', text, flags=re.MULTILINE)
    if n != 1:
        raise SystemExit(f"pypi_bump: found {n} pypi_as_of lines in {versions.PATH}, expected 1")
    versions.PATH.write_text(new)


def main(argv):
    to, write, md = None, False, None
    while argv:
        if argv[0] == "--to" and len(argv) > 1:
            to, argv = argv[1], argv[2:]
        elif argv[0] == "--markdown" and len(argv) > 1:
            md, argv = pathlib.Path(argv[1]), argv[2:]
        elif argv[0] == "--write":
            write, argv = True, argv[1:]
        else:
            sys.exit(__doc__)
    current = versions.pypi_as_of()
    if not current:
        sys.exit("pypi_bump: versions.json's pypi_as_of is empty (builds take the newest): nothing to move")
    to_t = parse_time(to) if to else datetime.datetime.now(datetime.UTC).replace(
        hour=0, minute=0, second=0, microsecond=0)
    if to_t <= parse_time(current):
        print(f"pypi_bump: {to_t:%Y-%m-%dT%H:%M:%SZ} is not later than pypi_as_of {current}", file=sys.stderr)
        return 1
    to = f"{to_t:%Y-%m-%dT%H:%M:%SZ}"
    env = dict(os.environ)
    per_row = {}
    try:
        for row in versions.DATA["matrix"]:
            per_row[row["name"]] = changes(resolve(row, current, env), resolve(row, to, env))
    except check_wheels.Unreachable as e:
        print(f"pypi_bump: UNREACHABLE: {e}: nothing was compared (PIP_CERT names a proxy's CA)", file=sys.stderr)
        return 2
    for name, diff in per_row.items():
        print(f"pypi_bump: {name}: {len(diff)} package(s) change from {current} to {to}")
        for p, a, b in diff:
            print(f"  {p}: {a or '(not installed)'} -> {b or '(removed)'}")
    if md:
        md.write_text(markdown(current, to, per_row) + "\n")
    if not any(per_row.values()):
        print("pypi_bump: nothing changes: versions.json left as it is")
    elif write:
        write_as_of(to)
        print(f"pypi_bump: versions.json's pypi_as_of is now {to}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
