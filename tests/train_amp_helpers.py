"""What the tests/test_train_amp_*.py files share: the small train_amp.py jobs (SYNTH, DIGITS),
reading their output and files, running a container to its end, and the step/checkpoint scripts."""
import io
import re
import tarfile

from conftest import SLOWDOWN, remove_containers, with_container_env

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
    c = docker_client.containers.run(image_ref, command, detach=True, shm_size="1g", **with_container_env(kwargs))
    try:
        code = c.wait(timeout=timeout * SLOWDOWN)["StatusCode"]
    except Exception:
        remove_containers([c])  # a timed-out run must not outlive the test
        raise
    return code, c.logs().decode(errors="replace"), c


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


def show(run):
    return "\n".join(["stdout:", *run["out"], "stderr:", *run["err"]])


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

# An ImageFolder of 2 x 400 small JPEGs decoded by 2 DataLoader workers (the default for JPEG
# folders on the CPU): 100 steps an epoch, so that a stop after step 3 lands mid-epoch and the
# checkpoint can only be the stop's (an epoch end saves epoch E+1, step 0).
MAKE_FOLDER_800 = r"""python3 - <<'EOF'
import os
from PIL import Image
for k, colour in enumerate(((200, 30, 30), (30, 30, 200))):
    os.makedirs(f"imgs/class{k}", exist_ok=True)
    for i in range(400):
        Image.new("RGB", (40, 30), tuple((v + 3 * i) % 256 for v in colour)).save(
            f"imgs/class{k}/{i}.jpg")
EOF"""
JOB_800 = ("train_amp.py --data imgs --model resnet18 --image-size 32 --batch-size 8 --epochs 3"
           " --num-workers 2 --log-every 1 --progress lines --checkpoint-dir ck")
# "CKPT epoch step_in_epoch" of ck/last.pt, or "CKPT none".
CKPT_STEP = r"""python3 -c "
import os, torch
p = 'ck/last.pt'
if not os.path.exists(p): raise SystemExit(print('CKPT none'))
c = torch.load(p, weights_only=True)
print('CKPT', c['epoch'], c['step_in_epoch'])" """
