"""docker/build/pip-env.sh, which every pip step of the build sources: PyPI as of versions.json's
pypi_as_of (pip --uploaded-prior-to), so two builds of one commit, however far apart, install the
same versions; pip itself as of that time too. Run with a fake pip that logs what it is asked
(the real effect, a build at an earlier date installing older releases, is measured in
benchmarks/results/repro-full_2core_2026-12-05.md). No image, no Docker, no network."""
import subprocess

import build_info
import pytest
import versions
from conftest import ROOT

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

PIP_ENV = ROOT / "docker" / "build" / "pip-env.sh"
# A fake venv's pip: logs each call with the cutoff pip would read; --help lists the option unless
# the venv is marked as holding a pip too old to know it.
FAKE_PIP = """#!/bin/sh
echo "pip $* [PIP_UPLOADED_PRIOR_TO=${PIP_UPLOADED_PRIOR_TO-unset}]" >> "$(dirname "$0")/../calls"
if [ "$1 $2" = "install --help" ]; then
  [ -e "$(dirname "$0")/../old-pip" ] || echo "  --uploaded-prior-to <datetime_or_duration>"
fi
"""


@pytest.fixture
def venv(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pip").write_text(FAKE_PIP)
    (tmp_path / "bin" / "pip").chmod(0o755)
    return tmp_path


def upgrade_pip(venv, as_of, **env):
    """Source pip-env.sh as the Dockerfile does (sh, the build arg in the environment) and run
    upgrade_pip: (exit status, stderr, the fake pip's calls)."""
    proc = subprocess.run(["sh", "-c", f'. "{PIP_ENV}" && upgrade_pip "{venv}"'], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "PYPI_AS_OF": as_of, **env}, check=False)
    calls = (venv / "calls").read_text().splitlines() if (venv / "calls").exists() else []
    return proc.returncode, proc.stderr, calls


def test_the_build_installs_pypi_as_of_the_versions_json_time():
    """make build should pass versions.json's pypi_as_of to the Dockerfile, which hands it to pip."""
    assert versions.DATA["pypi_as_of"].endswith("Z"), "a UTC time, the same on every machine"
    assert build_info.build_args(versions.row())["PYPI_AS_OF"] == versions.DATA["pypi_as_of"]
    assert build_info.build_args(versions.row(), pypi_as_of="")["PYPI_AS_OF"] == "", "PYPI_AS_OF= must win"
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "ARG PYPI_AS_OF=" in dockerfile and "upgrade_pip /opt/venv" in dockerfile


def test_pip_reads_the_time_and_pip_itself_goes_back_to_it(venv):
    """With PYPI_AS_OF, every pip call should see it, and pip be reinstalled as of that time."""
    rc, err, calls = upgrade_pip(venv, "2026-12-01T00:00:00Z")
    assert rc == 0, err
    cutoff = "[PIP_UPLOADED_PRIOR_TO=2026-12-01T00:00:00Z]"
    assert calls == [f"pip install --upgrade pip {cutoff}",
                     f"pip install --force-reinstall --no-deps pip {cutoff}",
                     f"pip install --help {cutoff}"], calls


def test_an_empty_time_takes_the_newest_and_sets_nothing(venv):
    """PYPI_AS_OF= (make build PYPI_AS_OF=) should upgrade pip once and give pip no cutoff."""
    rc, err, calls = upgrade_pip(venv, "")
    assert rc == 0, err
    assert calls == ["pip install --upgrade pip [PIP_UPLOADED_PRIOR_TO=unset]"], calls


def test_a_pip_too_old_for_the_option_fails_the_build_and_says_what_to_do(venv):
    """A pip that would ignore the time silently should stop the build, naming the fix."""
    (venv / "old-pip").touch()
    rc, err, _ = upgrade_pip(venv, "2020-01-01T00:00:00Z")
    assert rc == 1, "a pip that ignores --uploaded-prior-to must stop the build"
    assert "ignores --uploaded-prior-to" in err and "pypi_as_of in versions.json" in err, err


def test_a_pip_mirror_gets_no_time_and_the_log_says_so(venv):
    """With a pip mirror (which may give no upload times, failing pip), no cutoff, said once."""
    rc, err, calls = upgrade_pip(venv, "2026-12-01T00:00:00Z", PIP_INDEX_URL="https://mirror.example/simple")
    assert rc == 0, err
    assert calls == ["pip install --upgrade pip [PIP_UPLOADED_PRIOR_TO=unset]"], calls
    assert "PYPI_AS_OF=2026-12-01T00:00:00Z is not applied" in err, err
