"""Beyond one machine: what schedulers and fast interconnects need from the image. RDMA verbs
for NCCL over InfiniBand/RoCE, PYTORCH_VERSION for enroot/pyxis, tini where it is not PID 1;
train_amp.py under srun/Kubeflow without torchrun, and the image run with no entrypoint as a
UID with no passwd entry on a read-only root filesystem."""
import json
import re
import time
import uuid

import pytest
from conftest import BARE, BARE_EXEC, SLOWDOWN
from train_amp_helpers import SUMMARY, SYNTH, read_from_container


def test_nccl_finds_the_rdma_verbs_library_and_providers(run_in_image):
    """Container should let NCCL dlopen libibverbs (else it silently uses TCP over IB/RoCE)."""
    script = (
        "import ctypes, glob\n"
        "for name in ('libibverbs.so.1', 'librdmacm.so.1'):\n"
        "    ctypes.CDLL(name)\n"  # NCCL's own loader asks for libibverbs.so.1 the same way
        "    print('loaded', name)\n"
        "print('providers', sorted(p.rsplit('/', 1)[1] for p in glob.glob('/usr/lib/*/libibverbs/lib*.so')))\n"
    )
    code, out = run_in_image(["python", "-c", script])
    assert code == 0, f"libibverbs/librdmacm should load:\n{out}"
    assert "loaded libibverbs.so.1" in out and "loaded librdmacm.so.1" in out, out
    providers = re.search(r"^providers (.*)$", out, re.MULTILINE).group(1)
    for hca in ("libmlx5", "libefa"):  # Mellanox/NVIDIA ConnectX and AWS EFA
        assert hca in providers, f"the {hca} verbs provider should be installed: {providers}"


def test_pytorch_version_is_declared_for_enroot(run_in_image):
    """Container should set PYTORCH_VERSION (enroot's hook sets RANK/WORLD_SIZE only then)."""
    script = "import os, torch; print('env', os.environ.get('PYTORCH_VERSION'), 'torch', torch.__version__)"
    code, out = run_in_image(["python", "-c", script])
    m = re.search(r"^env (\S+) torch ([^+\s]+)", out, re.MULTILINE)
    assert code == 0 and m, f"the check should run:\n{out}"
    assert m.group(1) == m.group(2), f"PYTORCH_VERSION should be torch's version: {m.groups()}"


def test_tini_reaps_without_warning_when_it_is_not_pid_1(run_in_image):
    """Container should run its tini as a subreaper, so it works (and is quiet) under another init."""
    # --init puts Docker's own init at PID 1, as Apptainer/enroot put something else there.
    code, out = run_in_image(["bash", "-c", "echo PID1=$(cat /proc/1/comm)"], init=True)
    assert code == 0 and "PID1=docker-init" in out, f"the command should run under Docker's init:\n{out}"
    assert "not running as PID 1" not in out and "subreaper" not in out, f"tini should not warn:\n{out}"


# ---------------------------------------------------------------------------------------
# train_amp.py under schedulers: srun, Kubeflow, torchrun inside srun (jobs across machines)

