"""train_amp.py stopped by SIGTERM mid-epoch and resumed (the same losses as an uninterrupted
run), SIGUSR2 stack dumps, and --resume refusing a missing, corrupt or other-model checkpoint."""
import json
import re
import uuid

import pytest
from conftest import SLOWDOWN, remove_containers, wait_for_log
from train_amp_helpers import DIGITS, SUMMARY, SYNTH, read_from_container, run_to_end


@pytest.fixture(scope="module")
def volume(docker_client, module_containers):
    """A named volume mounted at /workspace (it copies the image's dev-owned /workspace), so
    successive containers share checkpoints; removed with the module."""
    vol = docker_client.volumes.create(f"train-amp-test-{uuid.uuid4().hex[:10]}")
    yield {vol.name: {"bind": "/workspace", "mode": "rw"}}
    remove_containers(module_containers)  # a volume in use cannot be removed
    vol.remove(force=True)


# --amp auto: bf16 autocast on a CPU with bf16 hardware (FP32 elsewhere, which reproduces too).
# At 32 px bf16 is bit-reproducible; at 16 px torch 2.6's oneDNN
# bf16 weight gradient of resnet18's layer4 (2x2 input -> 1x1) is not, even between two
# uninterrupted runs, which is why these tests use 32 px.
RESUME_JOB = [*DIGITS, "--epochs", "2", "--log-every", "4", "--seed", "7"]


@pytest.fixture(scope="module")
def interrupted_and_resumed(docker_client, image_ref, module_containers, volume):
    """An uninterrupted run; the same run stopped by `docker stop` mid-epoch 1; then --resume."""
    runs = {}
    code, logs, c = run_to_end(docker_client, image_ref, [
        "train_amp.py", *RESUME_JOB, "--checkpoint-dir", "whole", "--metrics", "whole.json"],
        volumes=volume)
    module_containers.append(c)
    assert code == 0, f"the uninterrupted run failed ({code}):\n{logs}"
    runs["whole"] = json.loads(read_from_container(c, "/workspace/whole.json"))

    c = docker_client.containers.run(image_ref, [
        "train_amp.py", *RESUME_JOB, "--checkpoint-dir", "split", "--metrics", "split.json"],
        detach=True, shm_size="1g", volumes=volume)
    module_containers.append(c)
    # Stop inside epoch 1 (33 steps: 1078 training digits / 32), after at least 8 steps.
    wait_for_log(c, r"epoch 1/2 step 8/\d+", timeout=300)
    c.stop(timeout=60)  # SIGTERM, like a scheduler's preemption; SIGKILL only after 60 s
    runs["stop_code"] = c.wait(timeout=60 * SLOWDOWN)["StatusCode"]
    runs["stop_logs"] = c.logs().decode(errors="replace")

    code, logs, c = run_to_end(docker_client, image_ref, [
        "train_amp.py", *RESUME_JOB, "--checkpoint-dir", "split", "--metrics", "split.json",
        "--resume"], volumes=volume)
    module_containers.append(c)
    runs["resume_code"], runs["resume_logs"] = code, logs
    raw = read_from_container(c, "/workspace/split.json")
    runs["resumed"] = json.loads(raw) if raw else None
    return runs


def test_sigterm_mid_epoch_saves_a_checkpoint_and_exits_0(interrupted_and_resumed):
    """Container stopped mid-epoch should save a checkpoint at a step boundary and exit 0."""
    r = interrupted_and_resumed
    assert r["stop_code"] == 0, f"docker stop gave exit {r['stop_code']}:\n{r['stop_logs']}"
    m = re.search(r"stopped by SIGTERM at epoch 1 step (\d+)/(\d+) .*checkpoint saved to"
                  r" split/last\.pt", r["stop_logs"])
    assert m, f"no 'stopped by SIGTERM ... checkpoint saved' line:\n{r['stop_logs']}"
    step, per_epoch = int(m.group(1)), int(m.group(2))
    assert 8 <= step < per_epoch, f"the stop was not mid-epoch: step {step}/{per_epoch}"


