"""Where the suite's time went, written as the run goes: a run cut by CI's time limit (or killed)
already has in its log the file that was running, each file's seconds so far and the slowest
tests, not only what --durations and .ci/run's summary print at the end.

A line at every file's first test (also under xdist: the controller sees each worker's start):
    [progress +612 s] tests/test_b.py starts; 3 files begun before, the longest so far: ...
and with PROGRESS_FILE set (.ci/run: artifacts/progress.txt) the same table rewritten after every
test, for .ci/run's summary when pytest itself was killed."""
import collections
import os
import pathlib
import time

import pytest

SLOWEST = 3


def short(nodeid):
    """tests/test_a.py::test_b[long parameters] -> test_a.py::test_b[long param...]"""
    name = nodeid.removeprefix("tests/")
    return name if len(name) <= 90 else name[:87] + "..."


class Progress:
    def __init__(self, config):
        self.config, self.start = config, time.monotonic()
        self.seconds = collections.Counter()   # file -> seconds of its tests' phases so far
        self.tests = collections.Counter()     # test -> seconds (setup, call and teardown)
        self.running = {}                      # file -> when its first test started
        self.path = os.environ.get("PROGRESS_FILE")

    def table(self, top=None):
        files = ", ".join(f"{short(f)} {s:.0f} s" for f, s in self.seconds.most_common(top))
        slow = ", ".join(f"{short(t)} {s:.0f} s" for t, s in self.tests.most_common(SLOWEST))
        return files or "nothing yet", slow or "nothing yet"

    def write(self, line):
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logstart(self, nodeid, location):
        name = nodeid.split("::", 1)[0]
        if name in self.running:
            return
        self.running[name] = time.monotonic()
        files, slow = self.table(top=SLOWEST)
        self.write(f"[progress +{time.monotonic() - self.start:.0f} s] {name} starts; {len(self.running) - 1} "
                   f"files begun before, the longest so far: {files}; slowest tests: {slow}")

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration
        self.tests[report.nodeid] += report.duration
        if self.path and report.when == "teardown":
            files = "".join(f"{s:8.0f} s  {f}\n" for f, s in self.seconds.most_common())
            slow = "".join(f"{s:8.0f} s  {t}\n" for t, s in self.tests.most_common(25))
            part = pathlib.Path(f"{self.path}.{os.getpid()}.part")
            part.write_text(f"after {time.monotonic() - self.start:.0f} s, the last test: {report.nodeid}\n"
                            f"seconds per file so far:\n{files}the 25 slowest tests so far:\n{slow}")
            part.replace(self.path)


def pytest_configure(config):
    # Once, in the process that reports (xdist's controller; a worker has workerinput).
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Progress(config), "team-progress")
