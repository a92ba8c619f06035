"""train_amp.py, run inside fresh containers of the image on CPU: the command line,
AMP step order, checkpoints/SIGTERM/resume, --compare, data sources and two-node torchrun."""
import io
import json
import pathlib
import re
import shlex
import tarfile
import time
import uuid

import pytest
from conftest import ROOT, remove_containers, wait_for_log

import docker

# Small enough for 2 CPU cores: resnet18 on 32-pixel images, a few steps. Each run still
# goes through the whole script: data, model, AMP, DDP when under torchrun, checkpoints.
SYNTH = ["--model", "resnet18", "--data", "synthetic", "--synthetic-size", "256",
         "--num-classes", "10", "--image-size", "32", "--batch-size", "32"]
DIGITS = ["--model", "resnet18", "--data", "digits", "--image-size", "32", "--batch-size", "32",
          "--lr", "0.05"]
# The entrypoint's own log lines (`LEVEL [hh:mm:ss] message`); the rest is the command's output.
ENTRYPOINT_LOG = re.compile(r"^(INFO|WARN|ERROR)\s+\[\d\d:\d\d:\d\d\] ")
SUMMARY = re.compile(r"^epoch (\d+)/(\d+): train_loss [\d.]+ train_acc [\d.]+%", re.MULTILINE)


def command_output(text):
    """The lines the command printed, without the entrypoint's log lines."""
    return [ln for ln in text.splitlines() if ln.strip() and not ENTRYPOINT_LOG.match(ln)]


def read_from_container(container, path):
    """A file's bytes from a (possibly exited) container; None when it does not exist."""
    try:
        stream, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.next()
        return tar.extractfile(member).read()


def run_to_end(docker_client, image_ref, command, timeout=600, **kwargs):
    """For module-scoped fixtures: run a container to completion, return (code, logs, container).
    The caller removes the container."""
    c = docker_client.containers.run(image_ref, command, detach=True, shm_size="1g", **kwargs)
    try:
        code = c.wait(timeout=timeout)["StatusCode"]
    except Exception:
        remove_containers([c])  # a timed-out run must not outlive the test
        raise
    return code, c.logs().decode(errors="replace"), c


@pytest.fixture(scope="module")
def module_containers(docker_client):
    """Containers started by module-scoped fixtures; all force-removed after the module."""
    started = []
    yield started
    remove_containers(started)


@pytest.fixture(scope="module")
def volume(docker_client, module_containers):
    """A named volume mounted at /workspace (it copies the image's dev-owned /workspace), so
    successive containers share checkpoints; removed with the module."""
    vol = docker_client.volumes.create(f"train-amp-test-{uuid.uuid4().hex[:10]}")
    yield {vol.name: {"bind": "/workspace", "mode": "rw"}}
    remove_containers(module_containers)  # a volume in use cannot be removed
    vol.remove(force=True)


# ---------------------------------------------------------------------------------------
# command line

def test_help_documents_every_option(run_in_image):
    """train_amp.py should be on PATH and --help should document every option and data source."""
    code, logs = run_in_image(["train_amp.py", "--help"])
    assert code == 0, f"--help exited {code}:\n{logs}"
    for option in ("--model", "--data", "--epochs", "--steps", "--batch-size", "--lr", "--amp",
                   "--channels-last", "--compile", "--grad-clip", "--num-workers",
                   "--checkpoint-dir", "--resume", "--seed", "--benchmark", "--compare",
                   "--tensorboard", "digits", "synthetic", "ImageFolder", "WebDataset", "KEY.cls", "torchrun",
                   "--overwrite", "--skip-bad-images", "exit status"):
        assert option in logs, f"--help does not mention {option}:\n{logs}"


@pytest.mark.parametrize("args, env, fix", [
    (["--model", "resnet5O"], {}, "did you mean resnet50"),
    (["--data", "/no/such/folder"], {}, "give an ImageFolder path"),
    (["--batch-size", "0"], {}, "--batch-size 64"),
    (["--amp", "fp16"], {}, "on CPU use --amp bf16"),
    # Inductor compiles with $CXX: pointing it at nothing is "no compiler" without breaking
    # the image for other tests.
    (["--compile"], {"CXX": "/nonexistent/g++"}, "install g++"),
    (["--cuda-graphs"], {}, "drop --cuda-graphs"),
    (["--decode-cpu-share", "1.5"], {}, "--decode-cpu-share 0.3"),
    (["--auto-resume", "--resume", "other/last.pt"], {}, "without --resume PATH or --overwrite"),
], ids=["unknown-model", "missing-data-path", "batch-size-0", "fp16-on-cpu",
        "compile-without-compiler", "cuda-graphs-without-gpu", "cpu-share-above-1",
        "auto-resume-with-resume"])
def test_bad_input_exits_2_with_a_one_line_fix(start_container, args, env, fix):
    """Container should refuse bad input at once: exit 2 and one stderr line naming the fix."""
    c = start_container(["train_amp.py", *args], environment=env)
    code = c.wait(timeout=120)["StatusCode"]
    err = command_output(c.logs(stdout=False, stderr=True).decode(errors="replace"))
    out = command_output(c.logs(stdout=True, stderr=False).decode(errors="replace"))
    assert code == 2, f"{args} exited {code}, expected 2:\n{err}"
    assert len(err) == 1 and err[0].startswith("train_amp.py: error: "), (
        f"{args} should print exactly one 'train_amp.py: error:' line, got:\n" + "\n".join(err))
    assert fix in err[0], f"{args}: the error does not give the fix {fix!r}: {err[0]}"
    assert not out, f"{args} should stop before any training output, printed:\n{out}"