# Each case: the variables a launcher sets -> what launch_env() must make of them.
LAUNCH_CASES = {
    "nothing": ({}, {"launcher": "single", "rank": 0, "world": 1}),
    "torchrun": ({"TORCHELASTIC_RUN_ID": "j", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                  "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"},
                 {"launcher": "torchrun", "rank": 3, "world": 4, "local_rank": 1,
                  "local_world": 2, "master_addr": None}),
    # torchrun started by srun: the SLURM_* task variables describe torchrun, not this process.
    "torchrun-inside-srun": ({"TORCHELASTIC_RUN_ID": "j", "RANK": "5", "WORLD_SIZE": "8",
                              "LOCAL_RANK": "1", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
                              "SLURM_JOB_NODELIST": "n[1-2]"},
                             {"launcher": "torchrun", "rank": 5, "world": 8, "local_rank": 1}),
    # enroot's pytorch hook under pyxis sets LOCAL_RANK too.
    "enroot-hook": ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "n1",
                     "MASTER_PORT": "6000", "SLURM_NTASKS": "2", "SLURM_PROCID": "1"},
                    {"launcher": "env", "rank": 1, "world": 2, "master_addr": None}),
    # pyxis itself, for an image with PYTORCH_VERSION, copies SLURM_PROCID -> RANK and
    # SLURM_LOCALID -> LOCAL_RANK into each task and sets no WORLD_SIZE (pyxis_slurmstepd.c,
    # pytorch_remap_list; NVIDIA/pyxis up to 0.24): Slurm's variables describe the job.
    "pyxis-remap": ({"RANK": "3", "LOCAL_RANK": "1", "SLURM_NTASKS": "4", "SLURM_PROCID": "3",
                     "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "g[1-2]", "SLURM_JOB_ID": "77",
                     "SLURM_TASKS_PER_NODE": "2(x2)", "PYTORCH_VERSION": "2.6.0"},
                    {"launcher": "slurm", "rank": 3, "world": 4, "local_rank": 1,
                     "local_world": 2, "master_addr": "g1", "master_port": 10077}),
    "pyxis-remap-one-task": ({"RANK": "0", "LOCAL_RANK": "0", "SLURM_NTASKS": "1",
                              "SLURM_PROCID": "0", "SLURM_LOCALID": "0"},
                             {"launcher": "single", "world": 1, "problem": None}),
    # An incomplete job description is refused (exit 5), never trained as rank 0 of 1.
    "rank-alone": ({"RANK": "1"}, {"launcher": "env", "problem": "RANK=1 is set but WORLD_SIZE is not"}),
    "world-size-alone": ({"WORLD_SIZE": "4"},
                         {"launcher": "env", "problem": "WORLD_SIZE=4 is set but RANK is not"}),
    "rank-differs-from-slurm": ({"RANK": "5", "LOCAL_RANK": "0", "SLURM_NTASKS": "1",
                                 "SLURM_PROCID": "0"},
                                {"launcher": "env", "problem": "RANK=5 is set but WORLD_SIZE is not"}),
    "local-rank-alone": ({"LOCAL_RANK": "1"},
                         {"launcher": "env", "rank": 0, "world": 1, "local_rank": 1}),
    "srun": ({"SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
              "SLURM_JOB_NODELIST": "gpu-node[07-08,10],login1", "SLURM_JOB_ID": "123456",
              "SLURM_TASKS_PER_NODE": "2(x2)"},
             {"launcher": "slurm", "rank": 2, "world": 4, "local_rank": 0, "local_world": 2,
              "master_addr": "gpu-node07", "master_port": 10000 + 123456 % 20000}),
    "srun-master-port-set": ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                              "SLURM_JOB_NODELIST": "a[3-4]", "MASTER_PORT": "29555"},
                             {"launcher": "slurm", "world": 2, "master_addr": "a3",
                              "master_port": 29555}),
    "srun-one-task": ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "a1"},
                      {"launcher": "single", "world": 1, "problem": None}),
    "srun-no-master": ({"SLURM_NTASKS": "2", "SLURM_PROCID": "1"},
                       {"launcher": "slurm", "problem": "no master address"}),
    "srun-bad-procid": ({"SLURM_NTASKS": "2", "SLURM_PROCID": "2", "SLURM_JOB_NODELIST": "a1"},
                        {"launcher": "slurm", "problem": "SLURM_PROCID=2 is not below"}),
    "pytorchjob-pod": ({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
                        "WORLD_SIZE": "3", "RANK": "2"},
                       {"launcher": "pytorchjob", "rank": 2, "world": 3,
                        "master_addr": "job-master-0", "master_port": 23456}),
    "pytorchjob-needs-torchrun": ({"MASTER_ADDR": "m", "MASTER_PORT": "1", "WORLD_SIZE": "8",
                                   "RANK": "4", "PET_NPROC_PER_NODE": "4"},
                                  {"launcher": "pytorchjob", "problem": "start the job with torchrun"}),
    "trainjob-node": ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1",
                       "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29500"},
                      {"launcher": "trainjob", "rank": 1, "world": 2,
                       "master_addr": "tj-node-0-0.tj", "master_port": 29500}),
    "trainjob-needs-torchrun": ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "8",
                                 "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "m"},
                                {"launcher": "trainjob", "problem": "start the job with torchrun"}),
}
NODELISTS = {"node[01-04,07]": ["node01", "node02", "node03", "node04", "node07"],
             "a[1-2]-ib[8-9],login": ["a1-ib8", "a1-ib9", "a2-ib8", "a2-ib9", "login"],
             "gpu7": ["gpu7"]}
