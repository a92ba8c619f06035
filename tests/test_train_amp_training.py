"""A short train_amp.py run on synthetic data in the image, on CPU: one summary line per epoch,
--amp auto, the checkpoint's contents, TensorBoard, the progress bar; the AMP step's order."""
import json
import pathlib
import re

import pytest
from train_amp_helpers import SUMMARY, SYNTH, run_to_end

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