@pytest.mark.parametrize("args, rule", [
    (["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
    (["--lr", "-1"], "argument --lr: must be a finite number > 0, got -1"),
    (["--weight-decay", "inf"], "argument --weight-decay: must be a finite number >= 0"),
    (["--grad-clip", "-0.5"], "argument --grad-clip: must be a finite number >= 0"),
    (["--save-every-minutes", "nan"], "argument --save-every-minutes: must be a finite number >= 0"),
], ids=["lr-nan", "lr-negative", "weight-decay-inf", "grad-clip-negative", "save-minutes-nan"])
def test_non_finite_or_out_of_range_numbers_exit_2_before_training(start_container, args, rule):
    """train_amp.py should reject NaN/inf/out-of-range numeric options at parse time: exit 2."""
    c = start_container(["train_amp.py", *SYNTH, "--steps", "1", *args])
    code = c.wait(timeout=120)["StatusCode"]
    err = command_output(c.logs(stdout=False, stderr=True).decode(errors="replace"))
    out = command_output(c.logs(stdout=True, stderr=False).decode(errors="replace"))
    assert code == 2, f"{args} exited {code}, expected 2:\n" + "\n".join(err + out)
    assert err and err[-1].startswith(f"train_amp.py: error: {rule}"), (
        f"{args}: expected the error {rule!r}, got:\n" + "\n".join(err))
    assert "(e.g. --" in err[-1], f"{args}: the error gives no example value: {err[-1]}"
    assert not out, f"{args} should stop before any training output, printed:\n{out}"


# ---------------------------------------------------------------------------------------
# a short synthetic run: logging, AMP auto on CPU, checkpoint contents, TensorBoard

INSPECT_CHECKPOINT = r"""
import json, torch
c = torch.load("ck/last.pt", map_location="cpu", weights_only=True)
floats = [t.dtype for t in c["model"].values() if t.is_floating_point()]
print("CKPT " + json.dumps({
    "keys": sorted(c), "epoch": c["epoch"], "step_in_epoch": c["step_in_epoch"],
    "global_step": c["global_step"], "rng": sorted(c["rng"]),
    "optimizer_has_momentum": bool(c["optimizer"]["state"]),
    "scheduler_last_epoch": c["scheduler"]["last_epoch"],
    "weights_fp32": bool(floats) and all(d == torch.float32 for d in floats)}))
"""


@pytest.fixture(scope="module")
def synthetic_run(docker_client, image_ref, module_containers):
    """Two epochs of 8 steps on synthetic data with TensorBoard; then the checkpoint inspected."""
    script = (f"train_amp.py {' '.join(SYNTH)} --epochs 2 --log-every 4 --checkpoint-dir ck"
              " --tensorboard tb --metrics metrics.json"
              f" && python3 - <<'EOF'\n{INSPECT_CHECKPOINT}\nEOF\n"
              "ls tb | sed 's/^/TB /'")
    code, logs, c = run_to_end(docker_client, image_ref, ["bash", "-c", script])
    module_containers.append(c)
    assert code == 0, f"the synthetic run failed ({code}):\n{logs}"
    ckpt = json.loads(re.search(r"^CKPT (.*)$", logs, re.MULTILINE).group(1))
    return logs, ckpt


def test_training_prints_one_summary_line_per_epoch(synthetic_run):
    """Container should print exactly one summary line per epoch, with loss, speed and memory."""
    logs, _ = synthetic_run
    summaries = SUMMARY.findall(logs)
    assert summaries == [("1", "2"), ("2", "2")], f"expected epoch 1/2 and 2/2 summaries:\n{logs}"
    for line in re.findall(r"^epoch \d+/\d+: .*$", logs, re.MULTILINE):
        assert "img/s" in line and "peak mem" in line, f"summary lacks speed/memory: {line}"


def cpu_computes_bf16(image):
    """This host's CPU has bf16 hardware (AVX512-BF16 or AMX) that the image's oneDNN may use:
    the flags of /proc/cpuinfo, as train_amp cannot see them, and no ISA cap in the image."""
    flags = set(pathlib.Path("/proc/cpuinfo").read_text().split())
    capped = any(e.startswith(("ONEDNN_MAX_CPU_ISA=", "DNNL_MAX_CPU_ISA="))
                 for e in image.attrs["Config"]["Env"] or [])
    return bool(flags & {"avx512_bf16", "amx_bf16"}) and not capped


def test_amp_auto_on_cpu_is_bf16_only_with_bf16_hardware_and_no_grad_scaler(synthetic_run, image):
    """Container should resolve --amp auto on CPU to bf16 where the CPU computes it, else to
    FP32, say why on the start line, and leave the GradScaler off."""
    logs, _ = synthetic_run
    want = ("amp=bf16 (auto: this CPU has" if cpu_computes_bf16(image)
            else "amp=off (auto: ")
    line = next((ln for ln in logs.splitlines() if " amp=" in ln and "grad_scaler=" in ln), "")
    assert want in line and "grad_scaler=False" in line, f"expected {want!r}:\n{logs}"


def test_checkpoint_holds_full_training_state_with_fp32_weights(synthetic_run):
    """Checkpoint should hold model, optimizer, scaler, scheduler, position and RNG; FP32 weights."""
    _, ckpt = synthetic_run
    for key in ("model", "optimizer", "scaler", "scheduler", "epoch", "step_in_epoch",
                "global_step", "rng"):
        assert key in ckpt["keys"], f"checkpoint lacks {key!r}: {ckpt['keys']}"
    assert (ckpt["epoch"], ckpt["step_in_epoch"], ckpt["global_step"]) == (2, 0, 16), (
        f"after 2 epochs of 8 steps the checkpoint should point at epoch 2, step 0: {ckpt}")
    assert ckpt["scheduler_last_epoch"] == 16, f"scheduler not saved at step 16: {ckpt}"
    assert ckpt["optimizer_has_momentum"], "optimizer state (momentum buffers) not saved"
    assert {"python", "numpy", "torch"} <= set(ckpt["rng"]), f"RNG state incomplete: {ckpt}"
    assert ckpt["weights_fp32"], "weights should stay FP32 under autocast (no .half())"


def test_tensorboard_logging_writes_an_event_file(synthetic_run):
    """Container should write a TensorBoard event file when --tensorboard DIR is given."""
    logs, _ = synthetic_run
    assert re.search(r"^TB events\.out\.tfevents\.", logs, re.MULTILINE), f"no event file:\n{logs}"


def test_progress_bar_shows_loss_images_per_second_and_memory(run_in_image):
    """Container on a TTY should draw a tqdm bar with loss, images/s and memory."""
    code, logs = run_in_image(["train_amp.py", *SYNTH, "--steps", "4", "--log-every", "2",
                               "--checkpoint-dir", ""], tty=True)
    assert code == 0, f"exited {code}:\n{logs}"
    assert re.search(r"\d+/4 \[[^\]]*loss=\d+\.\d+ img/s=\d+ mem=n/a\(cpu\)", logs), (
        f"no tqdm bar with loss/img/s/mem:\n{logs}")


# ---------------------------------------------------------------------------------------
# the AMP step itself

STEP_ORDER = r"""
import sys, json, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp
calls = []
class Spy(torch.amp.GradScaler):
    def scale(self, loss):
        calls.append("scale"); return super().scale(loss)
    def unscale_(self, opt):
        calls.append("unscale_"); return super().unscale_(opt)
    def step(self, opt, *a, **k):
        calls.append("step"); return super().step(opt, *a, **k)
    def update(self, *a, **k):
        calls.append("update"); return super().update(*a, **k)
real_clip = torch.nn.utils.clip_grad_norm_
def clip(params, max_norm, *a, **k):
    calls.append(f"clip_grad_norm_({max_norm})"); return real_clip(params, max_norm, *a, **k)
torch.nn.utils.clip_grad_norm_ = clip
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
model[1].weight.register_hook(lambda g: calls.append("backward"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = Spy("cpu", init_scale=2.0 ** 16)  # enabled: the fp16 path
before = model[1].weight.detach().clone()
train_amp.train_step(model, torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0]), opt, scaler,
                     torch.bfloat16, 1.0, "cpu")
print("ORDER " + json.dumps({"calls": calls,
                             "dtype": str(model[1].weight.dtype),
                             "moved": not torch.equal(before, model[1].weight.detach())}))
"""


def test_scaled_step_runs_scale_backward_unscale_clip_step_update_in_order(run_in_image):
    """train_step should scale, backward, unscale_, clip, step, update in that order, FP32 weights."""
    code, logs = run_in_image(["python3", "-c", STEP_ORDER])
    assert code == 0, f"exited {code}:\n{logs}"
    got = json.loads(re.search(r"^ORDER (.*)$", logs, re.MULTILINE).group(1))
    assert got["calls"] == ["scale", "backward", "unscale_", "clip_grad_norm_(1.0)", "step",
                            "update"], f"wrong AMP step order: {got['calls']}"
    assert got["dtype"] == "torch.float32", f"weights should stay FP32, are {got['dtype']}"
    assert got["moved"], "the optimizer step did not change the weights"


# ---------------------------------------------------------------------------------------
# SIGTERM, resume, bad checkpoints

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
    runs["stop_code"] = c.wait(timeout=60)["StatusCode"]
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


# ---------------------------------------------------------------------------------------
# never lose or corrupt a checkpoint

# Runs one train_amp.py command as step LABEL of a script: "RC LABEL n", then its stdout and
# stderr prefixed "OUT LABEL " / "ERR LABEL ", then "SHA LABEL <sha256 of ck/last.pt or ->".
STEP_FN = r"""
step() {
  label=$1; shift
  "$@" > /tmp/out 2> /tmp/err; echo "RC $label $?"
  sed "s/^/OUT $label /" /tmp/out; sed "s/^/ERR $label /" /tmp/err
  echo "SHA $label $( (sha256sum ck/last.pt 2>/dev/null || echo -) | cut -d' ' -f1)"
}
"""
# One line "CKPT {json}": the global step of checkpoint $1 and whether all its weights are
# finite; "CKPT null" when there is no such file.
INSPECT_LAST = r"""python3 - "$1" <<'EOF'
import json, os, sys, torch
if not os.path.exists(sys.argv[1]):
    sys.exit(print("CKPT null"))
c = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
print("CKPT " + json.dumps({"global_step": c["global_step"], "finite": all(
    bool(t.isfinite().all()) for t in c["model"].values() if t.is_floating_point())}))
EOF"""


def steps_of(logs):
    """{label: {"rc": int, "out": [lines], "err": [lines], "sha": str}} from STEP_FN output."""
    runs = {}
    for kind, label, rest in re.findall(r"^(RC|OUT|ERR|SHA) (\S+) ?(.*)$", logs, re.MULTILINE):
        r = runs.setdefault(label, {"out": [], "err": []})
        if kind == "RC":
            r["rc"] = int(rest)
        elif kind == "SHA":
            r["sha"] = rest
        else:
            r[kind.lower()].append(rest)
    return runs


def run_steps(docker_client, image_ref, module_containers, lines, what):
    """Run a script of `step NAME cmd` lines ending in INSPECT_LAST in one container:
    -> (steps_of its logs, the inspected checkpoint's summary)."""
    code, logs, c = run_to_end(docker_client, image_ref, ["bash", "-c", "\n".join(lines)])
    module_containers.append(c)
    assert code == 0, f"the {what} script failed ({code}):\n{logs}"
    return steps_of(logs), json.loads(re.search(r"^CKPT (.*)$", logs, re.MULTILINE).group(1))


def show(run):
    return "\n".join(["stdout:", *run["out"], "stderr:", *run["err"]])


@pytest.fixture(scope="module")
def checkpoint_dir_runs(docker_client, image_ref, module_containers):
    """In one container: a run into ck; the same run again (no flag); --resume; --overwrite;
    then --compare with the same --checkpoint-dir."""
    job = ["train_amp.py", *SYNTH, "--checkpoint-dir", "ck", "--log-every", "100"]
    lines = [STEP_FN,
             "step first " + shlex.join(job + ["--epochs", "1"]),
             "step again " + shlex.join(job + ["--epochs", "1"]),
             "step resume " + shlex.join(job + ["--epochs", "2", "--resume"]),
             "step overwrite " + shlex.join(job + ["--steps", "2", "--overwrite"]),
             "step compare " + shlex.join(job + ["--steps", "2", "--compare", "--out", "cmp"]),
             'set -- ck/last.pt', INSPECT_LAST]
    runs, runs["final"] = run_steps(docker_client, image_ref, module_containers, lines, "checkpoint-dir")
    return runs


def test_a_new_run_refuses_to_replace_an_earlier_runs_checkpoint(checkpoint_dir_runs):
    """train_amp.py should refuse (exit 2, before training) a new run over an existing last.pt."""
    first, again = checkpoint_dir_runs["first"], checkpoint_dir_runs["again"]
    assert first["rc"] == 0 and first["sha"] != "-", f"the first run failed:\n{show(first)}"
    assert again["rc"] == 2, f"a second run into ck exited {again['rc']}, not 2:\n{show(again)}"
    assert len(again["err"]) == 1, f"expected one error line:\n{show(again)}"
    err = again["err"][0]
    for part in ("train_amp.py: error: ck/last.pt already holds a run", "global step 8",
                 "--resume", "another --checkpoint-dir", "--overwrite"):
        assert part in err, f"the refusal lacks {part!r}: {err}"
    assert not again["out"], f"it started training before refusing:\n{show(again)}"
    assert again["sha"] == first["sha"], "the refused run changed ck/last.pt"


def test_resume_and_overwrite_may_reuse_a_checkpoint_dir(checkpoint_dir_runs):
    """--resume should continue an existing last.pt and --overwrite should replace it."""
    resume, over = checkpoint_dir_runs["resume"], checkpoint_dir_runs["overwrite"]
    assert resume["rc"] == 0, f"--resume exited {resume['rc']}:\n{show(resume)}"
    assert any("resumed from ck/last.pt" in ln and "(global step 8/16)" in ln
               for ln in resume["out"]), f"--resume did not continue at step 8:\n{show(resume)}"
    assert any(ln.startswith("epoch 2/2: ") for ln in resume["out"]), show(resume)
    assert over["rc"] == 0, f"--overwrite exited {over['rc']}:\n{show(over)}"
    assert over["sha"] != resume["sha"], "--overwrite did not replace ck/last.pt"
    assert (checkpoint_dir_runs["final"] or {}).get("global_step") == 2, (
        f"ck/last.pt should be the --overwrite run's (global step 2): {checkpoint_dir_runs}")


def test_compare_runs_beside_an_existing_checkpoint_and_leaves_it_alone(checkpoint_dir_runs):
    """--compare writes no checkpoints: an existing last.pt should neither stop nor change."""
    over, compare = checkpoint_dir_runs["overwrite"], checkpoint_dir_runs["compare"]
    assert compare["rc"] == 0, f"--compare exited {compare['rc']}:\n{show(compare)}"
    assert any(ln.startswith("| images/s |") for ln in compare["out"]), show(compare)
    assert compare["sha"] == over["sha"], "--compare changed ck/last.pt"


def test_auto_resume_starts_fresh_then_continues_and_never_replaces_another_run(
        docker_client, image_ref, module_containers):
    """One --auto-resume command line should start fresh in an empty --checkpoint-dir, continue
    its own last.pt after that, do nothing once done, and refuse (exit 2) a last.pt made with
    other settings without changing it."""
    job = ["train_amp.py", *SYNTH, "--log-every", "100", "--checkpoint-dir", "ck", "--auto-resume"]
    lines = [STEP_FN,
             "step fresh " + shlex.join(job + ["--epochs", "1"]),
             "step more " + shlex.join(job + ["--epochs", "2"]),
             "step done " + shlex.join(job + ["--epochs", "2"]),
             "step other " + shlex.join(job + ["--epochs", "2", "--lr", "0.5"]),
             "set -- ck/last.pt", INSPECT_LAST]
    runs, _ = run_steps(docker_client, image_ref, module_containers, lines, "auto-resume")
    fresh, more, done, other = (runs[k] for k in ("fresh", "more", "done", "other"))
    assert fresh["rc"] == 0 and "--auto-resume: no ck/last.pt yet: a fresh run" in fresh["out"], (
        show(fresh))
    assert more["rc"] == 0 and any("resumed from ck/last.pt" in ln and "(global step 8/16)" in ln
                                   for ln in more["out"]), f"did not continue:\n{show(more)}"
    assert done["rc"] == 0 and any("already finished this job" in ln for ln in done["out"]), (
        show(done))
    assert other["rc"] == 2 and "made with different settings" in "\n".join(other["err"]), (
        f"a last.pt of other settings should be refused:\n{show(other)}")
    assert other["sha"] == done["sha"] == more["sha"], "a refused or finished run changed last.pt"


def test_resume_from_another_path_never_replaces_the_checkpoint_dirs_run(
        docker_client, image_ref, module_containers):
    """--resume OTHER into a --checkpoint-dir that holds another run should exit 2 and leave
    its last.pt as it was; with --overwrite it continues OTHER there."""
    job = ["train_amp.py", *SYNTH, "--log-every", "100"]
    lines = [STEP_FN,
             "step mine " + shlex.join(job + ["--steps", "2", "--checkpoint-dir", "ck"]),
             "step other " + shlex.join(job + ["--epochs", "1", "--checkpoint-dir", "other"]),
             "step refused " + shlex.join(job + ["--epochs", "2", "--checkpoint-dir", "ck",
                                                 "--resume", "other/last.pt"]),
             "step overwrite " + shlex.join(job + ["--epochs", "2", "--checkpoint-dir", "ck",
                                                   "--resume", "other/last.pt", "--overwrite"]),
             "set -- ck/last.pt", INSPECT_LAST]
    runs, final = run_steps(docker_client, image_ref, module_containers, lines, "resume-elsewhere")
    mine, refused, over = runs["mine"], runs["refused"], runs["overwrite"]
    assert mine["rc"] == 0 and runs["other"]["rc"] == 0, f"set-up failed:\n{show(mine)}\n{show(runs['other'])}"
    assert refused["rc"] == 2, f"--resume other/last.pt into ck exited {refused['rc']}, not 2:\n{show(refused)}"
    assert len(refused["err"]) == 1 and all(part in refused["err"][0] for part in (
        "train_amp.py: error: ck/last.pt already holds a run", "--resume other/last.pt",
        "another --checkpoint-dir", "--overwrite")), f"not the one-line refusal:\n{show(refused)}"
    assert refused["sha"] == mine["sha"] and not refused["out"], f"ck/last.pt was touched:\n{show(refused)}"
    assert over["rc"] == 0 and over["sha"] != mine["sha"], f"--overwrite did not continue into ck:\n{show(over)}"
    assert (final or {}).get("global_step") == 16, f"ck/last.pt should be other's run continued to step 16: {final}"


@pytest.fixture(scope="module")
def diverging_runs(docker_client, image_ref, module_containers):
    """A good run into ck, then a run that diverges (--lr 1e6, no clipping) with --overwrite
    over it; then a diverging run that saves every step into ck2."""
    bad = ["train_amp.py", *SYNTH, "--lr", "1e6", "--grad-clip", "0", "--log-every", "100"]
    lines = [STEP_FN,
             "step good " + shlex.join(["train_amp.py", *SYNTH, "--steps", "4", "--checkpoint-dir",
                                      "ck"]),
             "step diverge " + shlex.join(bad + ["--checkpoint-dir", "ck", "--overwrite"]),
             "step every " + shlex.join(bad + ["--checkpoint-dir", "ck2", "--save-every", "1"]),
             "set -- ck2/last.pt", INSPECT_LAST]
    runs, runs["ck2"] = run_steps(docker_client, image_ref, module_containers, lines, "divergence")
    return runs


def test_a_diverging_run_exits_3_and_leaves_the_good_checkpoint_unchanged(diverging_runs):
    """train_amp.py should stop a run whose loss stays NaN: exit 3, the fix, last.pt untouched."""
    good, bad = diverging_runs["good"], diverging_runs["diverge"]
    assert good["rc"] == 0, f"the good run failed:\n{show(good)}"
    assert bad["rc"] == 3, f"the diverging run exited {bad['rc']}, not 3:\n{show(bad)}"
    err = bad["err"][-1] if bad["err"] else ""
    assert re.search(r"training diverged: the loss has been (nan|inf|-inf) since global step \d+",
                     err), f"the error does not name the loss and step: {err}"
    for fix in ("lower --lr (now 1e+06)", "--grad-clip 1.0",
                "ck/last.pt was not updated: it still holds global step 4"):
        assert fix in err, f"the error lacks {fix!r}: {err}"
    assert bad["sha"] == good["sha"], "the diverging run changed the good ck/last.pt"
    assert not any(ln.startswith("epoch 1/1: ") for ln in bad["out"]), (
        f"a diverged epoch was reported as done:\n{show(bad)}")


def test_no_checkpoint_is_written_from_non_finite_weights(diverging_runs):
    """With --save-every 1 a diverging run should keep the last finite checkpoint, exit 3."""
    every, ck2 = diverging_runs["every"], diverging_runs["ck2"]
    assert every["rc"] == 3, f"the diverging run exited {every['rc']}, not 3:\n{show(every)}"
    assert ck2 is not None, f"no ck2/last.pt was saved before the divergence:\n{show(every)}"
    assert ck2["finite"], f"ck2/last.pt holds non-finite weights: {ck2}"
    assert 1 <= ck2["global_step"] < 8, f"ck2/last.pt is not from before the divergence: {ck2}"


def test_disk_full_during_a_save_keeps_last_pt_and_removes_the_temp_file(run_in_image):
    """A full disk mid-save should exit 4 naming the dir and free space, last.pt still loading."""
    # 150 MiB: one resnet18 checkpoint (about 85 MiB) fits, a second beside it does not.
    job = ["train_amp.py", *SYNTH, "--checkpoint-dir", "/ck", "--log-every", "100"]
    script = "\n".join([
        STEP_FN.replace("ck/last.pt", "/ck/last.pt"),
        "step first " + shlex.join(job + ["--epochs", "1"]),
        "step full " + shlex.join(job + ["--epochs", "2", "--resume"]),
        "ls -a /ck | sed 's/^/LS /'", "set -- /ck/last.pt", INSPECT_LAST])
    code, logs = run_in_image(["bash", "-c", script], tmpfs={"/ck": "size=150m,mode=1777"})
    assert code == 0, f"the script failed ({code}):\n{logs}"
    runs = steps_of(logs)
    first, full = runs["first"], runs["full"]
    assert first["rc"] == 0, f"the first run did not fit in 150 MiB:\n{show(first)}"
    assert full["rc"] == 4, f"a save to a full disk exited {full['rc']}, not 4:\n{show(full)}"
    err = full["err"][-1] if full["err"] else ""
    for part in ("could not write a checkpoint to /ck: the disk is full", "MiB free of 150",
                 "/ck/last.pt still holds global step 8", "Free space there"):
        assert part in err, f"the error lacks {part!r}: {err}"
    assert re.search(r"The partial last\.\S+\.\d+\.tmp was removed", err), (
        f"the error does not name the removed temp file: {err}")
    assert "Traceback" not in "\n".join(full["err"]), f"a traceback:\n{show(full)}"
    listing = re.findall(r"^LS (.*)$", logs, re.MULTILINE)
    assert not [n for n in listing if n.endswith(".tmp")], f"a temp file was left: {listing}"
    assert full["sha"] == first["sha"], "the failed save changed /ck/last.pt"
    ckpt = json.loads(re.search(r"^CKPT (.*)$", logs, re.MULTILINE).group(1))
    assert (ckpt or {}).get("global_step") == 8, (
        f"/ck/last.pt does not load as the first run's checkpoint:\n{logs}")


@pytest.mark.parametrize("make, ckdir", [
    ("mkdir locked && chmod 555 locked", "locked/ck"),
    ("mkdir -p ro && chmod 555 ro", "ro"),
], ids=["cannot-create", "read-only"])
def test_unwritable_checkpoint_dir_fails_before_training(run_in_image, make, ckdir):
    """An unwritable --checkpoint-dir should exit 2 at start naming it, not after training."""
    script = f"{make} && exec train_amp.py {shlex.join(SYNTH)} --epochs 1 --checkpoint-dir {ckdir}"
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 2, f"exited {code}, expected 2:\n{logs}"
    assert f"train_amp.py: error: --checkpoint-dir {ckdir} cannot be written" in logs, logs
    assert "give a directory this user can write" in logs, f"no fix given:\n{logs}"
    assert "resnet18 amp=" not in logs and not SUMMARY.search(logs), f"it trained first:\n{logs}"


def test_a_second_run_into_the_same_checkpoint_dir_is_refused_naming_the_first(run_in_image):
    """A run started while another saves into the same --checkpoint-dir should exit 2 at start,
    naming the first run's PID and host; the first run should finish and its last.pt load."""
    job = shlex.join(["train_amp.py", *SYNTH, "--epochs", "8", "--checkpoint-dir", "ck"])
    script = "\n".join([
        f"{job} > first.out 2> first.err & first=$!",
        # The first run holds the lock once its start line is out (the lock comes before it).
        "for _ in $(seq 600); do grep -q ' amp=' first.out 2>/dev/null && break; sleep 0.1; done",
        f"{job} > second.out 2> second.err; echo \"RC second $?\"",
        "wait $first; echo \"RC first $?\"; echo \"PID first $first\"; echo \"HOST $(hostname)\"",
        "sed 's/^/ERR second /' second.err; sed 's/^/OUT second /' second.out",
        "sed 's/^/ERR first /' first.err", "ls -a ck | sed 's/^/LS /'", "set -- ck/last.pt",
        INSPECT_LAST])
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"the script failed ({code}):\n{logs}"
    rc = dict(re.findall(r"^RC (\w+) (\d+)$", logs, re.MULTILINE))
    pid = re.search(r"^PID first (\d+)$", logs, re.MULTILINE).group(1)
    host = re.search(r"^HOST (\S+)$", logs, re.MULTILINE).group(1)
    assert rc.get("second") == "2", f"the second run was not refused (exit {rc.get('second')}):\n{logs}"
    assert (f"--checkpoint-dir ck is in use by another train_amp run (PID {pid} on host {host}"
            in logs), f"the refusal does not name the first run:\n{logs}"
    assert not re.search(r"^OUT second .* amp=", logs, re.MULTILINE), f"the second run trained:\n{logs}"
    assert rc.get("first") == "0", f"the first run failed ({rc.get('first')}):\n{logs}"
    listing = re.findall(r"^LS (.*)$", logs, re.MULTILINE)
    assert not [n for n in listing if n.endswith(".tmp")], f"a temp file was left: {listing}"
    ckpt = json.loads(re.search(r"^CKPT (.*)$", logs, re.MULTILINE).group(1))
    assert (ckpt or {}).get("global_step") == 64, f"ck/last.pt is not the first run's end:\n{logs}"


def test_a_stale_temp_file_is_removed_at_start(run_in_image):
    """A last.tmp left by a killed save should be removed, and said so, before training."""
    # The listing is taken at step 2 of 6, long before this run's only save (at the end).
    script = ("set -o pipefail; mkdir ck && head -c 8M /dev/zero > ck/last.tmp"
              " && head -c 1M /dev/zero > ck/last.otherhost.123.tmp && train_amp.py "
              + shlex.join(SYNTH) + " --steps 6 --log-every 1 --progress lines --checkpoint-dir ck"
              " | while IFS= read -r line; do echo \"$line\"; case $line in"
              " *' step 2/6 '*) ls -a ck | sed 's/^/LS /';; esac; done")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    lines = command_output(logs)
    removed = [i for i, ln in enumerate(lines) if ln.startswith("removed ck/last.tmp (8.0 MiB)")]
    assert any(ln.startswith("removed ck/last.otherhost.123.tmp (1.0 MiB)") for ln in lines), (
        "a killed run's per-process temp file was not removed:\n" + "\n".join(lines))
    header = [i for i, ln in enumerate(lines) if ln.startswith("resnet18 amp=")]
    assert removed and header and removed[0] < header[0], (
        "no 'removed ck/last.tmp' line before training started:\n" + "\n".join(lines))
    listing = re.findall(r"^LS (.*)$", logs, re.MULTILINE)
    assert listing, f"no listing taken during training:\n{logs}"
    assert not [n for n in listing if n.endswith(".tmp")], f"a temp file still there: {listing}"


# ---------------------------------------------------------------------------------------
# --compare and accuracy under bf16

@pytest.fixture(scope="module")
def comparison(docker_client, image_ref, module_containers):
    """--compare on digits: FP32 vs bf16 autocast, 4 epochs each (both reach ~98%)."""
    code, logs, c = run_to_end(docker_client, image_ref, [
        "train_amp.py", *DIGITS, "--epochs", "4", "--log-every", "50", "--compare",
        "--out", "report"])
    module_containers.append(c)
    assert code == 0, f"--compare failed ({code}):\n{logs}"
    files = {n: read_from_container(c, f"/workspace/report/{n}")
             for n in ("compare.json", "compare.md", "compare.png")}
    return logs, files


def test_compare_prints_a_markdown_table_and_writes_json_and_png(comparison):
    """--compare should print the FP32-vs-AMP table and write it as .md, .json and .png."""
    logs, files = comparison
    for row in ("| metric | FP32 (TF32 off) | AMP bf16 | AMP/FP32 |", "| images/s |",
                "| epoch time (s) |", "| peak GPU memory (GiB) |",
                "| final validation loss |", "| final validation accuracy (%) |"):
        assert row in logs, f"table row {row!r} missing:\n{logs}"
    assert "CPU run: FP32 vs bf16 autocast" in logs, f"CPU comparison not labelled:\n{logs}"
    assert files["compare.md"] and b"| images/s |" in files["compare.md"], "compare.md missing"
    assert files["compare.png"] and files["compare.png"].startswith(b"\x89PNG"), "no PNG chart"
    report = json.loads(files["compare.json"])
    for key in ("images_per_s", "epoch_time", "peak_mem", "accuracy_diff_pt"):
        assert key in report["ratios"], f"compare.json lacks ratio {key}: {report['ratios']}"
    assert report["ratios"]["images_per_s"] > 0, f"no speed ratio: {report['ratios']}"


def test_digits_bf16_accuracy_is_within_one_point_of_fp32(comparison):
    """Digits accuracy after the same steps with bf16 autocast should be within 1 point of FP32."""
    _, files = comparison
    report = json.loads(files["compare.json"])
    fp32 = report["fp32"]["final"]["val_acc"]
    bf16 = report["amp_run"]["final"]["val_acc"]
    # Both must have learned (10 classes: chance is 10%), or agreement would mean nothing.
    assert fp32 > 90 and bf16 > 90, f"digits not learned: FP32 {fp32:.2f}%, bf16 {bf16:.2f}%"
    assert abs(bf16 - fp32) <= 1.0, f"bf16 {bf16:.2f}% vs FP32 {fp32:.2f}%: more than 1 point"


# ---------------------------------------------------------------------------------------
# other data sources and modes

MAKE_JPEGS = r"""
import os, random
from PIL import Image
random.seed(0)
for split, n in (("train", 24), ("val", 8)):
    for k, colour in enumerate(((200, 30, 30), (30, 30, 200))):
        os.makedirs(f"imgs/{split}/class{k}", exist_ok=True)
        for i in range(n):
            c = tuple(min(255, max(0, v + random.randint(-40, 40))) for v in colour)
            Image.new("RGB", (40, 30), c).save(f"imgs/{split}/class{k}/{i}.jpg", quality=90)
"""


@pytest.mark.parametrize("decode", ["workers", "device"])
def test_imagefolder_of_jpegs_trains_and_validates(run_in_image, decode):
    """Container should train on JPEGs decoded in the workers or on the device, and score val/."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              "exec train_amp.py --data imgs --model resnet18 --image-size 32"
              f" --batch-size 16 --epochs 1 --num-workers 2 --lr 0.05 --decode {decode}")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    assert "(48 train images, 2 classes, 32px)" in logs, f"ImageFolder not read:\n{logs}"
    assert re.search(r"^epoch 1/1: .* val_acc [\d.]+%", logs, re.MULTILINE), f"no val accuracy:\n{logs}"
    assert "JPEGs are large" not in logs, f"a size note for 40 x 30 px JPEGs:\n{logs}"


def test_large_jpegs_get_a_note_to_pre_resize_them(run_in_image):
    """JPEGs far larger than the training crop (here 640 x 480 px for 32 px) should get one
    note at start naming their size and the pre-resize size (the 40 x 30 px ones of the test
    above get none)."""
    make = MAKE_JPEGS.replace("(40, 30)", "(640, 480)")
    assert make != MAKE_JPEGS
    script = (f"python3 - <<'EOF'\n{make}\nEOF\n"
              "exec train_amp.py --data imgs --model resnet18 --image-size 32 --batch-size 16"
              " --epochs 1 --num-workers 2 --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    assert logs.count("note: the JPEGs are large (median 640 x 480 px over 24 sampled") == 1, (
        f"no (or more than one) size note:\n{logs}")
    assert "shorter side to 36 px (README: Pre-resize)" in logs, logs


@pytest.fixture(scope="module", params=["workers", "device"])
def corrupt_jpeg_runs(request, docker_client, image_ref, module_containers):
    """The JPEG ImageFolder with one train file truncated to 100 bytes: a plain run, then one
    with --skip-bad-images (2 epochs), decoding in the workers or on the device."""
    job = ["train_amp.py", "--data", "imgs", "--model", "resnet18", "--image-size", "32",
           "--batch-size", "16", "--num-workers", "2", "--lr", "0.05", "--checkpoint-dir", "",
           "--progress", "lines", "--decode", request.param]
    lines = [STEP_FN, f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF",
             "head -c 100 imgs/train/class0/3.jpg > cut && mv cut imgs/train/class0/3.jpg",
             "step plain " + shlex.join(job + ["--epochs", "1"]),
             "step skip " + shlex.join(job + ["--epochs", "2", "--skip-bad-images"])]
    code, logs, c = run_to_end(docker_client, image_ref, ["bash", "-c", "\n".join(lines)])
    module_containers.append(c)
    assert code == 0, f"the corrupt-JPEG script failed ({code}):\n{logs}"
    return request.param, steps_of(logs)


def test_a_corrupt_jpeg_stops_the_run_with_an_error_naming_the_file(corrupt_jpeg_runs):
    """A truncated JPEG should stop training with exit 2 and one error naming the file."""
    decode, runs = corrupt_jpeg_runs
    plain = runs["plain"]
    assert plain["rc"] == 2, f"--decode {decode}: exited {plain['rc']}, not 2:\n{show(plain)}"
    assert len(plain["err"]) == 1, f"--decode {decode}: expected one error line:\n{show(plain)}"
    assert plain["err"][0].startswith(
        "train_amp.py: error: cannot read image imgs/train/class0/3.jpg ("), show(plain)
    assert "--skip-bad-images" in plain["err"][0], f"no fix given: {plain['err'][0]}"


def test_skip_bad_images_finishes_and_counts_the_skipped_file(corrupt_jpeg_runs):
    """--skip-bad-images should warn once naming the file and count 1 skipped per epoch."""
    decode, runs = corrupt_jpeg_runs
    skip = runs["skip"]
    assert skip["rc"] == 0, f"--decode {decode}: exited {skip['rc']}:\n{show(skip)}"
    warnings = [ln for ln in skip["err"] if "skipping unreadable image" in ln]
    assert len(warnings) == 1 and "imgs/train/class0/3.jpg" in warnings[0], (
        f"--decode {decode}: expected one warning naming the file:\n{show(skip)}")
    summaries = [ln for ln in skip["out"] if SUMMARY.match(ln)]
    assert len(summaries) == 2 and all(ln.endswith(", skipped 1 unreadable image(s)")
                                       for ln in summaries), (
        f"--decode {decode}: each epoch should report 1 skipped image:\n{show(skip)}")
    # 48 train images, 1 unreadable: the 3 batches of 16 hold 47, so accuracy is k/47.
    acc = float(re.search(r"train_acc ([\d.]+)%", summaries[0]).group(1))
    assert any(abs(acc - 100 * k / 47) < 0.006 for k in range(48)), (
        f"epoch 1 accuracy {acc}% is not a count out of 47 images: the file was not left out")


# The device path's batched crop against torchvision's RandomResizedCrop (what the workers
# run), 20,000 draws each on three image shapes (the last one forces the fallback crop); its
# flip rate and resize filter through decode_on_device on real JPEG bytes. Prints JSON.
AUG_STATS = r"""
import io, json, sys, numpy as np, torch, torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image
from torchvision.io import encode_jpeg
sys.path.insert(0, "/usr/local/bin")
import train_amp

def q(v):
    return torch.quantile(v.float(), torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95]))

