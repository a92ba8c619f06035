"""train_amp.py (issue 5), run inside fresh containers of the image on CPU: the command line,
AMP step order, checkpoints/SIGTERM/resume, --compare, data sources and two-node torchrun."""
import io
import json
import re
import tarfile
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
    code = c.wait(timeout=timeout)["StatusCode"]
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
    """train_amp.py should be on PATH and --help should document every option of the issue."""
    code, logs = run_in_image(["train_amp.py", "--help"])
    assert code == 0, f"--help exited {code}:\n{logs}"
    for option in ("--model", "--data", "--epochs", "--steps", "--batch-size", "--lr", "--amp",
                   "--channels-last", "--compile", "--grad-clip", "--num-workers",
                   "--checkpoint-dir", "--resume", "--seed", "--benchmark", "--compare",
                   "--tensorboard", "digits", "synthetic", "ImageFolder", "torchrun"):
        assert option in logs, f"--help does not mention {option}:\n{logs}"


@pytest.mark.parametrize("args, env, fix", [
    (["--model", "resnet5O"], {}, "did you mean resnet50"),
    (["--data", "/no/such/folder"], {}, "give an ImageFolder path"),
    (["--batch-size", "0"], {}, "--batch-size 64"),
    (["--amp", "fp16"], {}, "on CPU use --amp bf16"),
    # Inductor compiles with $CXX: pointing it at nothing is "no compiler" without breaking
    # the image for other tests.
    (["--compile"], {"CXX": "/nonexistent/g++"}, "install g++"),
], ids=["unknown-model", "missing-data-path", "batch-size-0", "fp16-on-cpu",
        "compile-without-compiler"])
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


def test_amp_auto_on_cpu_is_bf16_autocast_without_grad_scaler(synthetic_run):
    """Container should resolve --amp auto to bf16 on CPU, with the GradScaler off."""
    logs, _ = synthetic_run
    assert "amp=bf16 (auto) grad_scaler=False" in logs, f"unexpected AMP set-up:\n{logs}"


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

# bf16 autocast (the CPU default). At 32 px it is bit-reproducible; at 16 px torch 2.6's oneDNN
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


def test_benchmark_times_steps_and_writes_json(start_container):
    """--benchmark should time steps on a device-resident batch and write benchmark.json."""
    c = start_container(["train_amp.py", "--benchmark", "--model", "resnet18", "--image-size",
                         "32", "--batch-size", "8", "--steps", "3", "--warmup-steps", "1",
                         "--out", "bench"])
    code = c.wait(timeout=300)["StatusCode"]
    logs = c.logs().decode(errors="replace")
    assert code == 0, f"exited {code}:\n{logs}"
    assert re.search(r"benchmark resnet18 batch 8 32px amp=bf16 .*: [\d.]+ images/s", logs), logs
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


def test_bench_amp_script_measures_matrix_and_jpeg_parts_on_cpu(run_in_image):
    """scripts/bench_amp.py (the GPU benchmark) should run its parts end to end: tiny on CPU."""
    script = ("python /repo/scripts/bench_amp.py --device cpu --model resnet18 --image-size 32"
              " --batch-size 8 --steps 1 --warmup-steps 1 --only matrix-eager,jpeg"
              " --precisions fp32-strict,amp-bf16 --jpeg-images 48 --jpeg-dir /tmp/jpegs"
              " --out /tmp/bench.json && cat /tmp/bench.json")
    code, logs = run_in_image(["bash", "-c", script], timeout=600,
                              volumes={str(ROOT / "scripts"): {"bind": "/repo/scripts",
                                                               "mode": "ro"}})
    assert code == 0, f"bench_amp.py exited {code}:\n{logs}"
    assert "| amp-bf16 | on | off |" in logs and "### JPEG ImageFolder (48 images" in logs, logs
    report = json.loads(logs[logs.index("\n{") + 1:])
    assert len(report["matrix"]) == 4 and all(m["images_per_s"] > 0 for m in report["matrix"])
    runs = report["jpeg"]["runs"]
    assert runs and all(r.get("loader_only_ips", 0) > 0 and r.get("train_ips", 0) > 0
                        for r in runs), runs


# ---------------------------------------------------------------------------------------
# distributed: two containers as two nodes

@pytest.fixture
def docker_network(docker_client):
    """A user-defined bridge network (its DNS resolves container names); always removed,
    with any container still attached to it."""
    net = docker_client.networks.create(f"train-amp-{uuid.uuid4().hex[:10]}", driver="bridge")
    yield net
    net.reload()
    for c in net.containers:
        c.remove(force=True, v=True)
    net.remove()


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


def test_channels_last_flag_trains_in_nhwc_on_cpu(run_in_image):
    """--channels-last should switch the model and batches to NHWC (auto keeps NCHW on CPU)."""
    code, logs = run_in_image(["train_amp.py", *SYNTH, "--steps", "2", "--channels-last",
                               "--checkpoint-dir", ""])
    assert code == 0, f"exited {code}:\n{logs}"
    assert "channels_last=True" in logs and SUMMARY.search(logs), f"no NHWC epoch:\n{logs}"
