"""A real Slurm cluster: a controller and two compute nodes, each a container of the image plus
Slurm's daemons and munge (tests/slurm-node/Dockerfile), on one Docker network, with a shared
volume at /shared standing for the cluster file system. Jobs are submitted with real `sbatch` as
the image's user and run slurm/train-srun.sbatch, the plain-srun script users copy (one task per
process, no torchrun: train_amp.py takes its rank from SLURM_*), with small CPU arguments, and the
torchrun scripts with pyxis and Apptainer stood in for. The nodes have GPUs as far as Slurm
knows (gres.conf over made-up device files), so its GPU binding is real: each task's
CUDA_VISIBLE_DEVICES, checked with train_amp.py --print-launch."""
import json
import math
import re
import shlex
import time
import warnings

import pytest
from conftest import SLOWDOWN
from slurm_cluster import (
    JOB_S,
    NODE_CPUS,
    NODE_FAIL_S,
    NODE_GPUS,
    TERMINAL,
    checkpoint_of,
    tar_of,
)
from train_amp_helpers import JOB_800, MAKE_FOLDER_800, SUMMARY, SYNTH

# Slurm's --time limits guard a hang, so they are stretched like every other guard (a job binding
# GPUs hit --time=5 at load 38). The 2-node jobs get three times as long.
JOB_MINUTES = math.ceil(5 * SLOWDOWN)
# The job: 2 nodes x 2 tasks over gloo; small enough for a shared 2-core machine.
TRAIN = [*SYNTH, "--device", "cpu", "--log-every", "1", "--progress", "lines",
         "--dist-timeout", "120"]
SBATCH = ["--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0",
          f"--time={3 * JOB_MINUTES}", "--chdir=/shared", "--output=/shared/out/%x-%j.out"]


def images_per_s(out):
    """The img/s of the last epoch summary line."""
    found = re.findall(r"^epoch \d+/\d+: .*\| (\d+) img/s", out, re.MULTILINE)
    return int(found[-1]) if found else None


def two_node_job(cluster, ck, epochs):
    """sbatch -N2 x 2 tasks of slurm/train-srun.sbatch, saving into `ck`, run to its end:
    (job record, its output, wall seconds)."""
    started = time.monotonic()
    job_id = cluster.sbatch(*SBATCH, "/shared/slurm/train-srun.sbatch", *TRAIN,
                            "--epochs", epochs, "--checkpoint-dir", ck)
    job = cluster.wait_job(job_id)
    wall = time.monotonic() - started
    out = cluster.output(job_id)
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (
        f"job {job_id} should complete: {job}\n{cluster.logs(job_id)}")
    if "leaving the job (destroying the process group) took over" in out:
        # The product's bound did its job (the run completes); the hang itself is worth seeing.
        warnings.warn(f"job {job_id}: a rank's teardown hung and was cut short:\n{out[-4000:]}", stacklevel=1)
    return job, out, wall


def test_two_node_job_trains_as_one_and_rank_0_alone_saves(slurm_cluster):
    """sbatch -N2 x 2 tasks of slurm/train-srun.sbatch should train one 4-rank job over gloo;
    every save should rename one last.pt into place (rank 0), not one per task."""
    cluster = slurm_cluster
    ck = "/shared/ck-once"
    # inotify on the shared volume counts every rename of last.pt, whichever node makes it.
    code, out = cluster.sh(f"mkdir -p {ck}")
    assert code == 0, out
    watch = f"exec inotifywait -m -q -e moved_to --format '%e %f' {ck} > /shared/renames.log 2>&1"
    cluster.ctl.exec_run(["bash", "-c", watch], user="dev", detach=True)
    time.sleep(1)  # the watch is in place before the job starts
    epochs = 2
    job, out, _ = two_node_job(cluster, ck, epochs)
    assert job["NumNodes"] == "2" and job["NumTasks"] == "4", f"not 2 nodes x 2 tasks: {job}"
    first = cluster.nodes[0].name
    assert "launch: srun" in out and "rank 0, world size 4, local rank 0 of 2" in out, (
        f"rank 0 should see an srun job of 4 tasks, 2 per node:\n{out}")
    assert f"master {first}:" in out, f"the master should be the first node, {first}:\n{out}"
    # 256 images / 4 ranks / 32 per batch = 2 steps per epoch: one job, not four copies.
    assert "world_size=4 " in out and "steps/epoch=2 " in out, out
    summaries = SUMMARY.findall(out)
    assert [int(e) for e, _ in summaries] == list(range(1, epochs + 1)), (
        f"one summary per epoch (rank 0 prints):\n{out}")
    _, listing = cluster.sh(f"ls -A {ck}")
    # .train_amp.lock is the run's lock on the folder (it stays; the flock is what locks).
    assert sorted(listing.split()) == [".train_amp.lock", "last.pt"], (
        f"{ck} should hold last.pt alone (beside the run's lock file): {listing}")
    assert checkpoint_of(cluster, f"{ck}/last.pt") == {"global_step": 2 * epochs, "world_size": 4}
    _, renames = cluster.sh("cat /shared/renames.log")
    saves = [ln for ln in renames.splitlines() if ln.split()[-1:] == ["last.pt"]]
    assert len(saves) == epochs, (
        f"one save per epoch, by rank 0 alone, expected {epochs} renames of last.pt:\n{renames}")