def stats(left, top, cw, ch, h, w):
    return {"area": cw * ch / (h * w), "log_aspect": torch.log(cw / ch),
            "centre_x": (left + cw / 2) / w, "centre_y": (top + ch / 2) / h}

n, out = 20000, {"quantile_gap": {}}
for h, w in ((375, 500), (640, 333), (40, 400)):
    b = train_amp.random_crop_boxes([(h, w)] * n, torch.Generator().manual_seed(0))
    ours = stats(b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1], h, w)
    torch.manual_seed(0)
    img = Image.new("RGB", (w, h))
    r = torch.tensor([T.RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
                      for _ in range(n)], dtype=torch.float64)  # top, left, height, width
    ref = stats(r[:, 1], r[:, 0], r[:, 3], r[:, 2], h, w)
    for k in ours:
        out["quantile_gap"][f"{h}x{w} {k}"] = (q(ours[k]) - q(ref[k])).abs().max().item()
ramp = torch.arange(64).mul(4).expand(3, 48, 64).to(torch.uint8).contiguous()
data = encode_jpeg(ramp, quality=95)
flipped = 0
for k in range(20):
    packed = (data.repeat(100), torch.full((100,), len(data)), ["ramp.jpg"] * 100, [])
    x, _ = train_amp.decode_on_device(packed, True, 16, torch.device("cpu"),
                                      gen=train_amp.batch_generator(k))
    flipped += (x[:, :, :, 0].mean((1, 2)) > x[:, :, :, -1].mean((1, 2))).sum().item()
