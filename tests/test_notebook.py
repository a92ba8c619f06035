"""The notebook extras (docs/container.md: Notebook extras): GPU dashboards (jupyterlab-nvdashboard) that say
"no GPU" on a CPU host, the kernel's CPU/memory in the status bar (jupyter-resource-usage),
TensorBoard served through Jupyter only (jupyter-server-proxy) with a launcher entry, and the GPU
on the command line (gpustat, nvitop) and in tmux's status line. Browser tests keep screenshots in
artifacts/."""
import json
import time

import pytest
import requests
import websocket
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait
from test_browser import browser  # noqa: F401 - the headless Chromium fixture

TIMEOUT = 30
# Small enough for 2 CPU cores (as in train_amp_helpers.py): a few logged steps are all TensorBoard needs.
TRAIN = ["train_amp.py", "--model", "resnet18", "--data", "synthetic", "--synthetic-size", "256",
         "--num-classes", "10", "--image-size", "32", "--batch-size", "32", "--steps", "4",
         "--log-every", "1", "--checkpoint-dir", "/tmp/ck", "--tensorboard", "/workspace/runs/amp"]


def get(base, path, token=None, **kwargs):
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.get(base + path, headers=headers, timeout=TIMEOUT, allow_redirects=False, **kwargs)


def refused(r):
    """Jupyter's answer to a request without valid auth: 403 (API) or a redirect to its login."""
    return r.status_code == 403 or (r.status_code == 302 and "/login" in r.headers.get("Location", ""))


def first_messages(url, n=2, timeout=20):
    """Open a websocket and return the first n JSON messages it sends."""
    ws = websocket.create_connection(url, timeout=timeout)
    try:
        return [json.loads(ws.recv()) for _ in range(n)]
    finally:
        ws.close()


def listeners_beyond_loopback(container):
    """TCP ports something listens on at an address other than loopback, inside the container."""
    code, out = container.exec_run(["ss", "-Hltn"])
    out = out.decode()
    assert code == 0 and out.strip(), f"ss failed or listed nothing, the probe is broken:\n{out}"
    addrs = [line.split()[3] for line in out.splitlines()]
    return {a.rsplit(":", 1)[1] for a in addrs if not a.startswith(("127.", "[::1]", "::1"))}


# ---------------------------------------------------------------------------------------
# GPU dashboards and the status bar

def test_gpu_dashboard_reports_no_gpu_on_a_cpu_host_and_serves_its_cpu_panel(start_jupyter):
    """Container without a GPU should load nvdashboard, answer 'no GPU' through its API (not a
    server error), leave the GPU panels' feeds out, and still stream the CPU panel's figures."""
    c, base, token = start_jupyter()
    r = get(base, "/nvdashboard/accelerators/check", token)
    assert r.status_code == 200, f"nvdashboard's status API should answer 200, got {r.status_code}: {r.text[:300]}"
    status = r.json()
    assert status["has_gpu"] is False and status["ngpus"] == 0, f"a CPU host should report no GPU: {status}"
    r = get(base, "/nvdashboard/accelerators/check")
    assert refused(r), f"nvdashboard's API without the token should be refused, got {r.status_code}"

    ws_base = base.replace("http://", "ws://")
    msgs = first_messages(f"{ws_base}/nvdashboard/cpu_resource?token={token}")
    assert msgs[0] == {"status": "connected"}, f"the CPU panel's feed should connect: {msgs}"
    assert 0 <= msgs[1]["cpu_utilization"] <= 100 and msgs[1]["memory_usage"] > 0, \
        f"the CPU panel's feed should send CPU and memory figures: {msgs[1]}"
    # Without a GPU the GPU feeds are not registered: a plain 404, no handler raising per second.
    r = get(base, "/nvdashboard/gpu_utilization", token)
    assert r.status_code == 404, f"the GPU feed should not exist without a GPU, got {r.status_code}"
    time.sleep(2)  # the CPU feed's periodic callback has run a few times by now
    logs = c.logs().decode(errors="replace")
    assert "Traceback" not in logs and "NVMLError" not in logs, f"the dashboards logged an error:\n{logs}"


def test_status_bar_metrics_report_the_servers_memory(start_jupyter):
    """Container should serve jupyter-resource-usage's metrics (the status bar's Mem figure)."""
    _, base, token = start_jupyter()
    r = get(base, "/api/metrics/v1")
    assert refused(r), f"the metrics without the token should be refused, got {r.status_code}"
    r = get(base, "/api/metrics/v1", token)
    assert r.status_code == 200, f"GET /api/metrics/v1 should be 200, got {r.status_code}"
    assert r.json()["rss"] > 10 * 2**20, f"the server's memory (rss) should be reported: {r.json()}"


