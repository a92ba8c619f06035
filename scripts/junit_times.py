#!/usr/bin/env python3
"""Where a test run's time went: pytest's junit xml files summed per test file, slowest first.

Usage: junit_times.py JUNIT.xml [JUNIT.xml ...]
.ci/run prints this after each pytest run (beside pytest's own --durations=25), so a slow file
shows in the CI log. A test's time is its setup, call and teardown (pytest's default junit
duration), so a module-scoped fixture counts in the file whose first test started it.
Standard library only: it runs with the host's python3.
"""
import collections
import pathlib
import sys
import xml.etree.ElementTree as ET


def test_file(case):
    """tests/test_x.py for a <testcase>: its `file` attribute (xunit1), else from the classname
    (xunit2, pytest's default: tests.test_x or tests.test_x.TestClass)."""
    if case.get("file"):
        return case.get("file")
    parts = (case.get("classname") or "?").split(".")
    module = [p for p in parts if not p[:1].isupper()]
    return "/".join(module) + ".py"


def per_file(paths):
    """{file: [seconds, tests, failed, skipped]} over every <testcase> in the junit files."""
    files = collections.defaultdict(lambda: [0.0, 0, 0, 0])
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            row = files[test_file(case)]
            row[0] += float(case.get("time") or 0)
            row[1] += 1
            row[2] += any(case.find(tag) is not None for tag in ("failure", "error"))
            row[3] += case.find("skipped") is not None
    return files


def table(files):
    lines = [f"{'seconds':>8} {'tests':>5} {'failed':>6} {'skipped':>7}  file"]
    for name, (seconds, tests, failed, skipped) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{seconds:8.1f} {tests:5d} {failed:6d} {skipped:7d}  {name}")
    total = [sum(r[i] for r in files.values()) for i in range(4)]
    lines.append(f"{total[0]:8.1f} {total[1]:5d} {total[2]:6d} {total[3]:7d}  (all {len(files)} files)")
    return "\n".join(lines)


def main(argv):
    paths = [pathlib.Path(p) for p in argv]
    if not paths:
        sys.exit(__doc__.strip().splitlines()[2])
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        sys.exit(f"junit_times.py: no such junit file: {', '.join(missing)} (did pytest run with --junitxml?)")
    print(table(per_file(paths)))


if __name__ == "__main__":
    main(sys.argv[1:])