out["flip_rate"] = flipped / 2000
img = torch.from_numpy(np.array(Image.open(io.BytesIO(data.numpy().tobytes())))).permute(2, 0, 1)
ours = train_amp.crop_resize([img], torch.tensor([[0., 0., 64., 48.]]), 16)
ref = F.interpolate(img[None].float(), size=(16, 16), mode="bilinear", antialias=True)
out["resize_mean_abs_diff"] = (ours - ref).abs().mean().item()
print(json.dumps(out))
"""


def test_device_augmentation_has_the_cpu_paths_crop_and_flip_statistics(run_in_image):
    """The GPU path's batched crops should draw torchvision RandomResizedCrop's distribution,
    flip half the images and resize like resize(antialias=True)."""
    code, logs = run_in_image(["python3", "-c", AUG_STATS], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    r = json.loads(logs.strip().splitlines()[-1])
    # 20,000 draws: the quantiles of two samples of one distribution differ by about 0.005.
    worst = max(r["quantile_gap"].items(), key=lambda kv: kv[1])
    assert worst[1] < 0.02, f"crop distribution differs from RandomResizedCrop: {worst}; {r}"
    assert abs(r["flip_rate"] - 0.5) < 0.04, f"flip rate {r['flip_rate']} over 2000 images"
    assert r["resize_mean_abs_diff"] < 1.0, f"resize filter differs (0-255 scale): {r}"


# The workers' transforms (CropFlip, ResizeCentreCrop) against torchvision's RandomResizedCrop +
# flip and Resize + CenterCrop on a photo-sized JPEG and an ImageNet-sized one, with the same
# torch seed: pixels, the draws they take from torch's generator, and the scale decoded. Prints JSON.
WORKER_TRANSFORMS = r"""
import io, json, sys, numpy as np, torch
import torchvision.transforms.v2 as T
from PIL import Image
sys.path.insert(0, "/usr/local/bin")
import train_amp

