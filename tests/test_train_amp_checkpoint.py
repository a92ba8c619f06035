"""train_amp.py never loses or corrupts a checkpoint: a --checkpoint-dir holding another run,
--auto-resume, a diverging run, a full disk, unwritable or locked dirs, stale temp files."""
import json
import re
import shlex

import pytest
from train_amp_helpers import (
    INSPECT_LAST,
    STEP_FN,
    SUMMARY,
    SYNTH,
    command_output,
    run_to_end,
    show,
    steps_of,
)


def run_steps(docker_client, image_ref, module_containers, lines, what):
    """Run a script of `step NAME cmd` lines ending in INSPECT_LAST in one container:
    -> (steps_of its logs, the inspected checkpoint's summary)."""
    code, logs, c = run_to_end(docker_client, image_ref, ["bash", "-c", "\n".join(lines)])
    module_containers.append(c)
    assert code == 0, f"the {what} script failed ({code}):\n{logs}"
    return steps_of(logs), json.loads(re.search(r"^CKPT (.*)$", logs, re.MULTILINE).group(1))


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
    # --log-every 1: the loss is checked every step, so the run stops at the third NaN step.
    bad = ["train_amp.py", *SYNTH, "--lr", "1e6", "--grad-clip", "0", "--log-every", "1"]
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
    naming the first run's PID and host; the first run should go on, save and its last.pt load."""
    job = shlex.join(["train_amp.py", *SYNTH, "--epochs", "100", "--checkpoint-dir", "ck"])
    script = "\n".join([
        f"{job} > first.out 2> first.err & first=$!",
        # The first run holds the lock once its start line is out (the lock comes before it).
        # Up to 5 minutes: a guard against a hang, not a speed (a loaded machine starts slowly).
        "for _ in $(seq 3000); do grep -q ' amp=' first.out 2>/dev/null && break; sleep 0.1; done",
        # --steps 1: where the lock fails, the second run ends soon and the test with it.
        f"{job} --steps 1 > second.out 2> second.err; echo \"RC second $?\"",
        # 100 epochs outlast the second run's start however slow the machine; then the first is
        # stopped as a scheduler stops it: it saves (with the lock it holds) and exits 0.
        "kill -TERM $first; wait $first; echo \"RC first $?\"; echo \"PID first $first\"",
        "echo \"HOST $(hostname)\"; sed 's/^/OUT first /' first.out",
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
    stopped = re.search(r"^OUT first stopped by SIGTERM at .* \(global step (\d+)/800\): checkpoint"
                        r" saved to ck/last\.pt", logs, re.MULTILINE)
    assert stopped, f"the first run did not save when stopped:\n{logs}"
    ckpt = json.loads(re.search(r"^CKPT (.*)$", logs, re.MULTILINE).group(1))
    assert (ckpt or {}).get("global_step") == int(stopped.group(1)) and ckpt["finite"], (
        f"ck/last.pt is not the first run's save:\n{logs}")


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


@pytest.mark.parametrize("flags, message", [
    (["--checkpoint-dir", "d"],
     r"d/last\.pt exists but is not a file \(a directory\), so no checkpoint can be saved"),
    (["--checkpoint-dir", "d", "--auto-resume"], r"d/last\.pt exists but is not a file"),
    (["--checkpoint-dir", "ck", "--resume", "d/last.pt"],
     r"--resume: d/last\.pt is a directory, not a checkpoint file"),
], ids=["new-run", "auto-resume", "resume"])
def test_a_last_pt_that_is_a_directory_is_named_before_training(run_in_image, flags, message):
    """A last.pt that is a directory should stop the run at start (exit 2) saying so: not
    "no checkpoint" (it exists), and not a failed save after the whole training."""
    script = (f"mkdir -p d/last.pt && exec train_amp.py {shlex.join(SYNTH)} --epochs 1"
              f" {shlex.join(flags)}")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 2, f"exited {code}, expected 2:\n{logs}"
    assert re.search(r"^train_amp\.py: error: " + message, logs, re.MULTILINE), logs
    assert "no checkpoint at" not in logs and not SUMMARY.search(logs), f"it trained:\n{logs}"