def test_resume_continues_at_the_saved_step_and_reproduces_the_uninterrupted_run(
        interrupted_and_resumed):
    """--resume should start at the saved step and end with the uninterrupted run's losses."""
    r = interrupted_and_resumed
    assert r["resume_code"] == 0, f"--resume exited {r['resume_code']}:\n{r['resume_logs']}"
    step = re.search(r"stopped by SIGTERM at epoch 1 step (\d+/\d+)", r["stop_logs"]).group(1)
    assert f"resumed from split/last.pt: epoch 1 step {step}" in r["resume_logs"], (
        f"resume did not start at step {step}:\n{r['resume_logs']}")
    whole, resumed = r["whole"]["history"], r["resumed"]["history"]
    assert len(whole) == len(resumed) == 2, f"expected 2 epochs each: {whole} / {resumed}"
    for a, b in zip(whole, resumed):
        for key in ("train_loss", "val_loss", "val_acc", "train_acc"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (
                f"epoch {a['epoch']} {key}: resumed {b[key]} != uninterrupted {a[key]}")


def test_sigusr2_prints_every_threads_stack_and_training_goes_on(start_container):
    """kill -USR2 should print the Python stack of every thread (where a hung job waits) to
    stderr, and the run should go on training, not stop or die."""
    c = start_container(["train_amp.py", *SYNTH, "--epochs", "100", "--log-every", "1",
                         "--progress", "lines", "--checkpoint-dir", ""])
    wait_for_log(c, r"epoch 1/100 step 2/", timeout=300)
    c.kill(signal="SIGUSR2")
    # Until the main thread's outermost frame is in: faulthandler writes the dump a line at a
    # time, and a read in the middle of it (one CI run) saw only the inner frames.
    logs = wait_for_log(c, r"(?s)Current thread 0x.*train_amp\.py\", line \d+ in <module>",
                        timeout=60)
    dump_at = logs.index("Current thread")
    assert re.search(r"File \"\S+/trainamp/main\.py\", line \d+ in main\n"
                     r"\s*File \"/usr/local/bin/train_amp\.py\", line \d+ in <module>",
                     logs[dump_at:]), (
        f"the dump should show the main thread inside train_amp.py's main:\n{logs[dump_at:][-3000:]}")
    # Steps logged after the dump: the signal did not stop or kill the run.
    after = wait_for_log(c, r"(?s)Current thread 0x.*\nepoch \d+/100 step \d+/8 .*\n"
                            r".*epoch \d+/100 step \d+/8 ", timeout=120)
    c.reload()
    assert c.status == "running", f"the run stopped after SIGUSR2:\n{after[-3000:]}"


def test_resume_without_a_checkpoint_is_an_error_not_a_fresh_start(run_in_image):
    """--resume with nothing to resume from should exit 2 instead of training from scratch."""
    code, logs = run_in_image(["train_amp.py", *SYNTH, "--checkpoint-dir", "none", "--resume"])
    assert code == 2, f"exited {code}, expected 2:\n{logs}"
    assert "train_amp.py: error: --resume: no checkpoint at none/last.pt" in logs, logs
    assert not SUMMARY.search(logs), f"it trained anyway:\n{logs}"


def test_resume_refuses_a_truncated_checkpoint(run_in_image, interrupted_and_resumed, volume):
    """--resume from a truncated (corrupt) checkpoint should exit 2 and say it is corrupt."""
    code, logs = run_in_image(["bash", "-c", "mkdir -p bad && head -c 200000 whole/last.pt"
                               " > bad/last.pt && exec train_amp.py "
                               + " ".join(RESUME_JOB) + " --checkpoint-dir bad --resume"],
                              volumes=volume)
    assert code == 2, f"exited {code}, expected 2:\n{logs}"
    assert re.search(r"train_amp\.py: error: --resume: bad/last\.pt is corrupt", logs), logs
    assert not SUMMARY.search(logs), f"it trained anyway:\n{logs}"


def test_resume_refuses_a_checkpoint_of_another_model(run_in_image, interrupted_and_resumed,
                                                      volume):
    """--resume with a different --model should exit 2 naming both settings."""
    job = [a if a != "resnet18" else "resnet34" for a in RESUME_JOB]
    code, logs = run_in_image(["train_amp.py", *job, "--checkpoint-dir", "whole", "--resume"],
                              volumes=volume)
    assert code == 2, f"exited {code}, expected 2:\n{logs}"
    assert "--model resnet18 (now resnet34)" in logs, f"mismatch not explained:\n{logs}"
    assert not SUMMARY.search(logs), f"it trained anyway:\n{logs}"