def jpeg(h, w):
    rng = np.random.default_rng(h)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([np.sin(xx / rng.uniform(20, 200)) * 60 + np.cos(yy / rng.uniform(20, 200)) * 60
                    + 128 for _ in range(3)], -1) + rng.normal(0, 14, (h, w, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()

ref_train = T.Compose([T.RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                                           antialias=True), T.RandomHorizontalFlip(), T.PILToTensor()])
ref_val = T.Compose([T.Resize(256, antialias=True), T.CenterCrop(224), T.PILToTensor()])
import trainamp.data.cpu
scales, draft = [], trainamp.data.cpu.draft_jpeg
def spy(*args):
    scales.append(draft(*args))
    return scales[-1]
trainamp.data.cpu.draft_jpeg = spy  # where the transforms look it up
out = {}
for name, data in (("photo", jpeg(1836, 3264)), ("imagenet", jpeg(375, 500))):
    for on in (False, True):
        train, val = train_amp.image_transforms(224, train_amp.DecodeOptions(jpeg_draft=on))
        key = f"{name} draft {'on' if on else 'off'}"
        scales.clear()
        diffs, same_draws = [], 0
        for seed in range(24):
            torch.manual_seed(seed)
            a = ref_train(Image.open(io.BytesIO(data)).convert("RGB"))
            after_ref = torch.rand(1).item()
            torch.manual_seed(seed)
            b = train(Image.open(io.BytesIO(data)))
            same_draws += torch.rand(1).item() == after_ref
            diffs.append((a.float() - b.float()).abs().mean().item())
        a = ref_val(Image.open(io.BytesIO(data)).convert("RGB"))
        b = val(Image.open(io.BytesIO(data)))
        out[key] = {"train_diff": max(diffs), "same_draws": same_draws, "shape": list(b.shape),
                    "val_diff": (a.float() - b.float()).abs().mean().item(),
                    "reduced": sum(f < 1 for f in scales), "decoded": len(scales)}
print(json.dumps(out))
"""


def test_workers_decode_large_jpegs_at_reduced_scale_with_torchvisions_crops(run_in_image):
    """The workers' transforms should draw torchvision's crops and flips (the same generator
    draws) and give its exact pixels at full scale; a photo should be decoded at a reduced
    scale (draft_jpeg) for every crop that allows it, within a level or so of a full decode."""
    code, logs = run_in_image(["python3", "-c", WORKER_TRANSFORMS], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    r = json.loads(logs.strip().splitlines()[-1])
    for key, v in r.items():
        assert v["same_draws"] == 24 and v["shape"] == [3, 224, 224], f"{key}: {v}"
    for key in ("photo draft off", "imagenet draft off", "imagenet draft on"):
        assert r[key]["train_diff"] == 0 and r[key]["val_diff"] == 0, (
            f"{key}: at full scale the pixels should be torchvision's exactly: {r}")
    assert r["imagenet draft on"]["reduced"] == 0, f"a 500 px JPEG has no scale to spare: {r}"
    photo = r["photo draft on"]
    # A 3264 x 1836 photo: every validation resize and most crops decode at 1/2 or less.
    assert photo["reduced"] >= 12, f"the photo was decoded at full scale: {photo}"
    assert photo["train_diff"] < 2.0 and photo["val_diff"] < 2.0, (
        f"reduced-scale decoding should differ from a full decode by a level or two: {photo}")


# --decode device over 3 epochs and a resume into epoch 2's second batch: which files each
# training batch decoded, against the sampler's order of each epoch, and how many times a
# loader was iterated for training (PlanBatches). Prints JSON.
ONE_ITERATION = r"""
import json, sys, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp

import trainamp.data.prefetch
passes, trained = [], []
iterate, decode = torch.utils.data.DataLoader.__iter__, trainamp.data.prefetch.decode_on_device
def counting(self):
    passes.append(type(self.batch_sampler).__name__)
    return iterate(self)
def recording(packed, train, *a, **k):
    if train:
        trained.append(list(packed[2]))
    return decode(packed, train, *a, **k)
# where DeviceBatches looks it up
torch.utils.data.DataLoader.__iter__, trainamp.data.prefetch.decode_on_device = counting, recording
out = {}
for name, start in (("whole", None), ("resumed", (1, 1))):
    passes.clear(); trained.clear()
    args = train_amp.build_parser().parse_args([
        "--data", "imgs", "--decode", "device", "--model", "resnet18", "--image-size", "32",
        "--batch-size", "16", "--epochs", "3", "--num-workers", "2", "--checkpoint-dir", "",
        "--progress", "none", "--device", "cpu", "--decode-cpu-share", "0"])
    train_amp.fill_defaults(args)
    t = train_amp.Trainer(args, train_amp.Ranks(), torch.device("cpu"), train_amp.StopRequest())
    if start:
        t.start_epoch, t.start_step = start
    t.run()
    expect = []
    for epoch in range(start[0] if start else 0, 3):
        t.sampler.set_epoch(epoch)
        t.sampler.start = 16 * (start[1] if start and epoch == start[0] else 0)
        paths = [t.train_set.samples[i][0] for i in t.sampler]
        expect += [paths[b:b + 16] for b in range(0, len(paths) - 15, 16)]
    out[name] = {"passes": passes.count("PlanBatches"), "batches": len(trained),
                 "in_order": trained == expect, "first": trained[0][:2], "expect": expect[0][:2]}
print(json.dumps(out))
"""


def test_decode_device_reads_the_whole_job_in_one_loader_pass_in_each_epochs_order(run_in_image):
    """--decode device should iterate its loader once for the whole job (the workers read on
    across epoch ends) and still train each epoch's batches in that epoch's sampler order,
    from the saved batch on when resuming."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              f"python3 - <<'EOF'\n{ONE_ITERATION}\nEOF\n")
    code, logs = run_in_image(["bash", "-c", script], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    r = json.loads(logs.strip().splitlines()[-1])
    # 48 training images in batches of 16: 3 batches an epoch; the resume skips 3 + 1.
    assert r["whole"]["batches"] == 9 and r["resumed"]["batches"] == 5, r
    assert r["whole"]["passes"] == 1 and r["resumed"]["passes"] == 1, (
        f"the loader was iterated once per epoch, not once for the job: {r}")
    assert r["whole"]["in_order"] and r["resumed"]["in_order"], (
        f"the batches are not the sampler's order of each epoch: {r}")


# After each validation of a --decode device run on CPU: the DataLoader worker processes alive
# and the loader iterators that still exist. The garbage collector is off, so an iterator kept
# only by a reference cycle stays (as it did until the collector happened to run, once inside a
# later loader's forked worker, where its __del__ broke that loader's pipes: EOFError in CI).
VAL_WORKERS_END = r"""
import gc, json, multiprocessing, sys, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp
import trainamp.trainer
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
gc.disable()
after, evaluate = [], trainamp.trainer.evaluate
def counting(*a, **k):
    result = evaluate(*a, **k)
    after.append({"workers": len(multiprocessing.active_children()),
                  "iterators": sum(isinstance(o, _MultiProcessingDataLoaderIter)
                                   for o in gc.get_objects())})
    return result
trainamp.trainer.evaluate = counting  # where the trainer looks it up
args = train_amp.build_parser().parse_args([
    "--data", "imgs", "--decode", "device", "--model", "resnet18", "--image-size", "32",
    "--batch-size", "16", "--epochs", "3", "--num-workers", "2", "--checkpoint-dir", "",
    "--progress", "none", "--device", "cpu"])
train_amp.fill_defaults(args)
train_amp.Trainer(args, train_amp.Ranks(), torch.device("cpu"), train_amp.StopRequest()).run()
print(json.dumps(after))
"""


def test_decode_device_validation_shuts_its_workers_down_when_each_validation_ends(run_in_image):
    """--decode device (here on CPU, where batches are prepared inline) should let go of each
    validation's loader iterator when the validation ends, so that its workers exit there and
    then, not whenever the garbage collector - maybe in a later loader's worker - gets to it."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              f"python3 - <<'EOF'\n{VAL_WORKERS_END}\nEOF\n")
    code, logs = run_in_image(["bash", "-c", script], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    after = json.loads(logs.strip().splitlines()[-1])
    # Left: the training loader's 2 persistent workers and its one iterator while the job's
    # single training pass lasts; by the last validation that pass is over: nothing.
    assert after == [{"workers": 2, "iterators": 1}] * 2 + [{"workers": 0, "iterators": 0}], (
        f"validation workers or iterators outlived their validation: {after}")


# The thread that prepares --decode device batches on a GPU, started where it cannot start (no
# GPU here: its set_device fails): the training thread must get the error, not wait for ever.
THREAD_START_FAILS = r"""
import sys, threading, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp
batches = train_amp.DeviceBatches([], 32, torch.device("cuda", 0), False, True,
                                  train_amp.BadImages())
seen = {}
def train():
    try:
        next(iter(batches.epoch(0)))
        seen["error"] = "none: a batch came"
    except BaseException as e:
        seen["error"] = type(e).__name__
trainer = threading.Thread(target=train, daemon=True)
trainer.start()
trainer.join(60)
print("HUNG" if trainer.is_alive() else f"RAISED {seen['error']}")
"""


def test_a_batch_thread_that_cannot_start_fails_training_instead_of_hanging_it(run_in_image):
    """If the --decode device batch thread fails before its first batch (here: no GPU for its
    set_device), the training thread should raise that error, not wait on the queue for ever."""
    code, logs = run_in_image(["python3", "-c", THREAD_START_FAILS], timeout=120)
    assert code == 0, f"exited {code}:\n{logs}"
    last = logs.strip().splitlines()[-1]
    assert last.startswith("RAISED") and "none" not in last, (
        f"the training thread should get the batch thread's error: {last}\n{logs[-2000:]}")


# --decode device with the workers decoding a share of each batch (CollateBytes) against the
# GPU decoding all of it: the same image for every label, a file the CPU cannot decode left to
# the device decoder (which names it), and the CPU's images first in the batch. Prints JSON.
CPU_SHARE = r"""
import json, sys, torch
from torchvision.io import encode_jpeg
sys.path.insert(0, "/usr/local/bin")
import train_amp

gen = torch.Generator().manual_seed(0)
batch = []
for label in range(12):
    img = torch.randint(0, 256, (3, 40 + 3 * label, 60 - 2 * label), dtype=torch.uint8,
                        generator=gen)
    data = encode_jpeg(img, quality=90)
    batch.append((data[:60] if label == 1 else data, label, f"{label}.jpg"))  # 1: truncated
out = {}
for share in (0.0, 0.5):
    packed, y = train_amp.CollateBytes(share)(batch)
    bad = train_amp.BadImages()
    bad.report = lambda found, bad=bad: bad.__dict__.setdefault("found", []).extend(found)
    x, keep = train_amp.decode_on_device(packed, False, 16, torch.device("cpu"), bad)
    y = y[list(keep)]
    out[share] = {"cpu_decoded": len(packed.shapes), "labels": y.tolist(),
                  "bad": [p for p, _ in bad.__dict__.get("found", [])],
                  "images": {int(l): x[i] for i, l in enumerate(y)}}
a, b = out[0.0], out[0.5]
print(json.dumps({
    "cpu_decoded": [a["cpu_decoded"], b["cpu_decoded"]], "labels": [a["labels"], b["labels"]],
    "bad": [a["bad"], b["bad"]],
    "worst_diff": max((a["images"][k] - b["images"][k]).abs().max().item() for k in a["images"]),
    "same_labels": sorted(a["images"]) == sorted(b["images"])}))
"""


def test_workers_decoding_part_of_each_batch_give_the_same_images_and_labels(run_in_image):
    """--decode-cpu-share: the workers' CPU-decoded images should come first, each with its own
    label, equal to what the device decoder makes of the same file; a file the CPU cannot
    decode goes on to the device decoder, which names it once."""
    code, logs = run_in_image(["python3", "-c", CPU_SHARE], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    r = json.loads(logs.strip().splitlines()[-1])
    # 12 files, half for the CPU: 6 minus the truncated one decoded there, first in the batch.
    assert r["cpu_decoded"] == [0, 5], r
    assert r["labels"][1][:5] == [0, 2, 3, 4, 5], f"the CPU's images are not first: {r}"
    assert r["bad"] == [["1.jpg"], ["1.jpg"]], f"the truncated file should be named once: {r}"
    assert r["same_labels"] and r["worst_diff"] == 0, f"an image changed or lost its label: {r}"


# The GPU path's fused Triton kernel (crop_to_batch) against the roi_align path it replaces,
# run by Triton's interpreter on CPU: shrinking (several samples per output pixel), enlarging,
# a crop touching the edges, flips, both memory formats, and batches split into groups.
FUSED_CROP = r"""
import json, sys, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp

assert train_amp.use_fused_crop(torch.device("cpu")), "Triton's interpreter is not in use"
gen = torch.Generator().manual_seed(0)
shapes = [(37, 50), (64, 33), (20, 90), (12, 12), (90, 70), (8, 200)]
imgs = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen) for h, w in shapes]
boxes = train_amp.random_crop_boxes(shapes, gen)
boxes[0] = torch.tensor([0., 0., 50., 37.])  # the whole image: samples on every edge
flip = torch.rand(len(imgs), generator=gen) < 0.5
flip[:2] = torch.tensor([True, False])
worst, one_group = {}, train_amp.DecodeOptions().pad_group_elems
for channels_last in (False, True):
    for group_elems in (one_group, 3 * 40 * 60):
        for size in (16, 24):
            fused, ref = (train_amp.crop_to_batch(imgs, boxes, flip, size, channels_last,
                                                  train_amp.DecodeOptions(fused_crop=on,
                                                                          pad_group_elems=group_elems))
                          for on in (True, False))
            key = f"cl={channels_last} groups={group_elems} size={size}"
            assert fused.is_contiguous(memory_format=torch.channels_last if channels_last
                                       else torch.contiguous_format), key
            worst[key] = (fused - ref).abs().max().item()
