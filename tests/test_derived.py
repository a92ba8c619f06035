"""A team's own image FROM this one (examples/derived/): built on the image under test, it adds
an apt and a pip package, a start-up hook, a Jupyter drop-in and another default UID, and
should keep the pinned torch and start its services as the base does."""
import json
import os
import pathlib
import re
import subprocess
import time
import uuid

import paramiko
import pytest
from conftest import READY, host_port, remove_image, version_row, wait_for_log

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "derived"
ISSUE_LINE = re.compile(r"^(WARN|ERROR)\b|^\[[WEC] ", re.MULTILINE)  # ours, and Jupyter's [W]/[E]/[C]


@pytest.fixture(scope="module")
def derived_ref(image_ref):
    """examples/derived built with BASE=the image under test (BuildKit, the CA bundle as a
    secret when CA_BUNDLE is set, as make build does); removed after this module."""
    ref = f"team-dl-derived-test:{uuid.uuid4().hex[:8]}"
    cmd = ["/usr/bin/docker", "build", "--build-arg", f"BASE={image_ref}", "-t", ref, str(EXAMPLE)]
    if os.environ.get("CA_BUNDLE"):
        cmd[2:2] = ["--secret", f"id=ca_bundle,src={os.environ['CA_BUNDLE']}"]
    started = time.monotonic()
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "DOCKER_BUILDKIT": "1"})
    try:
        assert r.returncode == 0, f"examples/derived did not build on {image_ref}:\n{(r.stdout + r.stderr)[-4000:]}"
        print(f"examples/derived built in {time.monotonic() - started:.0f} s")
        yield ref
    finally:
        remove_image(ref)


def test_derived_image_keeps_the_pinned_torch(run_in_image, derived_ref):
    """A derived image's pip install should leave torch and its CUDA libraries at the tag's pins."""
    script = ("import json, subprocess, torch, tabulate; print(json.dumps({'torch': torch.__version__, "
              "'freeze': subprocess.run(['pip', 'freeze', '--all'], capture_output=True, text=True).stdout}))")
    code, out = run_in_image(["python", "-c", script], image=derived_ref)
    assert code == 0, f"torch or tabulate failed to import in the derived image:\n{out}"
    got = json.loads(out.strip().splitlines()[-1])
    assert got["torch"].split("+")[0] == version_row()["torch"], f"torch changed: {got['torch']}"
    code, pins = run_in_image(["cat", "/opt/venv/etc/constraints.txt"], image=derived_ref)
    pins = [p for p in pins.splitlines() if "==" in p]
    assert pins, f"the base's constraints file is gone:\n{pins}"
    # A pin is name===version (or name==version+label); pip freeze writes name==version.
    changed = [p for p in pins if p.replace("===", "==") not in got["freeze"].splitlines()]
    assert not changed, f"pinned packages no longer installed as pinned: {changed}"


def test_derived_image_starts_with_its_hook_uid_packages_and_jupyter_dropin(start_container, derived_ref,
                                                                           tmp_path):
    """A derived container should start Jupyter and sshd cleanly, run its hook, use UID 2000,
    have jq and tabulate for dev over SSH, and apply its Jupyter drop-in."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    c = start_container(image=derived_ref, environment={"PUBLIC_KEY": (tmp_path / "id_ed25519.pub").read_text()},
                        ports={"22/tcp": ("127.0.0.1", None)})
    logs = wait_for_log(c, READY, 120)
    assert "SSH on" in logs, f"sshd should start with a key, as on the base:\n{logs}"
    assert "Sourcing hook /etc/team/hooks.d/50-example.sh" in logs and "example hook: jq-" in logs, (
        f"the image's start-up hook should run:\n{logs}")
    assert not ISSUE_LINE.search(logs), f"a normal start should print no WARN/ERROR:\n{logs}"

    token = re.search(r"/lab\?token=([0-9a-f]+)", logs).group(1)
    c.exec_run(["touch", "/workspace/.team-example"], user="dev")
    code, out = c.exec_run(["curl", "-fsS", "-H", f"Authorization: token {token}",
                            "http://127.0.0.1:8888/api/contents/"])
    names = [item["name"] for item in json.loads(out)["content"]] if code == 0 else out
    assert ".team-example" in names, f"the drop-in (allow_hidden) should list hidden files: {names}"

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", port=host_port(c, "22/tcp"), username="dev", key_filename=str(key),
                   look_for_keys=False, allow_agent=False, timeout=30)
    try:
        _, out, err = client.exec_command("id -u; jq --version; python -c 'import tabulate'", timeout=60)
        rc = out.channel.recv_exit_status()
        lines, errors = out.read().decode().split(), err.read().decode()
    finally:
        client.close()
    assert rc == 0 and lines[:1] == ["2000"] and lines[1:2] and lines[1].startswith("jq-"), (
        f"dev should be UID 2000 with jq and tabulate over SSH: {lines} {errors}")