# Slow (make test-slow, weekly): a measurement, not a promise (docs/clusters.md quotes it); the
# job itself is the test above.
@pytest.mark.slow
def test_two_node_job_is_on_par_with_the_same_processes_in_one_container(slurm_cluster,
                                                                         run_in_image, artifacts):
    """The 2 x 2-task Slurm job and torchrun's 4 processes in one container (same flags) should
    both train; their wall times and images/s go to artifacts/slurm-vs-one-container.json."""
    epochs = 2
    _, out, wall = two_node_job(slurm_cluster, "/shared/ck-par", epochs)
    single_start = time.monotonic()
    code, single = run_in_image(["torchrun", "--nproc-per-node", "4", "/usr/local/bin/train_amp.py",
                                 *map(str, TRAIN), "--epochs", str(epochs),
                                 "--checkpoint-dir", "/tmp/ck"], timeout=JOB_S)
    single_wall = time.monotonic() - single_start
    assert code == 0 and "world_size=4 " in single, f"the one-container run failed:\n{single[-4000:]}"
    figures = {"slurm_2x2": {"wall_s": round(wall, 1), "images_per_s": images_per_s(out)},
               "one_container_torchrun_4": {"wall_s": round(single_wall, 1),
                                            "images_per_s": images_per_s(single)}}
    (artifacts / "slurm-vs-one-container.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(f"\nSlurm job vs one container: {json.dumps(figures)}")


def test_killed_node_requeues_the_job_and_it_continues_from_its_checkpoint(slurm_cluster):
    """A node killed mid-job should requeue the job (slurm/train-srun.sbatch asks for --requeue)
    within a bounded time, not leave it hanging; once the node is back, the same command line
    (--auto-resume) should continue from the last checkpoint and finish."""
    cluster = slurm_cluster
    ck = "/shared/ck-resume"
    # 512 images / 4 ranks / 32 = 4 steps per epoch, 2 epochs, a checkpoint every 2 steps: the
    # node dies right after the first (step 2), leaving 6 steps for the requeued run.
    args = [*TRAIN, "--synthetic-size", "512", "--epochs", "2", "--save-every", "2",
            "--checkpoint-dir", ck]
    phases, mark = {}, time.monotonic()
    job_id = cluster.sbatch(*SBATCH, "/shared/slurm/train-srun.sbatch", *args)
    deadline = time.monotonic() + JOB_S * SLOWDOWN
    # A cheap look (no Python, no torch: the tasks have the CPU); last.pt appears by a rename,
    # whole. What it holds is read once the job has lost its node.
    while cluster.sh(f"test -e {ck}/last.pt")[0] != 0:
        job = cluster.job(job_id)
        if job.get("JobState") in TERMINAL or time.monotonic() > deadline:
            pytest.fail(f"no checkpoint before the job ended or {JOB_S}s passed ({job}):\n"
                        f"{cluster.logs(job_id)}")
        time.sleep(0.5)
    victim = cluster.nodes[1]
    victim.kill()
    killed = time.monotonic()
    phases["to the first checkpoint"], mark = killed - mark, killed
    while int(cluster.job(job_id).get("Restarts") or 0) < 1:
        job = cluster.job(job_id)
        if job.get("JobState") in TERMINAL or time.monotonic() - killed > NODE_FAIL_S * SLOWDOWN:
            pytest.fail(f"a job that lost a node should be requeued within {NODE_FAIL_S * SLOWDOWN:.0f}s: {job}"
                        f"\n{cluster.logs(job_id)}")
        time.sleep(1)
    took = time.monotonic() - killed
    phases["kill to requeue"], mark = took, time.monotonic()
    job = cluster.job(job_id)
    print(f"\njob {job_id}: requeued {took:.0f}s after {victim.name} was killed"
          f" ({job.get('JobState')}, Reason={job.get('Reason')})")
    # Pending: the job needs both nodes, so nothing writes the checkpoint until the node is back.
    saved = checkpoint_of(cluster, f"{ck}/last.pt")
    assert saved and 0 < saved["global_step"] < 8, f"a mid-job checkpoint should be left: {saved}"

    # The node comes back (a reboot): slurmd registers, Slurm returns it to service and starts
    # the requeued job, which runs the same batch script again. Slurm holds a requeued job about
    # 2 minutes first (Reason=BeginTime; 121 s here): that wait is Slurm's, not the script's, so
    # the test lifts it as an admin can (scontrol update StartTime=now) instead of sleeping, once
    # both nodes are idle: lifted before the first run's step had ended on node0, the requeued
    # batch started beside it and the old step's SIGTERM ended it (exit 143; CI, 2026-12-08).
    victim.start()
    cluster.wait_idle()
    code, out = cluster.sh(f"scontrol update JobId={job_id} StartTime=now", user="root")
    assert code == 0, f"the requeued job's start time was not moved to now: {out}"
    job = cluster.wait_job(job_id)
    phases["node back to the end"] = time.monotonic() - mark
    print("phases (s): " + json.dumps({k: round(v) for k, v in phases.items()}))
    out = cluster.output(job_id)
    assert job["JobState"] == "COMPLETED", f"the requeued job should complete: {job}\n{cluster.logs(job_id)}"
    resumed = re.search(r"resumed from \S+: epoch \d+ step \d+/4 \(global step (\d+)/8\)", out)
    assert resumed and int(resumed.group(1)) == saved["global_step"], (
        f"the job should resume at global step {saved['global_step']}:\n{out}")
    assert "epoch 2/2:" in out and checkpoint_of(cluster, f"{ck}/last.pt")["global_step"] == 8, out


# `apptainer exec [--nv] [--bind X] IMAGE CMD...` -> CMD: the nodes already are the image, so the
# script's srun -> torchrun -> train_amp.py path runs for real; only the container runtime is not.
# A bind whose source is missing ends the job, as apptainer does.
APPTAINER_SHIM = """#!/bin/bash
[ "$1" = exec ] || { echo "apptainer shim: only exec, got $1" >&2; exit 99; }
shift
while [ "$#" -gt 0 ]; do
  case $1 in
    --nv) shift ;;
    --bind|-B)
      IFS=, read -ra binds <<< "$2"
      for b in "${binds[@]}"; do
        [ -e "${b%%:*}" ] || { echo "apptainer shim: bind source ${b%%:*} does not exist" >&2; exit 98; }
      done
      shift 2 ;;
    -*) echo "apptainer shim: unknown option $1" >&2; exit 99 ;;
    *) shift; break ;;
  esac
done
echo "apptainer shim on $(hostname): $*" >&2
exec "$@"
"""


def test_torchrun_script_forms_one_job_across_nodes_over_c10d(slurm_cluster):
    """slurm/train-apptainer.sbatch (apptainer exec stood in for) should start one torchrun per
    node that meet at the c10d rendezvous on the first node: one 4-process job, not two."""
    cluster = slurm_cluster
    # A folder of its own: the cluster is shared, and the pyxis test puts an srun shim in another.
    cluster.ctl.put_archive("/shared", tar_of({"bin-apptainer/apptainer": (APPTAINER_SHIM.encode(), 0o755)}))
    ck = "/shared/ck-torchrun"
    _, path = cluster.sh("echo $PATH")
    job_id = cluster.sbatch(
        *SBATCH, "--ntasks-per-node=1", f"--cpus-per-task={NODE_CPUS}",
        "/shared/slurm/train-apptainer.sbatch", *TRAIN, "--epochs", 1, "--checkpoint-dir", ck,
        env={"SIF": "/shared/team-dl.sif", "GPUS_PER_NODE": "2",
             "PATH": f"/shared/bin-apptainer:{path.strip()}"})
    job = cluster.wait_job(job_id)
    out = cluster.output(job_id)
    # No BINDS: nothing is bound (a default /data would end the job where there is none).
    assert job["JobState"] == "COMPLETED" and job["NumTasks"] == "2", (
        f"job {job_id} should complete with one task per node: {job}\n{cluster.logs(job_id)}")
    shims = re.findall(r"^apptainer shim on (\S+): torchrun ", out, re.MULTILINE)
    assert sorted(shims) == sorted(n.name for n in cluster.nodes), f"one torchrun per node:\n{out}"
    port = 10000 + int(job_id) % 20000  # train_amp.py's rule under bare srun: one per job
    assert f"--rdzv-endpoint={cluster.nodes[0].name}:{port} " in out, (
        f"the rendezvous should be on the first node at port {port}:\n{out}")
    assert "launch: torchrun: rank 0, world size 4, local rank 0 of 2" in out, out
    assert "world_size=4 " in out and "steps/epoch=2 " in out and SUMMARY.search(out), out
    assert checkpoint_of(cluster, f"{ck}/last.pt") == {"global_step": 2, "world_size": 4}


# Slow (make test-slow, weekly): two 16-step jobs side by side, the suite's longest test after the
# killed-node requeue, which keeps the requeue and resume from a checkpoint in CI.
@pytest.mark.slow
def test_requeued_job_resumes_and_ends_with_the_weights_of_an_uninterrupted_run(slurm_cluster):
    """slurm/train-srun.sbatch warned of its time limit (USR1 to the batch shell, as
    --signal=B:USR1@120 sends it) should checkpoint, requeue itself, continue with the same
    command line (--auto-resume) and end with the same weights as an uninterrupted job."""
    cluster = slurm_cluster
    script = "/shared/slurm/train-srun.sbatch"
    # 1024 images / 4 ranks / 32 = 8 steps per epoch, 2 epochs; the same seed in both jobs.
    args = [*TRAIN, "--synthetic-size", "1024", "--epochs", "2", "--seed", "3"]
    # Both jobs at once: each takes 2 of a node's 4 CPUs, so the cluster runs them side by side
    # (each at its own rendezvous port), as it would two users' jobs.
    whole = cluster.sbatch(*SBATCH, script, *args, "--checkpoint-dir", "/shared/ck-whole")
    job_id = cluster.sbatch(*SBATCH, script, *args, "--checkpoint-dir", "/shared/ck-requeued")
    deadline = time.monotonic() + JOB_S * SLOWDOWN
    while not re.search(r"^epoch 1/2 step [3-6]/8 ", cluster.output(job_id), re.MULTILINE):
        job = cluster.job(job_id)
        if job.get("JobState") in TERMINAL or time.monotonic() > deadline:
            pytest.fail(f"the job did not reach step 3 ({job}):\n{cluster.logs(job_id)}")
        time.sleep(0.2)
    code, out = cluster.sh(f"scancel --batch --signal=USR1 {job_id}")  # what Slurm sends
    assert code == 0, out
    job = cluster.wait_job(whole)
    assert job["JobState"] == "COMPLETED", f"the uninterrupted job failed: {job}\n{cluster.logs(whole)}"
    job = cluster.wait_job(job_id)
    out = cluster.output(job_id)
    assert job["JobState"] == "COMPLETED" and job.get("Restarts") == "1", (
        f"the job should requeue once and complete: {job}\n{cluster.logs(job_id)}")
    stopped = re.search(r"^stopped by SIGUSR1 at epoch 1 step (\d)/8 \(global step (\d+)/16\)"
                        r".*exit status 75: requeue the job$", out, re.MULTILINE)
    assert stopped and "train-amp: requeueing job" in out, f"no checkpoint-and-requeue:\n{out}"
    assert re.search(rf"^resumed from /shared/ck-requeued/last\.pt: epoch 1 step {stopped[1]}/8"
                     rf" \(global step {stopped[2]}/16\)$", out, re.MULTILINE), (
        f"the requeued run should continue at global step {stopped[2]}:\n{out}")
    code, cmp = cluster.sh(
        "python3 -c 'import sys,torch\n"
        "a, b = (torch.load(p, map_location=\"cpu\", weights_only=True) for p in sys.argv[1:])\n"
        "print(\"STEPS\", a[\"global_step\"], b[\"global_step\"])\n"
        "d = max((x.double() - b[\"model\"][k].double()).abs().max().item()\n"
        "        for k, x in a[\"model\"].items() if x.is_floating_point())\n"
        "print(\"MAXDIFF\", d)' /shared/ck-whole/last.pt /shared/ck-requeued/last.pt")
    assert code == 0 and "STEPS 16 16" in cmp, f"both jobs should end at global step 16:\n{cmp}"
    diff = float(cmp.split()[-1])
    print(f"\nrequeued at global step {stopped[2]}; final weights vs uninterrupted: max |diff| {diff:g}")
    # Not bit-equal across processes: DDP rebuilds its gradient buckets after the first step of
    # each run, so a run that restarts mid-job lays the gradients out differently in gloo's ring
    # all-reduce, which then adds the 4 ranks' values in another order (measured: 1.7e-10). In
    # one process a resume is bit-exact, and one that skips a batch moved the weights by 0.15.
    assert diff <= 1e-6, f"the requeued job's final weights differ by {diff:g}:\n{cmp}"




def test_scancel_saves_the_checkpoint_though_the_dataloader_workers_get_sigterm_too(slurm_cluster):
    """`scancel JOB` signals every process of the job's steps, DataLoader workers included, and
    SIGKILLs them KillWait (30 s) later: train_amp.py decoding an ImageFolder in 2 workers should
    still save at the step it reached (a worker's death used to end it without a checkpoint)."""
    cluster = slurm_cluster
    code, out = cluster.sh(f"mkdir -p /shared/stopdata && cd /shared/stopdata && {MAKE_FOLDER_800}")
    assert code == 0, f"the data folder was not made:\n{out}"
    job_id = cluster.sbatch(
        "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2", "--gpus-per-node=0",
        f"--time={3 * JOB_MINUTES}", "--chdir=/shared/stopdata", "--output=/shared/out/%x-%j.out",
        "/shared/slurm/train-srun.sbatch", *shlex.split(JOB_800)[1:], "--device", "cpu")
    deadline = time.monotonic() + JOB_S * SLOWDOWN
    while not re.search(r"^epoch 1/3 step ([3-9]|[1-9][0-9])/100 ", cluster.output(job_id),
                        re.MULTILINE):
        job = cluster.job(job_id)
        if job.get("JobState") in TERMINAL or time.monotonic() > deadline:
            pytest.fail(f"the job did not reach step 3 ({job}):\n{cluster.logs(job_id)}")
        time.sleep(0.2)
    code, out = cluster.sh(f"scancel {job_id}")
    assert code == 0, out
    job = cluster.wait_job(job_id)
    out = cluster.output(job_id)
    stopped = re.search(r"^stopped by SIGTERM at epoch 1 step (\d+)/100 .*checkpoint saved", out,
                        re.MULTILINE)
    assert stopped and "killed by signal" not in out, (
        f"the job should save on scancel ({job.get('JobState')}):\n{cluster.logs(job_id)}")
    ckpt = checkpoint_of(cluster, "/shared/stopdata/ck/last.pt")
    assert ckpt and ckpt["global_step"] == int(stopped[1]), (
        f"last.pt should hold step {stopped[1]}, holds {ckpt}:\n{out}")


# GPU binding: each task's launch plan (train_amp.py --print-launch), one line per process.
PLAN = re.compile(r"^launch plan: launcher=(?P<launcher>\S+) rank=(?P<rank>\d+) world=(?P<world>\d+)"
                  r" local_rank=(?P<local_rank>\d+) local_world=(?P<local_world>\d+)"
                  r" device=(?P<device>\S+)(?: gpu=(?P<gpu>\S+))?"
                  r" CUDA_VISIBLE_DEVICES=(?P<visible>\S+)", re.MULTILINE)
# Two steps in one job of 3 tasks and 8 GPUs per node: each task bound to 2 GPUs (3 tasks, 2
# visible each: cuda:LOCAL_RANK does not exist for local rank 2), then 2 tasks given 1 GPU
# between them. Every task prints its plan; a marker line ends each step.
BIND_JOB = """#!/bin/bash
plan() { srun "$@" python3 /usr/local/bin/train_amp.py --print-launch; echo "=== step exit $?"; }
plan --gpus-per-task=2
plan --nodes=1 --ntasks=2 --gpus-per-node=1
"""


def plans_of(text):
    return sorted((m.groupdict() for m in PLAN.finditer(text)), key=lambda p: int(p["rank"]))


def test_srun_tasks_bound_to_a_few_gpus_each_use_their_own(slurm_cluster):
    """Tasks that Slurm shows only their own GPUs (--gpus-per-task=2, 3 tasks per node) should
    each use one of theirs, no two on one GPU; 2 tasks given 1 GPU should refuse, saying so."""
    cluster = slurm_cluster
    cluster.ctl.put_archive("/shared", tar_of({"bind.sh": (BIND_JOB.encode(), 0o755)}))
    job_id = cluster.sbatch("--nodes=2", "--ntasks-per-node=3", "--cpus-per-task=1",
                            f"--gpus-per-node={NODE_GPUS}", f"--time={JOB_MINUTES}", "--chdir=/shared",
                            "--output=/shared/out/%x-%j.out", "/shared/bind.sh")
    job = cluster.wait_job(job_id)
    out = cluster.output(job_id)
    steps = out.split("=== step exit ")
    assert job["JobState"] == "COMPLETED" and len(steps) == 3, f"{job}\n{cluster.logs(job_id)}"
    bound, (bound_exit, shared), shared_exit = steps[0], steps[1].split("\n", 1), steps[2].strip()
    assert bound_exit == "0", f"the step of bound tasks should succeed:\n{out}"
    plans = plans_of(bound)
    assert [int(p["rank"]) for p in plans] == list(range(6)), f"6 tasks should print a plan:\n{out}"
    for p in plans:
        local = int(p["local_rank"])
        assert local == int(p["rank"]) % 3, f"3 tasks per node, in blocks: {p}\n{out}"
        # Slurm numbers the node's GPUs 0-7 and gives task L GPUs 2L and 2L+1 (gres.conf order).
        want = {"launcher": "slurm", "world": "6", "local_world": "3",
                "visible": f"{2 * local},{2 * local + 1}", "device": f"cuda:{local % 2}",
                "gpu": str(2 * local + local % 2)}
        assert {k: p[k] for k in want} == want, f"rank {p['rank']}: {p}, expected {want}\n{out}"
    refused = plans_of(shared)
    assert len(refused) == 2 and all(p["device"] == "none" for p in refused), (
        f"2 tasks on 1 GPU should be refused, each printing device=none:\n{shared}")
    assert shared.count("2 processes on this node but 1 GPU(s) for them") == 2, shared
    assert shared_exit != "0", f"that step should fail:\n{shared}"


# `srun --container-image=I --container-mounts=M --container-workdir=W CMD...` -> srun CMD: pyxis
# stood in for on nodes that already are the image. A mount whose source is missing ends the
# job, as pyxis does (enroot cannot mount it).
PYXIS_SHIM = """#!/bin/bash
args=()
for a in "$@"; do
  case $a in
    --container-mounts=*)
      IFS=, read -ra mounts <<< "${a#*=}"
      for m in "${mounts[@]}"; do
        [ -e "${m%%:*}" ] || { echo "pyxis shim: mount source ${m%%:*} does not exist" >&2; exit 98; }
      done ;;
    --container-*) ;;
    *) args+=("$a") ;;
  esac
done
echo "pyxis shim on $(hostname): srun ${args[*]}" >&2
exec /usr/bin/srun "${args[@]}"
"""


def test_pyxis_script_starts_one_process_per_allocated_gpu_at_a_port_of_its_own(slurm_cluster):
    """slurm/train-pyxis.sbatch (pyxis stood in for) with --gpus-per-node=2 should start 2
    processes per node, each on its GPU, meeting at a port derived from the job id, with no
    data mount unless asked for."""
    cluster = slurm_cluster
    cluster.ctl.put_archive("/shared", tar_of({"bin-pyxis/srun": (PYXIS_SHIM.encode(), 0o755)}))
    _, path = cluster.sh("echo $PATH")
    job_id = cluster.sbatch(
        "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=2", "--gpus-per-node=2", f"--time={JOB_MINUTES}",
        "--chdir=/shared", "--output=/shared/out/%x-%j.out", "/shared/slurm/train-pyxis.sbatch",
        "--print-launch", env={"IMAGE": "team-dl.sqsh", "PATH": f"/shared/bin-pyxis:{path.strip()}"})
    job = cluster.wait_job(job_id)
    out = cluster.output(job_id)
    assert job["JobState"] == "COMPLETED", f"job {job_id} should complete: {job}\n{cluster.logs(job_id)}"
    port = 10000 + int(job_id) % 20000  # train_amp.py's rule under bare srun: one per job
    assert (f"--nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint={cluster.nodes[0].name}:{port} "
            in out), f"2 processes per node, rendezvous at port {port} of the first node:\n{out}"
    plans = plans_of(out)
    assert [int(p["rank"]) for p in plans] == list(range(4)), f"4 processes should print:\n{out}"
    for p in plans:
        want = {"launcher": "torchrun", "world": "4", "local_world": "2", "visible": "0,1",
                "device": f"cuda:{p['local_rank']}", "gpu": p["local_rank"]}
        assert {k: p[k] for k in want} == want, f"rank {p['rank']}: {p}, expected {want}\n{out}"