def test_gpu_dashboards_and_resource_usage_load_in_a_browser(start_jupyter, browser, artifacts):  # noqa: F811
    """JupyterLab in a real browser should show the memory figure in the status bar, a
    TensorBoard launcher card and the GPU Dashboards sidebar, whose panels open without an error
    on a CPU host: the Machine Resources panel draws the CPU, the GPU panels stay empty."""
    c, base, token = start_jupyter()
    browser.get(f"{base}/lab?token={token}")
    wait = WebDriverWait(browser, 120)
    try:
        wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, ".jp-LauncherCard")))
        # jupyter-resource-usage's status bar item: "Mem: 123.45 MB".
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, ".jp-StatusBar-Widget"), "Mem:"))
        cards = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".jp-LauncherCard")]
        assert any("TensorBoard" in t for t in cards), f"the launcher should offer TensorBoard: {cards}"

        wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, ".jp-SideBar [data-id='gpu-dashboard']"))).click()
        buttons = wait.until(lambda d: {b.text: b for b in d.find_elements(By.CSS_SELECTOR, ".gpu-dashboard-container button")
                                        if b.text} or None)
        assert {"GPU Utilization", "GPU Memory", "Machine Resources"} <= set(buttons), \
            f"the GPU Dashboards sidebar should list its panels: {sorted(buttons)}"
        for name in ("Machine Resources", "GPU Utilization"):
            buttons[name].click()
            # Each opens as a tab in the main area.
            wait.until(lambda d, name=name: any(name in e.text for e in d.find_elements(
                By.CSS_SELECTOR, ".lm-DockPanel-tabBar .lm-TabBar-tab")))
        time.sleep(3)  # the panels' feeds connect (the CPU one) or fail to (the GPU ones)
        assert not browser.find_elements(By.CSS_SELECTOR, ".jp-Dialog"), \
            f"no error dialog should open: {[e.text for e in browser.find_elements(By.CSS_SELECTOR, '.jp-Dialog')]}"
    finally:
        browser.save_screenshot(str(artifacts / "notebook-gpu-dashboards.png"))
    logs = c.logs().decode(errors="replace")
    assert "Traceback" not in logs, f"opening the dashboards logged an error:\n{logs}"


# ---------------------------------------------------------------------------------------
# TensorBoard through Jupyter

@pytest.fixture
def tensorboard_jupyter(start_jupyter):
    """A JupyterLab whose /workspace/runs/amp holds the TensorBoard logs of a short train_amp.py
    run, made as the user Jupyter runs as: (container, base URL, token)."""
    c, base, token = start_jupyter()
    code, out = c.exec_run(TRAIN, user="dev", workdir="/workspace")
    assert code == 0, f"train_amp.py failed ({code}):\n{out.decode(errors='replace')[-3000:]}"
    return c, base, token


def wait_for_scalars(base, token, timeout=120):
    """The runs and scalar tags TensorBoard (through Jupyter) has loaded, once it has any."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = get(base, "/tensorboard/data/plugin/scalars/tags", token)
        if last.status_code == 200 and last.json():
            return last.json()
        time.sleep(1)
    pytest.fail(f"TensorBoard listed no scalars within {timeout}s: {last and (last.status_code, last.text[:300])}")


def test_tensorboard_is_served_through_jupyter_only_with_the_token(tensorboard_jupyter):
    """TensorBoard should answer at /tensorboard/ only with Jupyter's token, show train_amp.py's
    scalars, and listen on loopback only: no new port beyond Jupyter's."""
    c, base, token = tensorboard_jupyter
    for who, tok in (("no token", None), ("a wrong token", "wrong")):
        r = get(base, "/tensorboard/", tok)
        assert refused(r), f"/tensorboard/ with {who} should be refused, got {r.status_code} {r.headers}"
    r = get(base, "/tensorboard/", token)
    assert r.status_code == 200 and "<title>TensorBoard</title>" in r.text, \
        f"/tensorboard/ with the token should be TensorBoard's page, got {r.status_code}: {r.text[:300]}"

    tags = wait_for_scalars(base, token)
    assert "runs/amp" in tags, f"TensorBoard should list train_amp.py's run runs/amp: {list(tags)}"
    assert {"train/loss", "train/lr"} <= set(tags["runs/amp"]), f"the run's scalar tags: {tags['runs/amp']}"
    r = get(base, "/tensorboard/data/plugin/scalars/scalars", token, params={"run": "runs/amp", "tag": "train/loss"})
    assert r.status_code == 200, f"the train/loss series should load, got {r.status_code}"
    steps = [step for _, step, _ in r.json()]
    assert len(steps) >= 2, f"train/loss should have one point per logged step (--log-every 1): {r.json()}"

    outside = listeners_beyond_loopback(c)
    assert outside == {"8888"}, f"with TensorBoard running, only Jupyter should listen beyond loopback: {outside}"


