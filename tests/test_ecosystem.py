"""Third-party training code should run unmodified: as the `dev` user, the current releases of
Lightning and timm install from PyPI into the image's venv without replacing torch or anything
else the image pins (the pip guard), and a few bf16-autocast training steps of each run on the
CPU. The in-container scripts are in tests/data/ecosystem/.

These tests need PyPI. Where a container cannot reach it they fail with that cause, unless
TEAM_TEST_OFFLINE=1 says the host is offline on purpose: then they skip."""
import json
import math
import os
import pathlib
import re
import time

import pytest
from conftest import version_row, wait_for_log

ECOSYSTEM = pathlib.Path(__file__).resolve().parent / "data" / "ecosystem"
CA = "/etc/team-test-ca.pem"  # the host's CA bundle (CA_BUNDLE), for a TLS-inspecting proxy


@pytest.fixture
def dev_run(start_container):
    """A fresh container running a command (as `docker run IMAGE cmd` does, the user `dev`),
    the scripts mounted at /ecosystem; -> run(argv) -> (exit code, output), as dev."""
    volumes = {str(ECOSYSTEM): {"bind": "/ecosystem", "mode": "ro"}}
    env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if os.environ.get("CA_BUNDLE"):
        volumes[os.environ["CA_BUNDLE"]] = {"bind": CA, "mode": "ro"}
        env.update(PIP_CERT=CA, SSL_CERT_FILE=CA)
    c = start_container(["sleep", "infinity"], volumes=volumes, environment=env)
    wait_for_log(c, r"Executing: sleep infinity")

    def run(argv, limit=300):
        started = time.monotonic()
        # `timeout`: a stuck download ends the step with a message, not the SDK's read timeout.
        code, out = c.exec_run(["timeout", str(limit), *argv], user="dev", workdir="/workspace")
        print(f"{' '.join(argv)[:60]}: {time.monotonic() - started:.1f} s")
        return code, out.decode(errors="replace")

    return run


def require_pypi(run):
    code, out = run(["pip", "index", "versions", "pip", "--timeout", "10", "--retries", "1"], limit=60)
    if code == 0:
        return
    why = f"PyPI is not reachable from a container (`pip index versions pip`, exit {code}):\n{out[-2000:]}"
    if os.environ.get("TEAM_TEST_OFFLINE") == "1":
        pytest.skip(f"TEAM_TEST_OFFLINE=1: {why}")
    pytest.fail(f"{why}\nThese tests need PyPI (CI has it); on a host offline on purpose set TEAM_TEST_OFFLINE=1")


def last_json(out):
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"the script printed no JSON result:\n{out[-4000:]}"
    return json.loads(lines[-1])


# (what pip installs, the script in tests/data/ecosystem/ that trains with it)
CASES = {"lightning": ("lightning", "lightning_fit.py"), "timm": ("timm", "timm_step.py")}


@pytest.mark.parametrize("case", CASES)
def test_current_release_installs_as_dev_keeping_the_pins_and_trains_in_bf16(dev_run, case):
    """`pip install` of the current Lightning or timm as dev should leave torch and every pin
    untouched, and a few bf16-autocast CPU training steps with it should give finite losses."""
    package, script = CASES[case]
    require_pypi(dev_run)
    code, before = dev_run(["python", "/ecosystem/pins.py"])
    assert code == 0, f"could not read the pinned packages:\n{before}"
    before = last_json(before)

    code, out = dev_run(["pip", "install", "--progress-bar", "off", package])
    assert code == 0, (f"`pip install {package}` as dev failed (ResolutionImpossible means it needs another "
                       f"torch than the image pins):\n{out[-4000:]}")
    assert "Defaulting to user installation" not in out, f"dev could not write the image's venv:\n{out[-2000:]}"
    code, after = dev_run(["python", "/ecosystem/pins.py"])
    after = last_json(after)
    changed = {name: {"before": before[name], "after": after.get(name)}
               for name in before if before[name] != after.get(name)}
    installed = re.findall(r"^Successfully installed (.*)$", out, re.MULTILINE)
    assert not changed, f"`pip install {package}` replaced pinned packages {sorted(changed)}: {changed}\n{installed}"

    code, out = dev_run(["python", f"/ecosystem/{script}"])
    assert code == 0, f"{script} failed:\n{out[-4000:]}"
    got = last_json(out)
    assert len(got["losses"]) >= 3 and all(math.isfinite(v) for v in got["losses"]), f"losses: {got}"
    assert got["output_dtypes"] == ["torch.bfloat16"], f"the model's output under autocast should be bf16: {got}"
    assert got["weight_dtype"] == "torch.float32" and got["weights_moved"], (
        f"mixed precision should update float32 weights: {got}")
    assert got["torch"].split("+")[0] == before["torch"]["version"] == version_row()["torch"], (
        f"torch should be the image's {version_row()['torch']}: {got}")
    if case == "lightning":
        assert (got["steps"], got["precision"]) == (4, "bf16-mixed"), f"Lightning's own loop should run 4 steps: {got}"
    else:
        assert got["grads_finite"], f"timm's gradients should be finite: {got}"
