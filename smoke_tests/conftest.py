"""Smoke-suite setup: the options (--require-gpu, --expect-versions, --expect-gpus, --report-dir),
the cpu/cuda `device` fixture, GPU-count skips, and the JUnit/JSON report.

GPU tests carry @pytest.mark.gpus(n) and skip with a reason when fewer GPUs are visible, so a
CPU-only host still runs the CPU equivalents. --require-gpu turns those skips into failures."""
import json
import os
import pathlib
import platform
import sys
import time

import pytest
import torch
from smokelib import load_expectations

IMAGE_VERSIONS = pathlib.Path("/usr/share/team-image/versions.json")
REQUIRED = pytest.StashKey[int]()
EXPECTED = pytest.StashKey[dict]()
EXPECTED_FROM = pytest.StashKey[str]()


def pytest_addoption(parser):
    g = parser.getgroup("smoke", "team image smoke suite")
    g.addoption("--require-gpu", action="store_true",
                help="GPU runners: every skip becomes a failure (also SMOKE_REQUIRE_GPU=1)")
    g.addoption("--require-gpus", type=int, metavar="N", default=None,
                help="like --require-gpu, and at least N GPUs must be visible, so multi-GPU "
                     "tests must run too (also SMOKE_REQUIRE_GPU=N)")
    g.addoption("--expect-versions", metavar="FILE", default=os.environ.get("SMOKE_EXPECT_VERSIONS"),
                help="JSON with expected versions: {'torch': '2.6.0', ...}, image labels "
                     "{'team.torch.version': ...} or `docker inspect` output. Default: "
                     f"{IMAGE_VERSIONS} when it exists (inside the image), else none")
    g.addoption("--expect-gpus", type=int, metavar="N",
                default=int(os.environ["SMOKE_EXPECT_GPUS"]) if os.environ.get("SMOKE_EXPECT_GPUS") else None,
                help="exact number of GPUs that must be visible (also SMOKE_EXPECT_GPUS)")
    g.addoption("--report-dir", metavar="DIR", default=os.environ.get("SMOKE_REPORT_DIR"),
                help="write smoke-junit.xml and smoke-report.json there (also SMOKE_REPORT_DIR)")


def _required_gpus(config):
    env = os.environ.get("SMOKE_REQUIRE_GPU", "").strip().lower()
    if env in ("", "0", "false", "no"):
        from_env = 0
    elif env.isdigit():
        from_env = int(env)
    else:
        from_env = 1  # "true", "yes": at least one GPU
    flag = 1 if config.getoption("require_gpu") else 0
    return max(from_env, flag, config.getoption("require_gpus") or 0)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.stash[REQUIRED] = _required_gpus(config)
    source = config.getoption("expect_versions")
    if not source and IMAGE_VERSIONS.is_file():
        source = str(IMAGE_VERSIONS)
    try:
        config.stash[EXPECTED] = load_expectations(source) if source else {}
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise pytest.UsageError(f"--expect-versions: cannot read expected versions from {source}: {err}")
    config.stash[EXPECTED_FROM] = source or ""
    report_dir = config.getoption("report_dir")
    if report_dir:
        report_dir = pathlib.Path(config.invocation_params.dir, report_dir)
        report_dir.mkdir(parents=True, exist_ok=True)
        # tryfirst: set before the junitxml plugin reads it in its own pytest_configure.
        if not config.option.xmlpath:
            config.option.xmlpath = str(report_dir / "smoke-junit.xml")
        config.pluginmanager.register(JsonReport(config, report_dir / "smoke-report.json"),
                                      "smoke-json-report")