LAUNCH_PROBE = r"""
import dataclasses, json, sys
sys.path.insert(0, "/usr/local/bin")
import train_amp
cases, lists = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {name: dataclasses.asdict(train_amp.launch_env(env)) for name, (env, _) in cases.items()}
out["nodelists"] = {text: train_amp.expand_nodelist(text) for text in lists}
print("LAUNCH " + json.dumps(out))
"""


def test_launch_env_reads_each_launchers_variables(run_in_image):
    """train_amp.launch_env() should get rank/world/master right for torchrun, srun, Kubeflow."""
    code, out = run_in_image(["python", "-c", LAUNCH_PROBE, json.dumps(LAUNCH_CASES),
                              json.dumps(list(NODELISTS))], entrypoint="", timeout=120)
    found = next((ln for ln in out.splitlines() if ln.startswith("LAUNCH ")), None)
    assert code == 0 and found, f"the launch_env probe failed ({code}):\n{out}"
    seen = json.loads(found[len("LAUNCH "):])
    for name, (_, want) in LAUNCH_CASES.items():
        got = seen[name]
        for key, value in want.items():
            if key == "problem" and value:
                assert value in (got["problem"] or ""), f"{name}: problem {got['problem']!r}"
            else:
                assert got[key] == value, f"{name}: {key} = {got[key]!r}, expected {value!r}: {got}"
        if "problem" not in want:
            assert got["problem"] is None, f"{name}: unexpected problem {got['problem']!r}"
    assert seen["nodelists"] == NODELISTS, f"Slurm host lists expanded wrongly: {seen['nodelists']}"


# Each case: (local rank, processes on the node, CUDA_VISIBLE_DEVICES, SLURM_GPUS_ON_NODE) ->
# the cuda:N a process must use, or the words of its error. Slurm shows a task only its GPUs
# with --gpus-per-task and --gpu-bind, so cuda:LOCAL_RANK may not exist.
GPU_CASES = {
    "torchrun-8-of-8": (5, 8, "0,1,2,3,4,5,6,7", None, 5),
    "gpus-per-task-1": (3, 4, "3", "4", 0),
    "gpus-per-task-2-rank-1": (1, 4, "2,3", "8", 1),
    "gpus-per-task-2-rank-2": (2, 4, "4,5", "8", 0),
    "gpus-per-task-2-rank-3": (3, 4, "6,7", "8", 1),
    # --gpu-bind=closest on 2 sockets x 4 GPUs, 8 tasks in blocks: a socket's 4 tasks share 4.
    "closest-rank-6": (6, 8, "4,5,6,7", "8", 2),
    "uuids": (1, 2, "GPU-aa,GPU-bb", None, 1),
    # SLURM_GPUS_ON_NODE=0: GPUs that Slurm does not manage; the visible ones count.
    "gpus-not-from-slurm": (1, 2, "0,1", "0", 1),
    "more-processes-than-gpus": (2, 4, "0,1", None, "processes would share a GPU"),
    "slurm-too-few-gpus": (0, 4, "0", "2", "4 processes on this node but 2 GPU(s)"),
    "none-visible": (0, 1, "", None, "no GPU is visible"),
}
GPU_PROBE = r"""
import argparse, json, os, sys
sys.path.insert(0, "/usr/local/bin")
import torch, train_amp
out = {}
for name, (rank, world, shown, on_node, _) in json.loads(sys.argv[1]).items():
    env = {"CUDA_VISIBLE_DEVICES": shown, **({"SLURM_GPUS_ON_NODE": on_node} if on_node else {})}
    os.environ.pop("SLURM_GPUS_ON_NODE", None)
    os.environ.update(env)
    # As a node with these GPUs would: the driver counts what CUDA_VISIBLE_DEVICES shows.
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: len([g for g in shown.split(",") if g])
    ranks = train_amp.Ranks(train_amp.LaunchEnv("slurm", rank, world * 2, rank, world))
    try:
        device = str(train_amp.pick_device(argparse.Namespace(device="auto"), ranks))
    except train_amp.UsageError as e:
        device = f"error: {e}"
    # The pure choice that --print-launch prints, from the variables alone (no driver needed).
    index, problem = train_amp.choose_gpu(rank, world, train_amp.visible_gpus(env),
                                          train_amp.node_gpus(env))
    out[name] = [device, f"cuda:{index}" if problem is None else f"error: {problem}"]
print("DEVICES " + json.dumps(out))
"""