print(json.dumps(worst))
"""


def test_gpu_crop_kernel_matches_the_roi_align_path(run_in_image):
    """The Triton kernel that crops, resizes, flips and normalises a whole batch on the GPU
    should compute what roi_align + flip + normalise compute (run here in Triton's CPU
    interpreter, so a wrong index, flip or filter shows on a CPU host)."""
    code, logs = run_in_image(["python3", "-c", FUSED_CROP], timeout=300,
                              environment={"TRITON_INTERPRET": "1"})
    assert code == 0, f"exited {code}:\n{logs}"
    worst = json.loads(logs.strip().splitlines()[-1])
    # Normalised units (1/255 of a channel is ~0.017): float rounding only.
    bad = {k: v for k, v in worst.items() if v > 1e-4}
    assert not bad, f"the fused crop differs from roi_align + flip + normalise: {bad}"


MAKE_SHARDS = r"""
import io, pathlib, tarfile
for split in ("train", "val"):
    files = sorted(pathlib.Path("imgs", split).rglob("*.jpg"))
    with tarfile.open(f"shards/{split}-000.tar", "w") as tar:
        for f in files:
            key = f"{f.parent.name}_{f.stem}"
            tar.add(f, arcname=f"{key}.jpg")
            label = str(int(f.parent.name[-1])).encode()
            info = tarfile.TarInfo(f"{key}.cls")
            info.size = len(label)
            tar.addfile(info, io.BytesIO(label))
"""


@pytest.mark.parametrize("decode", ["workers", "device"])
def test_tar_shards_train_and_validate(run_in_image, decode):
    """Container should train on WebDataset-style tar shards (KEY.jpg + KEY.cls) and score
    the val-*.tar shards, decoding in the workers or on the device."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\nmkdir shards\n"
              f"python3 - <<'EOF'\n{MAKE_SHARDS}\nEOF\n"
              "exec train_amp.py --data shards --model resnet18 --image-size 32"
              f" --batch-size 16 --epochs 1 --num-workers 2 --lr 0.05 --decode {decode}"
              " --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    assert "(48 train images, 2 classes, 32px)" in logs, f"shards not read:\n{logs}"
    assert re.search(r"^epoch 1/1: .* val_acc [\d.]+%", logs, re.MULTILINE), (
        f"no val accuracy from the val shard:\n{logs}")


@pytest.mark.parametrize("damage, fix", [
    # A shard cut short (an interrupted copy) was read as a shorter one: fewer images, exit 0.
    ("head -c 20000 shards/train-000.tar > cut && mv cut shards/train-000.tar",
     (r"tar shard shards/train-000\.tar ends early \(20000 bytes; its last whole member is"
     r" class\d_\d+\.(jpg|cls)\b.*copy or write it again")),
    # torchvision refuses a folder with one empty class ("Found no valid file for the classes").
    ("mkdir imgs/train/class2 imgs/val/class2 && touch imgs/train/class2/notes.txt",
     (r"1 class folder\(s\) hold no images \(imgs/train/class2; .*add their images or move"
     r" the empty folders out of it")),
], ids=["truncated-tar-shard", "empty-class-folder"])
def test_damaged_data_exits_2_naming_the_file_and_the_fix(run_in_image, damage, fix):
    """A tar shard that ends early, or an ImageFolder class folder without images, should stop
    the run at start (exit 2) naming the shard (and its last whole member) or the folder."""
    data = "shards" if "shards" in damage else "imgs"
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\nmkdir shards\n"
              f"python3 - <<'EOF'\n{MAKE_SHARDS}\nEOF\n{damage}\n"
              f"exec train_amp.py --data {data} --model resnet18 --image-size 32 --batch-size 16"
              " --epochs 1 --num-workers 1 --skip-bad-images --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 2, f"exited {code}, expected 2:\n{logs}"
    assert re.search(r"^train_amp\.py: error: --data: " + fix, logs, re.MULTILINE), (
        f"the error does not name the damage and its fix:\n{logs}")
    assert not SUMMARY.search(logs), f"it trained:\n{logs}"


def test_decode_auto_says_which_path_it_picked(run_in_image):
    """--decode auto (the default) should print the path it picked and why: workers on CPU."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              "exec train_amp.py --data imgs --model resnet18 --image-size 32 --batch-size 16"
              " --steps 1 --num-workers 1 --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    assert re.search(r"^--decode auto: workers \(no GPU: the \d+ CPU core\(s\) decode\)$", logs,
                     re.MULTILINE), f"no line naming the picked decode path:\n{logs}"


@pytest.mark.parametrize("limit", [{"nano_cpus": 10 ** 9}, {"cpuset_cpus": "0"}],
                         ids=["cpus-1", "cpuset-cpus-0"])
def test_decode_auto_counts_the_cores_the_container_may_use(run_in_image, limit):
    """--decode auto and the default worker count should count the cores the container may use
    (docker --cpus, --cpuset-cpus), not the host's (os.cpu_count()): 1 here, on any host."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              "exec train_amp.py --data imgs --model resnet18 --image-size 32 --batch-size 16"
              " --steps 1 --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script], **limit)
    assert code == 0, f"exited {code}:\n{logs}"
    assert "--decode auto: workers (no GPU: the 1 CPU core(s) decode)" in logs, (
        f"auto did not count the container's one core:\n{logs}")


def test_benchmark_times_steps_and_writes_json(start_container):
    """--benchmark should time steps on a device-resident batch and write benchmark.json."""
    c = start_container(["train_amp.py", "--benchmark", "--model", "resnet18", "--image-size",
                         "32", "--batch-size", "8", "--steps", "3", "--warmup-steps", "1",
                         "--out", "bench"])
    code = c.wait(timeout=300)["StatusCode"]
    logs = c.logs().decode(errors="replace")
    assert code == 0, f"exited {code}:\n{logs}"
    assert re.search(r"benchmark resnet18 batch 8 32px amp=(bf16|off) .*: [\d.]+ images/s", logs), logs
    result = json.loads(read_from_container(c, "/workspace/bench/benchmark.json"))
    assert result["images_per_s"] > 0 and result["measured_steps"] == 3, f"bad result: {result}"
    assert result["loss_is_finite"], f"the benchmark's loss went non-finite: {result}"


def test_compile_trains_on_cpu_with_the_images_compiler(run_in_image):
    """--compile should work in the image (g++ present): a few compiled steps train."""
    code, logs = run_in_image(["train_amp.py", *SYNTH, "--steps", "3", "--compile",
                               "--amp", "off", "--checkpoint-dir", ""], timeout=600)
    assert code == 0, f"--compile run exited {code}:\n{logs}"
    assert "compile=True" in logs and SUMMARY.search(logs), f"no compiled epoch:\n{logs}"
    assert "(tuned)" not in logs, f"plain --compile turned kernel tuning on:\n{logs}"


def test_compile_tuned_turns_on_kernel_tuning_and_trains(run_in_image):
    """--compile tuned should compile with Inductor's coordinate-descent tuning on and train."""
    code, logs = run_in_image(["train_amp.py", *SYNTH, "--steps", "2", "--compile", "tuned",
                               "--amp", "off", "--checkpoint-dir", ""], timeout=600)
    assert code == 0, f"--compile tuned run exited {code}:\n{logs}"
    assert "compile=True (tuned)" in logs, f"tuning not in force:\n{logs}"
    assert SUMMARY.search(logs), f"no compiled epoch:\n{logs}"


def run_repo_script(run_in_image, script):
    """Run a bash line in the image with the repository's benchmarks/ at /repo/benchmarks (they
    are not in the image); fail with the logs unless it exits 0. Returns the logs."""
    code, logs = run_in_image(["bash", "-c", script], timeout=600,
                              volumes={str(ROOT / "benchmarks"): {"bind": "/repo/benchmarks",
                                                                  "mode": "ro"}})
    assert code == 0, f"{script.split()[1]} exited {code}:\n{logs}"
    return logs


def test_bench_amp_script_measures_matrix_and_jpeg_parts_on_cpu(run_in_image):
    """benchmarks/bench_amp.py (the GPU benchmark) should run its parts end to end: tiny on CPU."""
    script = ("python /repo/benchmarks/bench_amp.py --device cpu --model resnet18 --image-size 32"
              " --batch-size 8 --steps 1 --warmup-steps 1 --only matrix-eager,jpeg"
              " --precisions fp32-strict,amp-bf16 --jpeg-images 48 --jpeg-dir /tmp/jpegs"
              " --out /tmp/bench.json && cat /tmp/bench.json")
    logs = run_repo_script(run_in_image, script)
    assert "| amp-bf16 | on | off |" in logs and "### JPEG ImageFolder (48 images" in logs, logs
    report = json.loads(logs[logs.index("\n{") + 1:])
    assert len(report["matrix"]) == 4 and all(m["images_per_s"] > 0 for m in report["matrix"])
    runs = report["jpeg"]["runs"]
    assert runs and all(r.get("loader_only_ips", 0) > 0 and r.get("train_ips", 0) > 0
                        for r in runs), runs


