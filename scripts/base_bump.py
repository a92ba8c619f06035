#!/usr/bin/env python3
"""The base image's own updates: whether each versions.json row's base tag (base_image, e.g.
nvidia/cuda:12.4.1-base-ubuntu22.04) now names another digest upstream than the one pinned
(base_image_digest), and, with --write, the move of the pin. NVIDIA re-pushes its tags with
rebuilt Ubuntu layers; builds use the pinned digest, so without a move they never get them. The
monthly .github/workflows/base-bump.yml opens the move as a pull request (docs/building.md#pinning-the-base).

Usage: base_bump.py check [--write] [--markdown FILE] [--upstream HOST[:PORT]]
           per row: the tag's digest upstream against the pin; --write sets the new ones (and a
           row with no pin yet) in versions.json, one line per row, nothing else
       base_bump.py resolve --row NAME [--upstream HOST[:PORT]]
           print the digest the row's base tag names now (the release's trust on first use)
       base_bump.py bases [--upstream HOST[:PORT]]
           print {"bases": {row: tag@digest}, "first_use": [{row, digest}]} (JSON, one line): what
           the release builds each row on; a row with no pin on the digest its tag names now,
           listed in first_use (trust on first use: the release records it and opens a pull
           request pinning it, docs/publishing.md)
       base_bump.py pin --row NAME --digest sha256:...
           set that row's base_image_digest in versions.json (the release's first-use pull request)
       base_bump.py same-but-digests OLD NEW
           exit 1 unless two versions.json files differ only in base_image_digest values
  --upstream: ask this registry instead of the tag's own (a mirror, or a test's local registry)
Exit status: 0 done (moved or not, printed); 1 a registry refused or was unreachable (one line).
"""
import argparse
import json
import pathlib
import re
import sys

import registry
import versions


def upstream_ref(tag, upstream=None):
    """The registry reference to ask: the tag itself, or the same repository on `upstream`."""
    if not upstream:
        return tag
    return f"{upstream}/{registry.Ref(tag).repository}:{registry.Ref(tag).tag}"


def resolve(row, upstream=None):
    """The digest (of the index, for a multi-platform tag) the row's base tag names now."""
    digest, _, _ = registry.Client(upstream_ref(row["base_image"], upstream)).manifest()
    return digest


def write_digests(moves):
    """Set base_image_digest of each moved row in versions.json, editing only its value."""
    text = versions.PATH.read_text()
    for name, (old, new) in moves.items():
        line = re.compile(r'^(\s*\{"name": "' + re.escape(name) + r'".*"base_image_digest": ")' + re.escape(old) + r'(")',
                          re.MULTILINE)
        text, n = line.subn(lambda m, new=new: m.group(1) + new + m.group(2), text)
        if n != 1:
            sys.exit(f"base_bump: versions.json's row {name} is not on one line with its base_image_digest: edit it by hand")
    versions.PATH.write_text(text)


def markdown(moves, rows):
    lines = [("Move versions.json's `base_image_digest` to what each base tag names upstream today "
             "(trust on first use for a row that had none; docs/building.md#pinning-the-base)."), "",
             "| Row | Base tag | Pinned | Upstream now |", "|---|---|---|---|"]
    for name, (old, new) in moves.items():
        lines.append(f"| `{name}` | `{rows[name]['base_image']}` | `{old or '(none)'}` | `{new}` |")
    lines += ["", ("CI on this pull request builds and tests every row on the new base; the release "
              "gate scans it. The stand-in's facts (versions.json base_facts) name the tag, not a digest: "
              "check them if the build's base checks fail.")]
    return "\n".join(lines) + "\n"


def strip_digests(path):
    data = json.loads(pathlib.Path(path).read_text())
    for r in data.get("matrix", []):
        r.pop("base_image_digest", None)
    return data


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--write", action="store_true")
    c.add_argument("--markdown")
    r = sub.add_parser("resolve")
    r.add_argument("--row", required=True)
    for s in (c, r):
        s.add_argument("--upstream", default=None)
    b = sub.add_parser("bases")
    b.add_argument("--upstream", default=None)
    pn = sub.add_parser("pin")
    pn.add_argument("--row", required=True)
    pn.add_argument("--digest", required=True)
    s = sub.add_parser("same-but-digests")
    s.add_argument("old")
    s.add_argument("new")
    a = p.parse_args(argv)
    if a.cmd == "same-but-digests":
        same = strip_digests(a.old) == strip_digests(a.new)
        print("only base_image_digest values differ" if same else "versions.json differs in more than base_image_digest",
              file=sys.stderr)
        return 0 if same else 1
    if a.cmd == "pin":
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", a.digest):
            print(f"base_bump: {a.digest!r} is not a sha256 digest (sha256:<64 hex digits>)", file=sys.stderr)
            return 2
        write_digests({a.row: (versions.row(a.row).get("base_image_digest", ""), a.digest)})
        return 0
    try:
        if a.cmd == "bases":
            bases, first_use = {}, []
            for row in versions.DATA["matrix"]:
                if row.get("base_image_digest"):
                    bases[row["name"]] = versions.base_image(row)
                else:
                    # One row's unreachable registry must not hold back the pinned rows: this row
                    # gets no digest, and the release's build of it alone stops, saying so.
                    try:
                        digest = resolve(row, a.upstream)
                    except registry.RegistryError as e:
                        print(f"base_bump: WARN {row['name']}: no digest to trust on first use: {e}", file=sys.stderr)
                        bases[row["name"]] = row["base_image"]
                        continue
                    bases[row["name"]] = f"{row['base_image']}@{digest}"
                    first_use.append({"row": row["name"], "digest": digest})
                    print(f"{row['name']}: no base_image_digest; {row['base_image']} names {digest} now: "
                          "trusted on first use", file=sys.stderr)
            print(json.dumps({"bases": bases, "first_use": first_use}, separators=(",", ":")))
            return 0
        if a.cmd == "resolve":
            print(resolve(versions.row(a.row), a.upstream))
            return 0
        rows = {row["name"]: row for row in versions.DATA["matrix"]}
        moves = {}
        for name, row in rows.items():
            now, pinned = resolve(row, a.upstream), row.get("base_image_digest", "")
            print(f"{name}: {row['base_image']} " + (f"still {now}" if now == pinned else
                  f"now names {now}, pinned {pinned or '(none)'}"), file=sys.stderr)
            if now != pinned:
                moves[name] = (pinned, now)
    except registry.RegistryError as e:
        print(f"base_bump: {e}", file=sys.stderr)
        return 1
    if a.markdown:
        pathlib.Path(a.markdown).write_text(markdown(moves, rows) if moves else "Nothing moves.\n")
    if moves and a.write:
        write_digests(moves)
        print(f"base_bump: versions.json: {len(moves)} row(s) moved; run make generate for the Dockerfile's default",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