def test_each_process_uses_a_gpu_it_can_see(run_in_image):
    """train_amp.py should pick its GPU from what the task sees (Slurm's binding), and refuse
    processes that would share one."""
    code, out = run_in_image(["python", "-c", GPU_PROBE, json.dumps(GPU_CASES)], entrypoint="",
                             timeout=120)
    found = next((ln for ln in out.splitlines() if ln.startswith("DEVICES ")), None)
    assert code == 0 and found, f"the device probe failed ({code}):\n{out}"
    seen = json.loads(found[len("DEVICES "):])
    for name, (rank, world, shown, on_node, want) in GPU_CASES.items():
        where = f"{name}: local rank {rank} of {world}, CUDA_VISIBLE_DEVICES={shown!r}"
        device, chosen = seen[name]
        assert device == chosen, f"{where}: pick_device gave {device}, choose_gpu {chosen}"
        if isinstance(want, int):
            assert device == f"cuda:{want}", f"{where}: {device}, expected cuda:{want}"
        else:
            assert device.startswith("error: ") and want in device, (
                f"{where}: {device!r}, expected an error saying {want!r}")


TRAIN = ["python", "/usr/local/bin/train_amp.py", *SYNTH, "--epochs", "1",
         "--checkpoint-dir", "/tmp/ck"]


# Two steps show the job starts, trains and evaluates as this user (the epoch's other 6 steps
# showed nothing more). The compiled run is test_train_amp_flags.py's
# compile test, made the same way (one compile for the suite: each takes a minute on 2 cores).
@pytest.mark.parametrize("command, world", [
    ([*TRAIN, "--steps", "2"], 1),
    (["torchrun", "--nproc-per-node", "2", *TRAIN[1:], "--steps", "2"], 2),
], ids=["one-process", "torchrun-2-processes"])
def test_train_amp_runs_without_entrypoint_as_a_nameless_uid_on_a_read_only_root(
        run_in_image, command, world):
    """train_amp.py (and torchrun) should train as UID 12345 with no passwd entry, read-only /."""
    code, out = run_in_image(command, timeout=540, **BARE)
    assert code == 0, f"{command[0]} exited {code}:\n{out[-6000:]}"
    assert f"world size {world}," in out and f"world_size={world} " in out, out[-6000:]
    assert SUMMARY.search(out) and "nan" not in out, f"no finite epoch summary:\n{out[-6000:]}"


# The smoke suite as a nameless UID on a read-only root: tests/test_smoke.py's whole-suite run
# is made that way (one run of the suite, not two).


# The user's own script, not train_amp.py: torch.compile needs a user name (Inductor's cache
# is /tmp/torchinductor_<user>), which getpass.getuser() cannot find for a nameless UID.
USER_CODE = ("import getpass, os, torch\n"
             "f = torch.compile(lambda x: x.sin() + 1)\n"
             "print('compiled', f(torch.zeros(3)).sum().item(), getpass.getuser(),"
             " os.environ['HOME'], os.access(os.environ['HOME'], os.W_OK))\n")


def test_user_code_compiles_without_entrypoint_as_a_nameless_uid_on_a_read_only_root(
        run_in_image):
    """Any Python in the venv (here the user's own torch.compile), started as UID 12345 with no
    passwd entry and no entrypoint on a read-only root, should get a user name and a writable
    HOME from the venv's start-up hook and compile, where it raised KeyError before."""
    code, out = run_in_image(["python", "-c", USER_CODE], timeout=300, **BARE_EXEC)
    assert code == 0, f"user code exited {code}:\n{out[-4000:]}"
    assert "compiled 3.0 uid12345 /tmp/home-12345 True" in out, out[-4000:]


def test_compile_on_a_noexec_tmp_exits_2_with_the_fix(run_in_image):
    """--compile where Inductor's cache is noexec (docker --tmpfs /tmp) should stop at once."""
    code, out = run_in_image([*TRAIN, "--steps", "2", "--compile"], timeout=120, **BARE)
    assert code == 2, f"expected exit 2 before any compiling, got {code}:\n{out[-6000:]}"
    assert "noexec" in out and "TORCHINDUCTOR_CACHE_DIR" in out, f"no fix given:\n{out[-3000:]}"
    assert not SUMMARY.search(out), f"it trained first:\n{out[-3000:]}"


def srun_env(rank, ntasks, nodelist, job_id="4242"):
    """The variables `srun --ntasks N` gives task `rank` (one task per node here)."""
    return {"SLURM_NTASKS": str(ntasks), "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(rank), "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_ID": job_id,
            "SLURM_TASKS_PER_NODE": f"1(x{ntasks})", "GLOO_SOCKET_IFNAME": "eth0"}


