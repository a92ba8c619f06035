"""Image layers should be reproducible: two builds of one tree without build cache, the second
from a fresh copy (new mtimes, another umask), give the same layers from the first Python layer
up (make repro-check, on a reduced requirements set); and the check should name what differs."""
import os
import subprocess

import pytest
import repro_check
from conftest import ROOT, remove_image

# The reduced build twice without cache: minutes, mostly the system stage's apt step (measured
# 14 min in all on a 2-core host at load 8-25 with flaky name resolution inside builds).
REPRO_TIMEOUT = 1500


def test_two_builds_without_cache_give_the_same_layers_from_python_up():
    """make repro-check should pass: the venv's three layers, the records and the own files match."""
    proc = subprocess.run(["make", "-s", "repro-check", "IMAGE=team-dl-repro-test"], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=REPRO_TIMEOUT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"make repro-check failed (exit {proc.returncode}):\n{out[-4000:]}"
    # nvidia, torch, the rest, the records, the own files (and WORKDIR's empty layer).
    assert "repro_check: OK: 6 layers from the first Python layer up" in out, (
        f"expected the six layers from the venv up, all identical:\n{out[-2000:]}")


@pytest.fixture
def two_images(tmp_path):
    """Two images whose second layers differ only in one file's mtime and another file's
    content (what an unnormalized COPY or a `date > file` step leaves); their first layers match."""
    refs = []
    for tag, (stamp, content) in {"x": (1000000000, "a"), "y": (1000000001, "b")}.items():
        ctx = tmp_path / tag
        ctx.mkdir()
        for name, text, mtime in (("same", "same", 1), ("stamp", "stamp", stamp), ("dated", content, 1)):
            (ctx / name).write_text(text)
            (ctx / name).chmod(0o644)
            os.utime(ctx / name, (mtime, mtime))
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY same /same\nCOPY stamp dated /top/\n")
        ref = f"team-dl-repro-compare:{tag}"
        subprocess.run([repro_check.DOCKER, "build", "-q", "-t", ref, str(ctx)], check=True,
                       capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "1"})
        refs.append(ref)
    yield refs
    for ref in refs:
        remove_image(ref)


def test_repro_check_names_the_files_that_make_a_layer_differ(two_images):
    """The comparison should find the differing layer and name the files that differ in it."""
    differ, details = repro_check.compare(*two_images, below=0)
    assert differ == [1], f"only the second layer should differ, found {differ}:\n{details}"
    named = {line.split(":")[0].strip() for line in details.splitlines() if line.startswith("    ")}
    assert {"top/dated", "top/stamp"} <= named and "same" not in named, (
        f"the explanation should name top/dated (content) and top/stamp (mtime), not same:\n{details}")
