"""What train_amp.py's flags really do, seen in its log line and, through in-process probes, in
its own objects: AMP dtypes, channels_last, TF32, --compile; resume step counts."""
import json
import re
import shlex

import pytest
from conftest import BARE_EXEC, SLOWDOWN, with_container_env
from train_amp_helpers import INSPECT_LAST, SUMMARY, SYNTH

# ---------------------------------------------------------------------------------------
# --compile and --channels-last, as the log line shows them

# Plain --compile: test_compile_flag_compiles_graphs_as_a_nameless_uid_on_a_read_only_root below
# (the suite's one compile; test_cluster.py's nameless-UID runs are eager).

# Slow (a compile) and guarding one flag's mapping: make test-slow, weekly in CI.
@pytest.mark.slow
def test_compile_tuned_turns_on_kernel_tuning_and_trains(run_in_image):
    """--compile tuned should compile with Inductor's coordinate-descent tuning on and train."""
    code, logs = run_in_image(["train_amp.py", *SYNTH, "--steps", "2", "--compile", "tuned",
                               "--amp", "off", "--checkpoint-dir", ""], timeout=600)
    assert code == 0, f"--compile tuned run exited {code}:\n{logs}"
    assert "compile=True (tuned)" in logs, f"tuning not in force:\n{logs}"
    assert SUMMARY.search(logs), f"no compiled epoch:\n{logs}"


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
def flag_probe_runs(docker_client, image_ref, module_containers):
    """Two-step synthetic runs: AMP bf16 + channels_last; AMP off + NCHW; AMP off + --tf32.
    -> (probes(logs), logs)."""
    few = [*SYNTH, "--steps", "2", "--checkpoint-dir", ""]
    script = probe_script([
        ("bf16-nhwc", {}, [*few, "--amp", "bf16", "--channels-last"]),
        ("off-nchw", {}, [*few, "--amp", "off", "--channels-last", "off"]),
        ("off-tf32", {}, [*few, "--amp", "off", "--tf32"]),
    ])
    c = docker_client.containers.run(image_ref, ["bash", "-c", script], **with_container_env({"detach": True, "shm_size": "1g"}))
    module_containers.append(c)
    code = c.wait(timeout=600 * SLOWDOWN)["StatusCode"]
    logs = c.logs().decode(errors="replace")
    assert code == 0, f"the probe runs failed ({code}):\n{logs}"
    seen = probes(logs)
    assert set(seen) == {"bf16-nhwc", "off-nchw", "off-tf32"}, f"missing probe results:\n{logs}"
    assert all(r["exit"] == 0 and r["steps"] == 2 for r in seen.values()), f"a probe run did not train:\n{logs}"
    return seen, logs


@pytest.fixture(scope="module")
def flag_probes(flag_probe_runs):
    return flag_probe_runs[0]


def test_channels_last_flag_trains_in_nhwc_on_cpu(flag_probe_runs):
    """--channels-last should switch the model and batches to NHWC (auto keeps NCHW on CPU)."""
    # The bf16-nhwc probe is train_amp.py --channels-last: its output, up to its PROBE line.
    logs = flag_probe_runs[1]
    logs = logs[:logs.index("PROBE bf16-nhwc")]
    assert "channels_last=True" in logs and SUMMARY.search(logs), f"no NHWC epoch:\n{logs}"


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


# The suite's one plain --compile run (a compile takes a minute on 2 cores), made the hardest way:
# as pyxis, Kubernetes and Apptainer run the image (no entrypoint, a UID with no passwd entry, a
# read-only root; /tmp:exec, where Inductor writes its kernels). Inductor names its cache after
# getpass.getuser(), which has no user name here but the venv's start-up hook's; the kernels are
# built with the image's own g++. The mutation row shows the probe tells a compile from eager.
@pytest.mark.parametrize("env, compiles", [({}, True), ({"TORCH_COMPILE_DISABLE": "1"}, False)],
                         ids=["image", "mutation-compile-disabled"])
def test_compile_flag_compiles_graphs_as_a_nameless_uid_on_a_read_only_root(run_in_image, env,
                                                                           compiles):
    """--compile should make Dynamo/Inductor compile the model's graphs, not just log compile=True,
    and train with them as UID 12345 with no passwd entry on a read-only root; plain --compile
    turns no kernel tuning on."""
    script = probe_script([("compile", env, [*SYNTH, "--steps", "2", "--compile", "--amp", "off",
                                             "--checkpoint-dir", ""])])
    code, logs = run_in_image(["bash", "-c", script], timeout=600, **BARE_EXEC)
    assert code == 0, f"the --compile probe failed ({code}):\n{logs[-6000:]}"
    seen = probes(logs)["compile"]
    assert seen["exit"] == 0 and seen["steps"] == 2, f"--compile did not train 2 steps: {seen}"
    assert "world_size=1 " in logs and "compile=True" in logs, f"no --compile run:\n{logs[-6000:]}"
    assert "(tuned)" not in logs, f"plain --compile turned kernel tuning on:\n{logs[-6000:]}"
    assert SUMMARY.search(logs) and "nan" not in logs, f"no finite epoch summary:\n{logs[-6000:]}"
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
