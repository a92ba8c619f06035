#!/usr/bin/env python3
"""Read versions.json, the single source of truth for the image matrix.

Usage: versions.py get KEY [--row NAME]   print one field of a matrix row (default row)
       versions.py standin KEY             print one field of the stand-in base section
       versions.py rows                    print the row names, one per line (CI matrix)
       versions.py make-vars [--row NAME]  print Makefile assignments (VAR := value)
"""
import json
import pathlib
import sys

DATA = json.loads((pathlib.Path(__file__).resolve().parent.parent / "versions.json").read_text())


def row(name=None):
    name = name or DATA["default"]
    for r in DATA["matrix"]:
        if r["name"] == name:
            return r
    sys.exit(f"versions.py: no matrix row named {name!r}; rows: {[r['name'] for r in DATA['matrix']]}")


def main(argv):
    if not argv:
        sys.exit(__doc__)
    cmd, args = argv[0], argv[1:]
    name = None
    if "--row" in args:
        i = args.index("--row")
        name = args[i + 1]
        del args[i:i + 2]
    if cmd == "get":
        print(row(name)[args[0]])
    elif cmd == "standin":
        print(DATA["standin"][args[0]])
    elif cmd == "rows":
        print("\n".join(r["name"] for r in DATA["matrix"]))
    elif cmd == "make-vars":
        for k, v in row(name).items():
            if isinstance(v, str):
                print(f"V_{k.upper()}:={v}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
