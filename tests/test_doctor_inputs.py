"""make run/build's pre-flight on what the user typed (scripts/doctor_inputs.py): a STOP_TIMEOUT
that leaves jobs no time to save, an image reference Docker would refuse. Through make, with
test_doctor's fake docker and host; no container, about 4 s each (make's start on a loaded host).
"""
import pytest
from test_doctor import IMAGE, FakeHost, make, status, table

pytestmark = pytest.mark.host


@pytest.fixture
def host(tmp_path):
    return FakeHost(tmp_path)


@pytest.mark.parametrize("value", ["0", "3", "ten"])
def test_make_run_refuses_a_stop_timeout_that_leaves_jobs_no_time_to_save(host, value):
    """make run STOP_TIMEOUT=0 (or 3, or not a number): the pre-flight says what docker stop will
    do to a job (killed before it can checkpoint) and the value that works; no docker run."""
    r = make(host, "run", f"STOP_TIMEOUT={value}", f"PORT_JUPYTER={host.ports[0]}", f"PORT_SSH={host.ports[1]}",
             f"IMAGE={IMAGE.split(':')[0]}", f"TAG={IMAGE.split(':')[1]}")
    out = r.stdout + r.stderr
    s, row = status(out, "stop timeout")
    assert r.returncode != 0 and s == "FAIL" and "make run STOP_TIMEOUT=60" in row, out
    assert ("before they can save a checkpoint" in row) if value.isdigit() else ("not a number" in row), row
    assert not [c for c in host.calls() if c[0] in ("run", "build")], host.calls()


def test_make_run_with_stop_timeout_4_passes_the_preflight(host):
    """The least STOP_TIMEOUT that gives jobs a second is not refused: docker run gets it."""
    r = make(host, "run", "STOP_TIMEOUT=4", f"PORT_JUPYTER={host.ports[0]}", f"PORT_SSH={host.ports[1]}",
             f"IMAGE={IMAGE.split(':')[0]}", f"TAG={IMAGE.split(':')[1]}")
    assert "stop timeout" not in table(r.stdout + r.stderr), r.stdout + r.stderr
    runs = [c for c in host.calls() if c[0] == "run" and "--stop-timeout" in c]
    assert runs and runs[0][runs[0].index("--stop-timeout") + 1] == "4", host.calls()


def test_make_build_with_an_uppercase_image_stops_before_docker(host):
    """make build IMAGE=Team-DL: the pre-flight names IMAGE and the lowercase name, instead of
    Docker's "invalid reference format" after the build's start."""
    r = make(host, "build", "IMAGE=Team-DL", "TAG=t1")
    out = r.stdout + r.stderr
    s, row = status(out, "image reference")
    assert r.returncode != 0 and s == "FAIL" and "IMAGE='Team-DL' has uppercase letters" in row, out
    assert not [c for c in host.calls() if c[0] == "build"], host.calls()