def test_bench_input_script_compares_synthetic_and_jpeg_rates_on_cpu(run_in_image):
    """benchmarks/bench_input.py (synthetic vs JPEG images/s) should make its JPEGs and tar shards and
    print images/s per --decode path with the ratio to synthetic data, over interleaved rounds
    with --repeat (median and range): tiny, on CPU."""
    script = ("python /repo/benchmarks/bench_input.py --device cpu --model resnet18 --image-size 32"
              " --batch-size 16 --images 64 --classes 4 --max-side 96 --epochs 2"
              " --rows synthetic,device,tar --repeat 2 --jpeg-dir /tmp/bi --out /tmp/bi.json"
              " && cat /tmp/bi.json")
    logs = run_repo_script(run_in_image, script)
    assert re.search(r"^\| JPEG ImageFolder \| device \| \d+ \(\d+-\d+\) \|"
                     r" [\d.]+ \([\d.]+-[\d.]+\) \|$", logs, re.MULTILINE), (
        f"no JPEG row with its median, range and ratio:\n{logs}")
    report = json.loads(logs[logs.index("\n{") + 1:])
    assert [(r["label"], r["round"]) for r in report["rows"]] == [
        (label, k) for k in (1, 2) for label in ("synthetic", "device", "tar")], report["rows"]
    rows = {r["label"]: r for r in report["rows"]}
    assert all(r.get("ips", 0) > 0 and len(r["epoch_ips"]) == 2 for r in report["rows"]), (
        report["rows"])
    assert rows["tar"]["decode"] == "workers", f"auto on CPU must pick workers: {rows['tar']}"
    assert report["page_cache"].startswith("warm"), report


def bench_report_logs(run_in_image, body):
    """The logs of bench_input.print_report called by `body`, in the image, through
    report(images, rows): a ResNet-50 batch-256 report of those rows, made up, no training."""
    return run_repo_script(run_in_image, f"""python - <<'EOF'
import sys
sys.path.insert(0, "/repo/benchmarks")
import bench_input
def report(images, rows):
    bench_input.print_report({{
        "model": "resnet50", "batch_size": 256, "image_size": 224, "gpu": "GPU", "cpus": 16,
        "torch": "2", "images": images, "mean_kib": 85, "epochs": 4, "page_cache": "warm",
        "repeat": 1, "rows": rows}})
{body}
EOF""")


def test_bench_input_warns_when_an_epoch_has_too_few_batches_for_its_workers(run_in_image):
    """bench_input.py's report should say that a workers row understates the workers when they
    outnumber half its batches an epoch (photos in a small set: 8 batches for 15 workers), and
    say nothing when each worker gets two batches an epoch."""
    logs = bench_report_logs(run_in_image, """
for steps in (8, 30):
    print(f"== {steps} batches an epoch")
    report(steps * 256, [
        {"label": "synthetic", "ips": 6400.0, "round": 1},
        {"label": "workers", "decode": "workers", "ips": 208.0, "round": 1,
         "steps_per_epoch": steps, "num_workers": 15},
        {"label": "device", "decode": "device", "ips": 850.0, "round": 1}])
""")
    few, enough = logs.split("== 30 batches an epoch")
    assert re.search(r"^caution: the workers row had 8 batches an epoch for 15 workers.*"
                     r"--images 7680 or more", few, re.MULTILINE), f"no caution:\n{few}"
    assert few.count("caution") == 1, f"only the workers row gets one:\n{few}"
    assert "caution" not in enough, f"a caution with two batches per worker:\n{enough}"


def test_bench_input_header_counts_rows_of_one_name_without_repeat(run_in_image):
    """A row name given twice in --rows (no --repeat) should get a header that counts its rows,
    not "a range of 1 interleaved rounds"."""
    logs = bench_report_logs(run_in_image, """
report(8192, [{"label": "synthetic", "ips": 6400.0, "round": 1}] + [
    {"label": "device", "decode": "device", "ips": v, "round": 1} for v in (5500.0, 5700.0)])
""")
    assert "(median, range of up to 2 rows of one name)" in logs, logs
    assert "interleaved rounds" not in logs, logs
    assert re.search(r"^\| JPEG ImageFolder \| device \| 5600 \(5500-5700\) \| 0\.88 \(0\.86-0\.89\) \|$",
                     logs, re.MULTILINE), logs


def test_bench_input_replay_rows_stop_the_loader_and_decode_once(run_in_image):
    """bench_input.py's device-replay row should take only the first epoch's batches from the
    loader and replay them (every batch still decoded), device-decode-once should also decode
    each kept batch only once: what the README's figures for them rest on."""
    script = ("python /repo/benchmarks/bench_input.py --device cpu --model resnet18 --image-size 32"
              " --batch-size 16 --images 64 --classes 4 --max-side 96 --epochs 3"
              " --rows device-replay,device-decode-once --jpeg-dir /tmp/bi --out /tmp/bi.json"
              " && cat /tmp/bi.json")
    logs = run_repo_script(run_in_image, script)
    rows = {r["label"]: r for r in json.loads(logs[logs.index("\n{") + 1:])["rows"]}
    # 64 images in batches of 16: 4 batches an epoch, 12 in 3 epochs.
    assert rows["device-replay"].get("batches") == {"loaded": 4, "replayed": 8, "decoded": 12}, rows
    assert rows["device-decode-once"].get("batches") == {"loaded": 4, "replayed": 8, "decoded": 4}, rows
    assert all(len(r.get("epoch_ips", [])) == 3 for r in rows.values()), rows


def test_bench_amp_compiles_as_a_uid_without_a_passwd_entry(run_in_image):
    """benchmarks/bench_amp.py started without the entrypoint as a UID with no passwd entry (as
    pyxis or a Kubernetes `command:` start it) should still torch.compile: Inductor names its
    cache after the user."""
    script = ("python /repo/benchmarks/bench_amp.py --device cpu --model resnet18 --image-size 32"
              " --batch-size 8 --steps 1 --warmup-steps 1 --only tuned --out /tmp/bench.json"
              " && cat /tmp/bench.json")
    code, logs = run_in_image(["bash", "-c", script], timeout=600, entrypoint="",
                              user="12345:12345",
                              volumes={str(ROOT / "benchmarks"): {"bind": "/repo/benchmarks",
                                                                  "mode": "ro"}})
    assert code == 0, f"bench_amp.py exited {code}:\n{logs}"
    report = json.loads(logs[logs.index("\n{") + 1:])
    runs = [m for m in report["matrix"] if m.get("compile") == "tuned"]
    assert len(runs) == 1 and "error" not in runs[0] and runs[0]["images_per_s"] > 0, (
        f"the compiled configuration did not run: {runs}")


# ---------------------------------------------------------------------------------------
# distributed: two containers as two nodes

def test_two_containers_train_as_two_nodes_over_c10d_rendezvous(start_container,
                                                                docker_network):
    """Two containers should form one 2-process DDP job (gloo); only global rank 0 logs/saves."""
    tag = uuid.uuid4().hex[:8]
    names = [f"train-amp-node0-{tag}", f"train-amp-node1-{tag}"]
    cmd = ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"{names[0]}:29500", "--rdzv-id", tag, "--max-restarts", "0",
           "/usr/local/bin/train_amp.py", *SYNTH, "--epochs", "1", "--log-every", "1",
           "--checkpoint-dir", "ck"]
    # hostname = name: torchrun advertises the hostname, which the network's DNS resolves.
    nodes = [start_container(cmd, name=n, hostname=n, network=docker_network.name,
                             environment={"GLOO_SOCKET_IFNAME": "eth0"}) for n in names]
    codes = [n.wait(timeout=420)["StatusCode"] for n in nodes]
    logs = [n.logs().decode(errors="replace") for n in nodes]
    for name, code, log in zip(names, codes, logs):
        assert code == 0, f"{name} exited {code}:\n{log}"
    leaders = [i for i, log in enumerate(logs) if re.search(r"^epoch 1/1: ", log, re.MULTILINE)]
    assert len(leaders) == 1, f"exactly one node should print summaries, got {leaders}:\n" + \
        "\n---\n".join(logs)
    lead, other = leaders[0], 1 - leaders[0]
    # 256 images / 2 ranks / 32 per batch: the DistributedSampler gives each rank 4 steps.
    assert "world_size=2" in logs[lead] and "steps/epoch=4 " in logs[lead], (
        f"not one 2-rank job with sharded data:\n{logs[lead]}")
    assert SUMMARY.search(logs[lead]) and "nan" not in logs[lead], (
        f"the 2-node job did not train to a finite loss:\n{logs[lead]}")
    assert read_from_container(nodes[lead], "/workspace/ck/last.pt"), "rank 0 saved nothing"
    assert read_from_container(nodes[other], "/workspace/ck/last.pt") is None, (
        "the non-zero rank wrote a checkpoint too")


def test_torchrun_two_processes_in_one_container_shard_the_data(run_in_image):
    """torchrun --nproc-per-node 2 should run one DDP job: half the steps, one set of logs."""
    code, logs = run_in_image(["torchrun", "--nproc-per-node", "2", "/usr/local/bin/train_amp.py",
                               *SYNTH, "--epochs", "1", "--log-every", "2"], timeout=420)
    assert code == 0, f"torchrun exited {code}:\n{logs}"
    assert "world_size=2" in logs and "steps/epoch=4 " in logs, f"not a 2-rank job:\n{logs}"
    assert len(SUMMARY.findall(logs)) == 1, f"expected one summary line (rank 0 only):\n{logs}"


def test_ranks_leave_together_once_rank_0_has_written_its_results(start_container):
    """A rank done training should wait for rank 0 to write its results (checkpoint, metrics)
    and leave with it, not tear down while rank 0 is still busy. Rank 0 writes its metrics
    into a FIFO here, so it stays busy until the test reads them."""
    c = start_container(["bash", "-c", "mkfifo /tmp/metrics.fifo && exec torchrun"
                         " --nproc-per-node 2 /usr/local/bin/train_amp.py " + shlex.join(SYNTH)
                         + " --epochs 1 --checkpoint-dir /tmp/ck --metrics /tmp/metrics.fifo"])
    wait_for_log(c, r"epoch 1/1: train_loss", timeout=420)
    time.sleep(3)  # a rank that does not wait has left by now
    # torchrun starts each rank as `python3 -u SCRIPT`; its own command line has no -u.
    _, ps = c.exec_run(["pgrep", "-fa", r"python3? -u /usr/local/bin/train_amp\.py"])
    ranks = ps.decode().splitlines()
    assert len(ranks) == 2, f"a rank left while rank 0 was still writing its results:\n{ps.decode()}"
    code, metrics = c.exec_run(["cat", "/tmp/metrics.fifo"])
    assert code == 0 and json.loads(metrics)["history"], f"no metrics from rank 0: {metrics!r}"
    status = c.wait(timeout=120)["StatusCode"]
    assert status == 0, f"torchrun exited {status}:\n{c.logs().decode(errors='replace')[-3000:]}"


def test_channels_last_flag_trains_in_nhwc_on_cpu(run_in_image):
    """--channels-last should switch the model and batches to NHWC (auto keeps NCHW on CPU)."""
    code, logs = run_in_image(["train_amp.py", *SYNTH, "--steps", "2", "--channels-last",
                               "--checkpoint-dir", ""])
    assert code == 0, f"exited {code}:\n{logs}"
    assert "channels_last=True" in logs and SUMMARY.search(logs), f"no NHWC epoch:\n{logs}"