def test_tensorboard_launcher_opens_the_scalars_in_a_browser(tensorboard_jupyter, browser, artifacts):  # noqa: F811
    """The launcher's TensorBoard card should be listed by the proxy, and TensorBoard's page,
    reached through Jupyter in a real browser, should chart train_amp.py's train/loss."""
    _, base, token = tensorboard_jupyter
    r = get(base, "/server-proxy/servers-info", token)
    assert r.status_code == 200, f"servers-info should be 200, got {r.status_code}"
    entries = {s["name"]: s for s in r.json()["server_processes"]}
    assert entries.get("tensorboard", {}).get("launcher_entry", {}).get("title") == "TensorBoard", \
        f"jupyter-server-proxy should offer a TensorBoard launcher entry: {r.json()}"
    wait_for_scalars(base, token)

    # Log in once through the token URL (the cookie then covers /tensorboard/ and its requests).
    browser.get(f"{base}/lab?token={token}")
    wait = WebDriverWait(browser, 120)
    wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, ".jp-LauncherCard")))
    browser.get(f"{base}/tensorboard/#timeseries")
    try:
        wait.until(lambda d: "runs/amp" in d.find_element(By.TAG_NAME, "body").text)
        # Cards below the fold are drawn lazily: filter to the loss curve, which then comes first.
        box = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input[placeholder^='Filter tags']")))
        box.send_keys("train/loss")
        # (An input's value is not part of the page's text: this is the card's title.)
        wait.until(lambda d: "train/loss" in d.find_element(By.TAG_NAME, "body").text)
    finally:
        browser.save_screenshot(str(artifacts / "notebook-tensorboard.png"))


# ---------------------------------------------------------------------------------------
# the GPU on the command line and in tmux

@pytest.mark.parametrize("command, message", [
    (["gpustat"], "NVML Shared Library Not Found"),
    (["nvitop", "--once"], "NVIDIA Management Library (NVML) not found"),
], ids=["gpustat", "nvitop"])
def test_gpu_tools_say_there_is_no_gpu_without_a_traceback(run_in_image, command, message):
    """gpustat and nvitop should be on PATH and, without a GPU, say so plainly."""
    code, logs = run_in_image(command)
    assert code not in (126, 127), f"{command[0]} should be on PATH (exit {code}):\n{logs}"
    assert message in logs, f"{command[0]} should say there is no GPU ({message!r}), printed:\n{logs}"
    assert "Traceback" not in logs, f"{command[0]} should not crash:\n{logs}"


# A stand-in for the nvidia-smi the NVIDIA Container Toolkit mounts: two GPUs, as the query
# team-gpu-status makes prints them (csv,noheader,nounits).
FAKE_NVIDIA_SMI = """#!/bin/sh
printf '0, 87, 31948, 81559\\n1, 3, 512, 81559\\n'
"""


def test_tmux_status_line_shows_the_gpu_or_no_gpu(run_in_image, tmp_path):
    """tmux's status line (as an SSH user sees it) should show each GPU's use, or 'no GPU'."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    # tmux runs the status line's #() job only for an attached client: attach one on a
    # pseudo-terminal (script), let it draw for a few seconds, and read what it drew.
    script = """
export TERM=xterm-256color
script -qfec 'stty cols 120 rows 30; tmux new-session -s t "sleep 4"' /tmp/tty >/dev/null 2>&1
# The right-aligned part, after the padding: "<team-gpu-status> | HH:MM".
tr -c '[:print:]' '\\n' < /tmp/tty | sed -n 's/.*   \\(.*\\) | [0-9][0-9]:[0-9][0-9].*/STATUS[\\1]/p' | tail -n 1
"""
    code, logs = run_in_image(["bash", "-c", script], user="dev")
    assert code == 0 and "STATUS[no GPU]" in logs, f"without a GPU the status line should say 'no GPU':\n{logs}"
    code, logs = run_in_image(["bash", "-c", 'PATH=/fake:$PATH; ' + script], user="dev",
                              volumes={str(fake): {"bind": "/fake", "mode": "ro"}})
    assert code == 0 and "STATUS[GPU0 87% 31.2/80G GPU1 3% 0.5/80G]" in logs, \
        f"with GPUs the status line should show each one's use and memory:\n{logs}"
