#!/usr/bin/env python3
"""A release's notes from CHANGELOG.md: the release workflow runs

    changelog.py notes vX.Y.Z > notes.md

and publishes them as the tag's GitHub release. A tag without its own `## vX.Y.Z` section
fails here, before anything is released: release notes are written by hand, never left empty."""
import argparse
import pathlib
import re
import sys

CHANGELOG = pathlib.Path(__file__).resolve().parent.parent / "CHANGELOG.md"
# `## v1.2.0` or `## v1.2.0 - 2026-12-07`; `## Unreleased` is the section still being written.
SECTION = re.compile(r"^## +(\S+)(?: +- +\d{4}-\d{2}-\d{2})? *$")
TAG = re.compile(r"^v\d+\.\d+\.\d+(?:[-.][0-9A-Za-z.]+)?$")


def sections(text):
    """{heading's first word: body} for every `## ` section, in order."""
    found, name, body = {}, None, []
    for line in text.splitlines():
        m = SECTION.match(line)
        if m or line.startswith("## "):
            if name:
                found[name] = "\n".join(body).strip()
            name, body = (m.group(1) if m else line[3:].strip()), []
        elif name:
            body.append(line)
    if name:
        found[name] = "\n".join(body).strip()
    return found


def notes(tag, text):
    if not TAG.match(tag):
        raise SystemExit(f"changelog: {tag!r} is not a release tag (vMAJOR.MINOR.PATCH)")
    found = sections(text)
    if tag not in found:
        have = ", ".join(found) or "none"
        raise SystemExit(f"changelog: CHANGELOG.md has no '## {tag}' section (sections: {have}):"
                         f" rename '## Unreleased' to '## {tag} - <date>', commit, then tag")
    if not found[tag]:
        raise SystemExit(f"changelog: CHANGELOG.md's '## {tag}' section is empty: say what changed")
    return found[tag] + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("notes", help="print TAG's section of CHANGELOG.md")
    n.add_argument("tag")
    n.add_argument("--file", type=pathlib.Path, default=CHANGELOG)
    args = p.parse_args(argv)
    sys.stdout.write(notes(args.tag, args.file.read_text()))


if __name__ == "__main__":
    main()
