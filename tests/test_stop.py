"""`docker stop` with work running outside the services: a train_amp run started in
tmux, as the README advises for long jobs, or in a JupyterLab terminal, gets SIGTERM and time to
save its checkpoint before the container ends, and the log says what was running and whether it
ended in time."""
import json
import re
import time
import uuid

import pytest
import requests
import websocket
from conftest import READY, SLOWDOWN, wait_for_log, wait_until
from train_amp_helpers import CKPT_STEP, JOB_800, MAKE_FOLDER_800

# Small for 2 CPU cores (tests/train_amp_helpers.py's SYNTH), but 80 steps an epoch and 5 epochs:
# it is still in its first epoch when the container is stopped.
TRAIN = ("train_amp.py --model resnet18 --data synthetic --synthetic-size 2560 --num-classes 10"
         " --image-size 32 --batch-size 32 --epochs 5 --log-every 1")
CKPT_PROBE = ("import torch; c = torch.load('/workspace/checkpoints/last.pt', weights_only=False);"
              " print('CKPT', c['epoch'], c['step_in_epoch'])")


@pytest.fixture
def workspace_volume(docker_client):
    """A fresh named volume for /workspace (it takes the image's dev-owned folder), removed after
    the test's containers (list it before start_container or start_jupyter)."""
    vol = docker_client.volumes.create(f"test-stop-{uuid.uuid4().hex[:10]}")
    yield {vol.name: {"bind": "/workspace", "mode": "rw"}}
    vol.remove(force=True)


def _start_in_tmux(c, _base, _token, command):
    rc, out = c.exec_run(["tmux", "new-session", "-d", "-s", "main", command], user="dev",
                         workdir="/workspace")
    assert rc == 0, f"tmux did not start the job: {out!r}"