# ---------------------------------------------------------------------------------------
# what the flags really do, seen in train_amp's own objects (not in its log line)

# Runs train_amp.main(argv) in-process with spies: the first convolution's output dtype and
# whether its input and weight are NHWC, the TF32 flags and how many train steps ran, and
# Dynamo's compiled-graph count. PROBE_STOP_AFTER=N sends itself SIGTERM after N steps (a
# preemption); PROBE_BREAK_RESUME=1 makes --resume keep only the weights (a broken resume).
# Prints "PROBE <label> {json}".
TRAIN_AMP_PROBE = r"""
import json, os, signal, sys, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp
import trainamp.trainer
from torch._dynamo.utils import counters
label, argv = sys.argv[1], sys.argv[2:]
seen = {"conv_out_dtype": set(), "conv_in_nhwc": set(), "conv_weight_nhwc": set(), "tf32": set(), "steps": 0}
trainer = trainamp.trainer  # the spies replace the functions where the trainer looks them up
real_build, real_step, real_load = trainer.build_model, trainer.train_step, trainer.load_checkpoint
def build_model(*a, **k):
    net = real_build(*a, **k)
    conv = next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d))
    def hook(mod, inp, out):
        seen["conv_out_dtype"].add(str(out.dtype))
        seen["conv_in_nhwc"].add(inp[0].is_contiguous(memory_format=torch.channels_last))
        seen["conv_weight_nhwc"].add(mod.weight.is_contiguous(memory_format=torch.channels_last))
    if "--compile" not in argv:  # Dynamo would trace the hook into the graph
        conv.register_forward_hook(hook)
    return net
def train_step(*a, **k):
    seen["tf32"].add((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
    seen["steps"] += 1
    out = real_step(*a, **k)
    if seen["steps"] == int(os.environ.get("PROBE_STOP_AFTER", 0)):
        os.kill(os.getpid(), signal.SIGTERM)
    return out
def load_checkpoint(*a, **k):
    ckpt = real_load(*a, **k)
    if os.environ.get("PROBE_BREAK_RESUME"):
        ckpt.update(epoch=0, step_in_epoch=0, global_step=0, history=[])
    return ckpt
trainer.build_model, trainer.train_step, trainer.load_checkpoint = build_model, train_step, load_checkpoint
code = train_amp.main(argv)
seen = {k: sorted(v) if isinstance(v, set) else v for k, v in seen.items()}
seen.update(exit=code, graphs=counters["stats"]["unique_graphs"], inductor=dict(counters["inductor"]))
print(f"PROBE {label} " + json.dumps(seen), flush=True)
"""


def probe_script(runs):
    """A bash script that writes the probe and runs it once per (label, env, args)."""
    lines = ["set -e", f"cat > /tmp/probe.py <<'PYEOF'\n{TRAIN_AMP_PROBE}PYEOF"]
    for label, env, args in runs:
        lines.append(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), "python3 /tmp/probe.py",
                               label, *map(shlex.quote, args)]))
    return "\n".join(lines) + "\n"


def probes(logs):
    return {label: json.loads(data) for label, data in re.findall(r"^PROBE (\S+) (.*)$", logs, re.MULTILINE)}


@pytest.fixture(scope="module")
def flag_probes(docker_client, image_ref, module_containers):
    """Two-step synthetic runs: AMP bf16 + channels_last; AMP off + NCHW; AMP off + --tf32."""
    few = [*SYNTH, "--steps", "2", "--checkpoint-dir", ""]
    script = probe_script([
        ("bf16-nhwc", {}, [*few, "--amp", "bf16", "--channels-last"]),
        ("off-nchw", {}, [*few, "--amp", "off", "--channels-last", "off"]),
        ("off-tf32", {}, [*few, "--amp", "off", "--tf32"]),
    ])
    c = docker_client.containers.run(image_ref, ["bash", "-c", script], detach=True, shm_size="1g")
    module_containers.append(c)
    code = c.wait(timeout=600)["StatusCode"]
    logs = c.logs().decode(errors="replace")
    assert code == 0, f"the probe runs failed ({code}):\n{logs}"
    seen = probes(logs)
    assert set(seen) == {"bf16-nhwc", "off-nchw", "off-tf32"}, f"missing probe results:\n{logs}"
    assert all(r["exit"] == 0 and r["steps"] == 2 for r in seen.values()), f"a probe run did not train:\n{logs}"
    return seen


def test_amp_bf16_on_cpu_runs_the_convolutions_in_bf16(flag_probes):
    """--amp bf16 on CPU should make the model's convolutions compute in bf16 (and --amp off in FP32)."""
    assert flag_probes["bf16-nhwc"]["conv_out_dtype"] == ["torch.bfloat16"], (
        f"--amp bf16: the first convolution's output should be bf16: {flag_probes['bf16-nhwc']}")
    # The contrast shows the probe tells the two apart.
    assert flag_probes["off-nchw"]["conv_out_dtype"] == ["torch.float32"], (
        f"--amp off: the first convolution's output should be FP32: {flag_probes['off-nchw']}")


def test_channels_last_flag_makes_the_weights_and_batches_nhwc(flag_probes):
    """--channels-last should give the convolutions NHWC weights and inputs (off: NCHW)."""
    on, off = flag_probes["bf16-nhwc"], flag_probes["off-nchw"]
    assert (on["conv_in_nhwc"], on["conv_weight_nhwc"]) == ([True], [True]), (
        f"--channels-last: input and weight of the first convolution should be NHWC: {on}")
    assert (off["conv_in_nhwc"], off["conv_weight_nhwc"]) == ([False], [False]), (
        f"--channels-last off: they should stay NCHW: {off}")


def test_amp_off_trains_with_tf32_off(flag_probes):
    """--amp off should train with TF32 off for matmuls and cuDNN (strict FP32); --tf32 turns it on."""
    assert flag_probes["off-nchw"]["tf32"] == [[False, False]], (
        f"--amp off: (matmul, cudnn) allow_tf32 during training should be off: {flag_probes['off-nchw']['tf32']}")
    assert flag_probes["off-tf32"]["tf32"] == [[True, True]], (
        f"--tf32: both should be on (and the probe able to see it): {flag_probes['off-tf32']['tf32']}")


@pytest.mark.parametrize("env, compiles", [({}, True), ({"TORCH_COMPILE_DISABLE": "1"}, False)],
                         ids=["image", "mutation-compile-disabled"])
def test_compile_flag_really_compiles_graphs(run_in_image, env, compiles):
    """--compile should make Dynamo/Inductor compile the model's graphs, not just log compile=True."""
    script = probe_script([("compile", env, [*SYNTH, "--steps", "2", "--compile", "--amp", "off",
                                             "--checkpoint-dir", ""])])
    code, logs = run_in_image(["bash", "-c", script], timeout=600)
    assert code == 0, f"the --compile probe failed ({code}):\n{logs}"
    seen = probes(logs)["compile"]
    assert seen["exit"] == 0 and seen["steps"] == 2, f"--compile did not train 2 steps: {seen}"
    compiled = seen["graphs"] > 0 and bool(seen["inductor"])
    assert compiled == compiles, (
        f"compiled graphs: {seen['graphs']}, Inductor counters: {seen['inductor']}; expected compiled={compiles}"
        f" (env {env}; train_amp logged compile=True either way: {'compile=True' in logs})")


def test_resume_with_more_steps_trains_the_rest_of_the_epoch_steps_cut_short(run_in_image):
    """--steps ending mid-epoch, then --resume with a larger --steps, should train exactly the
    steps in between, in that same epoch."""
    job = [*SYNTH, "--seed", "3", "--log-every", "2", "--checkpoint-dir", "ck"]
    script = probe_script([
        ("short", {}, [*job, "--steps", "3"]),
        ("longer", {}, [*job, "--steps", "8", "--resume", "--metrics", "longer.json"]),
    ]) + ("python3 -c 'import json; print(\"METRICS\", json.dumps(json.load(open(\"longer.json\"))"
          "[\"history\"]))'\nset -- ck/last.pt\n" + INSPECT_LAST + "\n")
    code, logs = run_in_image(["bash", "-c", script], timeout=600)
    assert code == 0, f"the runs failed ({code}):\n{logs}"
    seen = probes(logs)
    assert (seen["short"]["steps"], seen["longer"]["steps"]) == (3, 5), (
        f"--steps 3 then --resume --steps 8 should train 3 then 5 steps: {seen}\n{logs}")
    assert "resumed from ck/last.pt: epoch 1 step 3/8 (global step 3/8)" in logs, logs
    history = json.loads(re.search(r"^METRICS (.*)$", logs, re.MULTILINE).group(1))
    assert [(r["epoch"], r["steps"]) for r in history] == [(1, 8)], (
        f"one record of the whole epoch 1 (8 steps) expected: {history}")
    ckpt = json.loads(re.search(r"^CKPT (.*)$", logs, re.MULTILINE).group(1))
    assert ckpt["global_step"] == 8, f"ck/last.pt should be at global step 8: {ckpt}"


def test_resume_runs_only_the_remaining_steps_and_matches_a_fresh_run(run_in_image):
    """--resume should train only the steps left after a preemption and end where a fresh run ends."""
    job = [*SYNTH, "--steps", "8", "--seed", "3", "--log-every", "2"]
    script = probe_script([
        ("stopped", {"PROBE_STOP_AFTER": "3"}, [*job, "--checkpoint-dir", "ck"]),
    ]) + "cp -r ck ck-broken\n" + probe_script([
        ("resumed", {}, [*job, "--checkpoint-dir", "ck", "--resume", "--metrics", "resumed.json"]),
        ("fresh", {}, [*job, "--checkpoint-dir", "", "--metrics", "fresh.json"]),
        # The mutation: a resume that loads the weights but starts the job over.
        ("broken", {"PROBE_BREAK_RESUME": "1"}, [*job, "--checkpoint-dir", "ck-broken", "--resume"]),
    ]) + ("python3 -c 'import json; print(\"METRICS\", json.dumps([json.load(open(f))[\"history\"]"
          " for f in (\"resumed.json\", \"fresh.json\")]))'\n")
    code, logs = run_in_image(["bash", "-c", script], timeout=600)
    assert code == 0, f"the resume probes failed ({code}):\n{logs}"
    seen = probes(logs)
    assert [seen[k]["exit"] for k in ("stopped", "resumed", "fresh", "broken")] == [0, 0, 0, 0], (
        f"every run should exit 0:\n{logs}")
    assert re.search(r"stopped by SIGTERM at epoch 1 step 3/8", logs), f"the first run should stop after step 3:\n{logs}"
    assert (seen["stopped"]["steps"], seen["fresh"]["steps"]) == (3, 8), f"unexpected step counts: {seen}"
    assert seen["resumed"]["steps"] == 8 - 3, (
        f"--resume should run only the 5 remaining steps, ran {seen['resumed']['steps']}")
    assert seen["broken"]["steps"] == 8, f"the probe should count all 8 steps of a resume that starts over: {seen}"
    resumed, fresh = json.loads(re.search(r"^METRICS (.*)$", logs, re.MULTILINE).group(1))
    assert len(resumed) == len(fresh) == 1, f"one epoch each: {resumed} / {fresh}"
    for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
        assert resumed[0][key] == pytest.approx(fresh[0][key], rel=1e-5, abs=1e-6), (
            f"{key}: resumed {resumed[0][key]} != fresh run {fresh[0][key]}")
