"""Image layers should be reproducible: two builds of one tree without build cache, the second
from a fresh copy (new mtimes, another umask), give the same layers from the first Python layer
up (make repro-check, on a reduced requirements set); and the check should name what differs."""
import subprocess

import pytest

import repro_check
from conftest import ROOT, remove_image

# The reduced build twice without cache, on 2 busy cores: about 2-4 minutes.
REPRO_TIMEOUT = 900


def test_two_builds_without_cache_give_the_same_layers_from_python_up():
    """make repro-check should pass: the venv's three layers, the records and the own files match."""
    proc = subprocess.run(["make", "-s", "repro-check", "IMAGE=team-dl-repro-test"], cwd=ROOT,
                          capture_output=True, text=True, timeout=REPRO_TIMEOUT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"make repro-check failed (exit {proc.returncode}):\n{out[-4000:]}"
    # nvidia, torch, the rest, the records, the own files (and WORKDIR's empty layer).
    assert "repro_check: OK: 6 layers from the first Python layer up" in out, (
        f"expected the six layers from the venv up, all identical:\n{out[-2000:]}")


@pytest.fixture
def two_images(tmp_path):
    """Two one-layer-apart images whose top layers differ only in one file's mtime and another
    file's content: what a `date > file` step or an unnormalized COPY leaves."""
    refs = []
    for tag, (stamp, content) in {"x": (1000000000, "a"), "y": (1000000001, "b")}.items():
        ctx = tmp_path / tag
        ctx.mkdir()
        (ctx / "same").write_text("same")
        (ctx / "stamp").write_text("stamp")
        (ctx / "dated").write_text(content)
        for name in ("same", "stamp", "dated"):
            (ctx / name).chmod(0o644)
        __import__("os").utime(ctx / "stamp", (stamp, stamp))
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY same /same\nCOPY stamp dated /top/\n")
        ref = f"team-dl-repro-compare:{tag}"
        subprocess.run([repro_check.DOCKER, "build", "-q", "-t", ref, str(ctx)], check=True,
                       capture_output=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
        refs.append(ref)
    yield refs
    for ref in refs:
        remove_image(ref)


def test_repro_check_names_the_files_that_make_a_layer_differ(two_images):
    """The comparison should find the differing layer and name the file and the field that differ."""
    a, b = two_images
    differ, details = repro_check.compare(a, b, below=0)
    assert differ == [1], f"only the second layer differs, found {differ}:\n{details}"
    assert "top/dated" in details and "top/stamp" in details and "same" not in details.replace("top/", ""), (
        f"the explanation should name top/dated (content) and top/stamp (mtime), nothing else:\n{details}")
