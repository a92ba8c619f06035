"""make pypi-bump (scripts/pypi_bump.py): what moving versions.json's pypi_as_of changes, per row,
and --write that changes its one line. Offline: a fake pip answers with a resolution that depends
on the --uploaded-prior-to it is given; the scripts and versions.json are copies in tmp_path."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

OLD = json.loads((ROOT / "versions.json").read_text())["pypi_as_of"]
NEW = "2099-01-01T00:00:00Z"

FAKE_PIP = r"""
import json, os, pathlib, sys
args = sys.argv[2:]
at = args[args.index("--uploaded-prior-to") + 1] if "--uploaded-prior-to" in args else ""
pkgs = json.loads(os.environ["FAKE_PIP_NEW" if at == os.environ["FAKE_NEW_AT"] else "FAKE_PIP_OLD"])
report = {"install": [{"metadata": {"name": n, "version": v}} for n, v in pkgs.items()]}
pathlib.Path(args[args.index("--report") + 1]).write_text(json.dumps(report))
"""


def bump(tmp_path, *args, old=None, new=None):
    """pypi_bump.py on copies of scripts/ and versions.json; (result, the copy's versions.json)."""
    (tmp_path / "scripts").mkdir(exist_ok=True)
    for name in ("pypi_bump.py", "check_wheels.py", "versions.py", "pip_for_machine.py"):
        shutil.copy(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    copy = tmp_path / "versions.json"
    if not copy.exists():
        shutil.copy(ROOT / "versions.json", copy)
    (tmp_path / "fake_pip.py").write_text(FAKE_PIP)
    old = old or {"torch": "2.6.0", "jupyterlab": "4.6.5", "gone": "1.0"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(CHECK_WHEELS_PIP=f"{sys.executable} {tmp_path / 'fake_pip.py'}", FAKE_NEW_AT=NEW,
               FAKE_PIP_OLD=json.dumps(old), FAKE_PIP_NEW=json.dumps(new if new is not None else old))
    result = subprocess.run([sys.executable, str(tmp_path / "scripts" / "pypi_bump.py"), *args],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    return result, copy


def test_a_bump_lists_what_moves_per_row_and_write_changes_only_the_pypi_as_of_line(tmp_path):
    """Each row should list the packages that move (upgraded, new, removed) between the current
    pypi_as_of and TO; --write should then set TO in versions.json, leaving every other line as
    it was; --markdown should write the same as a pull request's body."""
    new = {"torch": "2.6.0", "jupyterlab": "4.6.6", "fresh": "0.1"}
    before = (ROOT / "versions.json").read_text()
    result, copy = bump(tmp_path, "--to", NEW, "--write", "--markdown", str(tmp_path / "pr.md"), new=new)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("jupyterlab: 4.6.5 -> 4.6.6", "fresh: (not installed) -> 0.1", "gone: 1.0 -> (removed)"):
        assert line in result.stdout, result.stdout
    assert "torch:" not in result.stdout, f"torch did not move: {result.stdout}"
    rows = json.loads(before)["matrix"]
    assert result.stdout.count("3 package(s) change") == len(rows), result.stdout
    changed = [(a, b) for a, b in zip(before.splitlines(), copy.read_text().splitlines()) if a != b]
    assert len(changed) == 1 and NEW in changed[0][1] and '"pypi_as_of"' in changed[0][1], changed
    assert json.loads(copy.read_text())["pypi_as_of"] == NEW
    body = (tmp_path / "pr.md").read_text()
    assert f"from `{OLD}` to `{NEW}`" in body and "| jupyterlab | 4.6.5 | 4.6.6 |" in body, body


def test_a_bump_that_moves_nothing_leaves_versions_json_alone(tmp_path):
    """When nothing resolves differently, --write should say so and change nothing."""
    result, copy = bump(tmp_path, "--to", NEW, "--write")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nothing changes: versions.json left as it is" in result.stdout, result.stdout
    assert copy.read_text() == (ROOT / "versions.json").read_text()


@pytest.mark.parametrize("to, says", [
    ("2020-01-01T00:00:00Z", "is not later than pypi_as_of"),
    ("next monday", "is not an ISO 8601 time"),
    ("2099-01-01T00:00:00", "has no time zone"),
], ids=["earlier", "not-a-time", "no-zone"])
def test_a_time_that_is_not_later_or_not_a_time_is_refused_and_nothing_written(tmp_path, to, says):
    """TO earlier than the current pypi_as_of, not ISO 8601, or without a zone: a clear error,
    a non-zero status, versions.json untouched."""
    result, copy = bump(tmp_path, "--to", to, "--write", new={"jupyterlab": "9"})
    assert result.returncode != 0 and says in result.stdout + result.stderr, result.stdout + result.stderr
    assert copy.read_text() == (ROOT / "versions.json").read_text()