def gpu_count():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_report_header(config):
    lines = [(f"smoke: torch {torch.__version__}, CUDA build {torch.version.cuda}, "
              f"{gpu_count()} GPU(s) visible")]
    lines += [f"smoke:   cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(gpu_count())]
    required = config.stash[REQUIRED]
    lines.append(f"smoke: --require-gpu: at least {required} GPU(s); a skip of any test needing "
                 f"<= {required} GPU(s) is a failure"
                 if required else "smoke: GPU tests skip when no GPU is visible (--require-gpu to fail)")
    if config.stash[EXPECTED]:
        lines.append(f"smoke: expected versions from {config.stash[EXPECTED_FROM]}")
    else:
        lines.append("smoke: no expected versions given (--expect-versions FILE): "
                     "the version-equality tests skip (--require-gpu makes that a failure)")
    return lines


def pytest_generate_tests(metafunc):
    # One test per visible GPU; on a CPU-only host a single cuda:0 case that skips with a reason.
    if "gpu_index" in metafunc.fixturenames:
        metafunc.parametrize("gpu_index", [
            pytest.param(i, id=f"cuda:{i}", marks=pytest.mark.gpus(1))
            for i in range(max(1, gpu_count()))])


@pytest.fixture(params=[pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpus(1))])
def device(request):
    """torch.device for the CPU equivalent and for the GPU version of a test."""
    return torch.device(request.param)


@pytest.fixture(scope="session")
def expected_versions(pytestconfig):
    return pytestconfig.stash[EXPECTED]


@pytest.fixture(scope="session")
def required_gpus(pytestconfig):
    return pytestconfig.stash[REQUIRED]


NO_EXPECTATIONS = (f"no expected versions: give --expect-versions FILE (or SMOKE_EXPECT_VERSIONS);"
                   f" inside the image they come from {IMAGE_VERSIONS}")


def pytest_collection_modifyitems(config, items):
    # Skipped with a reason, not deselected: on a GPU runner (--require-gpu) a version check
    # that could not run is then a failure, not a silently shorter suite.
    if config.stash[EXPECTED]:
        return
    for item in items:
        if item.get_closest_marker("needs_expectations"):
            item.add_marker(pytest.mark.skip(reason=NO_EXPECTATIONS))


def _skip_reason(report):
    text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return text.removeprefix("Skipped: ")


def _gpus_needed(item):
    marker = item.get_closest_marker("gpus")
    return marker.args[0] if marker else 0


def pytest_runtest_setup(item):
    needed = _gpus_needed(item)
    if not needed:
        return
    have = gpu_count()
    if have == 0:
        pytest.skip("no CUDA device visible (torch.cuda.is_available() is False)")
    if have < needed:
        pytest.skip(f"needs {needed} GPUs, {have} visible")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    required = item.config.stash[REQUIRED]
    # A test needing more GPUs than were required stays a skip: --require-gpus=N asks for those.
    if required and report.skipped and _gpus_needed(item) <= required:
        reason = _skip_reason(report)
        report.outcome = "failed"
        report.longrepr = f"--require-gpu: this test may not skip here. It skipped because: {reason}"


class JsonReport:
    """Collects each test's outcome and writes smoke-report.json at the end of the session."""

    def __init__(self, config, path):
        self.config, self.path, self.tests, self.deselected = config, path, {}, 0
        self.started = time.time()

    def pytest_deselected(self, items):
        self.deselected += len(items)

    def pytest_runtest_logreport(self, report):
        entry = self.tests.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed",
                                                      "duration_s": 0.0})
        entry["duration_s"] = round(entry["duration_s"] + report.duration, 3)
        if report.failed:
            entry["outcome"] = "failed"
            entry.setdefault("message", str(report.longrepr)[-4000:])
        elif report.skipped and entry["outcome"] != "failed":
            entry["outcome"] = "skipped"
            entry["message"] = _skip_reason(report)

    def pytest_sessionfinish(self, session, exitstatus):
        tests = list(self.tests.values())
        summary = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "skipped")}
        summary["deselected"] = self.deselected
        report = {
            "exitstatus": int(exitstatus),
            "duration_s": round(time.time() - self.started, 2),
            "summary": summary,
            "required_gpus": self.config.stash[REQUIRED],
            "expected_versions": self.config.stash[EXPECTED],
            "expected_versions_from": self.config.stash[EXPECTED_FROM],
            "environment": {
                "python": platform.python_version(), "torch": torch.__version__,
                "cuda_build": torch.version.cuda, "host": platform.node(),
                "gpus": [torch.cuda.get_device_name(i) for i in range(gpu_count())],
                "argv": sys.argv,
            },
            "tests": tests,
        }
        self.path.write_text(json.dumps(report, indent=2) + "\n")