def _start_in_jupyter_terminal(_c, base, token, command):
    r = requests.post(f"{base}/api/terminals", headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code == 200, f"creating a terminal should give 200, got {r.status_code}"
    url = base.replace("http://", "ws://") + f"/terminals/websocket/{r.json()['name']}?token={token}"
    ws = websocket.create_connection(url, timeout=30)
    ws.send(json.dumps(["stdin", f"cd /workspace && {command}\r"]))
    ws.close()  # the terminal and its job go on without a browser, as after closing the tab


@pytest.mark.parametrize("start_job", [_start_in_tmux, _start_in_jupyter_terminal],
                         ids=["tmux", "jupyter-terminal"])
def test_docker_stop_lets_a_training_job_save_its_checkpoint(workspace_volume, start_jupyter,
                                                             run_in_image, start_job):
    """`docker stop` should SIGTERM a train_amp run in a tmux session or a JupyterLab terminal
    and wait for it: the run saves a checkpoint at the step it reached, the container exits 0,
    and the log names the job and says that it ended in time."""
    c, base, token = start_jupyter(volumes=workspace_volume)
    start_job(c, base, token, f"{TRAIN} > train.log 2>&1")

    def train_log():
        return c.exec_run(["cat", "/workspace/train.log"]).output.decode(errors="replace")
    wait_until(lambda: re.search(r"epoch 1/5 step [3-9]/80", train_log()), 240,
               lambda: f"the job did not reach step 3:\n{train_log()}")

    # The time a step and a save take here, stretched on a busy machine (a loaded run: a step of
    # 8 s and the save did not fit in 10): what is tested is that the job saves, not how fast.
    c.stop(timeout=round(10 * SLOWDOWN))
    c.reload()
    logs = c.logs().decode(errors="replace")
    assert c.attrs["State"]["ExitCode"] == 0, f"docker stop should end with 0:\n{logs[-3000:]}"

    _, out = run_in_image(["bash", "-c", f"cat train.log; python -c \"{CKPT_PROBE}\""],
                          volumes=workspace_volume)
    stopped = re.search(r"stopped by SIGTERM at epoch 1 step (\d+)/80 .*checkpoint saved", out)
    assert stopped, f"train_amp should have saved on SIGTERM:\n{out[-3000:]}"
    saved = re.search(r"^CKPT (\d+) (\d+)$", out, re.MULTILINE)
    assert saved and saved.groups() == ("0", stopped.group(1)), (
        f"the checkpoint should hold epoch 0 (the first) step {stopped.group(1)}, holds "
        f"{saved and saved.groups()}:\n{out[-2000:]}")
    assert re.search(r"^INFO .*Stopping jobs still running.*\n(INFO .*\n)*INFO .*train_amp\.py", logs,
                     re.MULTILINE), f"the log should name the job it stopped:\n{logs[-3000:]}"
    assert re.search(r"^INFO .*The jobs ended in time", logs, re.MULTILINE), \
        f"the log should say the job ended in time:\n{logs[-3000:]}"


def test_docker_stop_names_a_job_that_does_not_end_in_time(start_container):
    """`docker stop -t 5` with STOP_TIMEOUT=5 should give a job that ignores SIGTERM 2 s, then
    name it in a WARN with the fix, and still stop the services cleanly (exit 0, no SIGKILL)."""
    c = start_container(environment={"STOP_TIMEOUT": "5"})
    wait_for_log(c, READY, timeout=120)
    c.exec_run(["bash", "-c", "trap '' TERM; exec sleep 300"], user="dev", detach=True)
    wait_until(lambda: c.exec_run(["pgrep", "-x", "sleep"]).exit_code == 0, 30, "the job did not start")
    c.stop(timeout=5)
    c.reload()
    logs = c.logs().decode(errors="replace")
    assert c.attrs["State"]["ExitCode"] == 0, f"the services should still stop cleanly:\n{logs[-3000:]}"
    assert re.search(r"^WARN .*Jobs still running after 2 s are killed with the container: \d+ sleep 300\."
                     r" Fix: -e STOP_TIMEOUT=", logs, re.MULTILINE), \
        f"a WARN should name the job and the fix:\n{logs[-3000:]}"


def test_docker_stop_saves_a_tmux_job_with_dataloader_workers_piped_into_tee(workspace_volume,
                                                                          start_container,
                                                                          run_in_image):
    """The everyday long job: `train_amp.py --data FOLDER ... 2>&1 | tee train.log` in tmux, its
    JPEGs decoded by DataLoader workers. `docker stop` signals every process, the workers and
    tee included: the run should still save at the step it reached (its workers ignore the
    signal, its output survives the dead pipe), and the log should say it ended in time."""
    stop_s = round(10 * SLOWDOWN)  # as above: a busy machine's step and save get longer
    c = start_container(volumes=workspace_volume, environment={"STOP_TIMEOUT": str(stop_s)})
    wait_for_log(c, READY, timeout=120)
    rc, out = c.exec_run(["bash", "-c", MAKE_FOLDER_800], user="dev", workdir="/workspace")
    assert rc == 0, f"the data folder was not made: {out!r}"
    _start_in_tmux(c, None, None, f"{JOB_800} 2>&1 | tee train.log")

    def train_log():
        return c.exec_run(["cat", "/workspace/train.log"]).output.decode(errors="replace")
    wait_until(lambda: re.search(r"step ([3-9]|[1-9][0-9])/100", train_log()), 240,
               lambda: f"the job did not reach step 3:\n{train_log()}")

    started = time.monotonic()
    c.stop(timeout=stop_s)
    took = time.monotonic() - started
    c.reload()
    logs = c.logs().decode(errors="replace")
    assert c.attrs["State"]["ExitCode"] == 0, f"docker stop should end with 0:\n{logs[-3000:]}"
    print(f"\ndocker stop took {took:.1f} s")
    _, out = run_in_image(["bash", "-c", f"cd /workspace && {CKPT_STEP}"],
                          volumes=workspace_volume)
    saved = re.search(r"^CKPT (\d+) (\d+)$", out, re.MULTILINE)
    assert saved and saved[1] == "0" and int(saved[2]) >= 3, (
        f"the stop should have saved epoch 0 at the step it reached (>= 3), found "
        f"{saved and saved.groups()}:\n{out[-2000:]}\n{train_log_text(workspace_volume, run_in_image)}")
    assert re.search(r"^INFO .*The jobs ended in time", logs, re.MULTILINE), \
        f"the log should say the job ended in time:\n{logs[-3000:]}"


def train_log_text(volume, run_in_image):
    return run_in_image(["cat", "/workspace/train.log"], volumes=volume)[1][-3000:]


def test_docker_stop_gives_jobs_stop_timeout_less_the_services_and_logs_how_long(start_container):
    """STOP_TIMEOUT=9 (make run passes it with --stop-timeout 9): a job that needs 2 s to save
    should get up to 6 s, and the log should say both numbers."""
    c = start_container(environment={"STOP_TIMEOUT": "9"})
    wait_for_log(c, READY, timeout=120)
    saver = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep(2), sys.exit(0))); time.sleep(300)"
    c.exec_run(["python3", "-c", saver], user="dev", detach=True)
    wait_until(lambda: c.exec_run(["pgrep", "-f", "signal.SIGTERM"]).exit_code == 0, 30, "the job did not start")
    c.stop(timeout=9)
    logs = c.logs().decode(errors="replace")
    assert re.search(r"^INFO .*up to 6 s to end: STOP_TIMEOUT=9 less 3 s for the services", logs, re.MULTILINE), logs[-2000:]
    assert re.search(r"^INFO .*The jobs ended in time \([23] s of their 6 s\)", logs, re.MULTILINE), logs[-2000:]


def test_stop_timeout_below_4_is_warned_about_truthfully(start_container):
    """STOP_TIMEOUT=0 (what make run also hands docker as --stop-timeout): the start warns that
    docker stop then kills jobs before they can checkpoint, not that 10 s are "used"."""
    c = start_container(environment={"STOP_TIMEOUT": "0"})
    logs = wait_for_log(c, r"STOP_TIMEOUT='?0", timeout=120)
    line = next((ln for ln in logs.splitlines() if re.search(r"STOP_TIMEOUT='?0", ln)), "")
    assert line.startswith("WARN") and "before they can save a checkpoint" in line, logs[-2000:]
    assert "using 10" not in line, line