def test_two_srun_tasks_in_two_containers_train_one_job(start_container, docker_network):
    """Two containers given srun's SLURM_* variables (no torchrun) should form one 2-rank job."""
    prefix = f"slurm-{uuid.uuid4().hex[:8]}-node"
    names = [f"{prefix}{i}" for i in range(2)]
    # As srun would: the compressed list (prefix[0-1]); the master port comes from the job id.
    cmd = ["python", "/usr/local/bin/train_amp.py", *SYNTH, "--synthetic-size", "128", "--epochs",
           "1", "--log-every", "1", "--checkpoint-dir", "/tmp/ck", "--dist-timeout", "240"]
    nodes = [start_container(cmd, name=n, hostname=n, network=docker_network.name,
                             entrypoint="", user="12345:12345",
                             environment=srun_env(i, 2, f"{prefix}[0-1]"))
             for i, n in enumerate(names)]
    codes = [n.wait(timeout=420 * SLOWDOWN)["StatusCode"] for n in nodes]
    logs = [n.logs().decode(errors="replace") for n in nodes]
    for name, code, log in zip(names, codes, logs):
        assert code == 0, f"{name} exited {code}:\n{log[-6000:]}"
    assert "launch: srun" in logs[0] and "rank 0, world size 2," in logs[0], (
        f"task 0 should say it is rank 0 of an srun job of 2:\n{logs[0]}")
    assert f"master {prefix}0:{10000 + 4242 % 20000}" in logs[0], logs[0]
    # 128 images / 2 ranks / 32 per batch: 2 steps each, not 4 steps in each of two copies.
    assert "world_size=2" in logs[0] and "steps/epoch=2 " in logs[0], logs[0]
    assert SUMMARY.search(logs[0]) and "nan" not in logs[0], f"no finite epoch:\n{logs[0]}"
    assert not SUMMARY.search(logs[1]), f"only rank 0 should print summaries:\n{logs[1]}"
    assert read_from_container(nodes[0], "/tmp/ck/last.pt"), "rank 0 saved no checkpoint"
    assert read_from_container(nodes[1], "/tmp/ck/last.pt") is None, "rank 1 saved one too"


# How long a task waits for the job to form: the hang these tests guard is a task that waits for
# ever (or trains alone), not one that gives up too early, so a few seconds do; stretched by
# SLOWDOWN as every hang guard is (an int: --dist-timeout takes whole seconds).
DIST_TIMEOUT = max(5, round(5 * SLOWDOWN))
NOT_FORMED = f"could not form the 2-process job within --dist-timeout {DIST_TIMEOUT} s"


@pytest.mark.parametrize("rank, nodelist, expect", [
    (1, None, "no master address"),
    # The master's host exists (this container) but nobody listens on the port.
    (1, "self", NOT_FORMED),
    # Rank 0 whose peer never comes (e.g. sbatch --ntasks=2 running the script without srun).
    (0, "self", NOT_FORMED),
], ids=["no-master-address", "master-never-answers", "peer-never-comes"])
def test_srun_tasks_that_cannot_form_one_job_refuse_to_train(start_container, rank, nodelist,
                                                             expect):
    """SLURM_NTASKS=2 without a working rendezvous should exit 5 with a clear error, not train."""
    host = f"lonely-{uuid.uuid4().hex[:8]}"
    env = srun_env(rank, 2, host if nodelist == "self" else "")
    if nodelist is None:
        del env["SLURM_JOB_NODELIST"]
    c = start_container([*TRAIN, "--dist-timeout", str(DIST_TIMEOUT)], hostname=host,
                        environment=env, **BARE)
    started = time.monotonic()
    code = c.wait(timeout=300 * SLOWDOWN)["StatusCode"]
    took = time.monotonic() - started
    out = c.logs().decode(errors="replace")
    assert code == 5, f"expected exit 5 (no job formed), got {code}:\n{out[-6000:]}"
    assert expect in out and "Refusing to train" in out, f"no clear error:\n{out[-6000:]}"
    assert not SUMMARY.search(out) and "steps/epoch" not in out, f"it trained alone:\n{out}"
    assert took < 150 * SLOWDOWN, f"the refusal took {took:.0f} s with --dist-timeout {DIST_TIMEOUT}"
