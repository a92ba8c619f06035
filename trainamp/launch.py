"""How this process was started and where it runs: torchrun, srun, Kubeflow PyTorchJob or
TrainJob, or alone (launch_env); which GPU it uses (choose_gpu); the process group (Ranks);
--print-launch; a writable HOME without a passwd entry; and the stop signals (StopRequest)."""
import atexit
import contextlib
import dataclasses
import datetime
import faulthandler
import getpass
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import torch
import torch.distributed as dist

from .errors import EXIT_LAUNCH, EXIT_USAGE, PROG, LaunchError, UsageError

# Seconds a finished job's process may take to leave it (destroy the process group, exit). It takes
# milliseconds; a teardown that hangs (pytorch/pytorch#75097) would hold the nodes until the job's
# time limit with every result already saved.
TEARDOWN_S = 60

# What the first line of a run calls each launch_env() result.
LAUNCHERS = {
    "torchrun": "torchrun",
    "env": "RANK/WORLD_SIZE/LOCAL_RANK set (enroot's optional PyTorch hook, or by hand)",
    "slurm": "srun, one task per process (SLURM_PROCID/SLURM_NTASKS)",
    "pytorchjob": "Kubeflow PyTorchJob pod without torchrun (RANK/WORLD_SIZE: one process"
                  " per pod)",
    "trainjob": "Kubeflow TrainJob node without torchrun (PET_NODE_RANK/PET_NNODES)",
    "single": "single process (no torchrun, srun or Kubeflow variables)",
}


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """Who this process is in the job, as its launcher told it (see launch_env)."""
    launcher: str = "single"  # torchrun | env | slurm | pytorchjob | trainjob | single
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    master_addr: str | None = None  # None with world > 1: torchrun's env:// rendezvous
    master_port: int | None = None
    problem: str | None = None  # several tasks that cannot form one job: refuse (exit 5)

    def describe(self):
        master = (f", master {self.master_addr}:{self.master_port}" if self.master_addr
                  and self.world > 1 else "")
        return (f"launch: {LAUNCHERS[self.launcher]}: rank {self.rank}, world size"
                f" {self.world}, local rank {self.local_rank} of {self.local_world}{master}")


def _env_int(env, name, default=None, low=0):
    text = (env.get(name) or "").strip()
    if not text:
        if default is None:
            raise LaunchError(f"{name} is not set")
        return default
    try:
        value = int(text)
    except ValueError:
        raise LaunchError(f"{name}={text!r} is not an integer") from None
    if value < low:
        raise LaunchError(f"{name}={value} must be at least {low}")
    return value


def _check_rank(rank, world, names):
    if rank >= world:
        raise LaunchError(f"{names[0]}={rank} is not below {names[1]}={world}")


def expand_nodelist(text):
    """Slurm's compressed host list -> host names, in pure Python like PyTorch Lightning's
    SLURMEnvironment: 'node[01-03,07],gpu-a[1-2]' -> node01 node02 node03 node07 gpu-a1 gpu-a2.
    A range keeps the zero padding of its start; several [..] groups in one name multiply."""
    hosts = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text.strip()):  # commas outside [...]
        names = [""]
        for part in re.split(r"(\[[^\]]*\])", item):
            if not part.startswith("["):
                names = [n + part for n in names]
                continue
            choices = []
            for piece in part[1:-1].split(","):
                lo, dash, hi = piece.strip().partition("-")
                if not lo.isdigit() or (dash and not hi.isdigit()):
                    raise LaunchError(f"cannot read the Slurm host list {text!r}")
                choices += ([str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
                            if dash else [lo])
            names = [n + c for n in names for c in choices]
        hosts += [n.strip() for n in names if n.strip()]
    return hosts


def first_slurm_host(nodelist):
    """The first host of a Slurm node list: `scontrol show hostnames` where Slurm's tools are
    installed (the authority on its syntax), else expand_nodelist."""
    if shutil.which("scontrol"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], text=True,
                                 capture_output=True, timeout=20, check=True).stdout.split()
            if out:
                return out[0]
    hosts = expand_nodelist(nodelist)
    return hosts[0] if hosts else None


def _from_torchrun(env):
    """torchrun (TORCHELASTIC_RUN_ID), or LOCAL_RANK with WORLD_SIZE from anything else, e.g.
    enroot's optional 50-slurm-pytorch.sh hook under pyxis. Also torchrun run by srun: its
    variables win. LOCAL_RANK without WORLD_SIZE is pyxis's own remap: _from_partial_env."""
    if "TORCHELASTIC_RUN_ID" not in env and not ("LOCAL_RANK" in env and "WORLD_SIZE" in env):
        return None
    world = _env_int(env, "WORLD_SIZE", 1, low=1)
    rank = _env_int(env, "RANK", 0)
    _check_rank(rank, world, ("RANK", "WORLD_SIZE"))
    return LaunchEnv("torchrun" if "TORCHELASTIC_RUN_ID" in env else "env", rank, world,
                     _env_int(env, "LOCAL_RANK", 0), _env_int(env, "LOCAL_WORLD_SIZE", 1, low=1))


def _from_slurm(env):
    """srun with one task per process and no torchrun. SLURM_NTASKS=1 is a single process.
    An sbatch script's own shell also has SLURM_PROCID=0 and the job's SLURM_NTASKS: started
    there without srun, it waits for the other tasks and fails (exit 5), never trains alone."""
    if "SLURM_PROCID" not in env or _env_int(env, "SLURM_NTASKS", 1, low=1) <= 1:
        return None
    world, rank = _env_int(env, "SLURM_NTASKS", low=1), _env_int(env, "SLURM_PROCID")
    _check_rank(rank, world, ("SLURM_PROCID", "SLURM_NTASKS"))
    per_node = re.match(r"\d+", env.get("SLURM_STEP_TASKS_PER_NODE")
                        or env.get("SLURM_TASKS_PER_NODE") or "1")
    # Task 0 runs on the first node of the step (srun sets SLURM_STEP_NODELIST), which is the
    # allocation's first node unless srun was given a subset.
    nodelist = next((env[k] for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                      "SLURM_NODELIST") if env.get(k)), None)
    addr = env.get("MASTER_ADDR") or (first_slurm_host(nodelist) if nodelist else None)
    if not addr:
        raise LaunchError("no master address: neither MASTER_ADDR nor SLURM_JOB_NODELIST is"
                          " set, so task 0's host is unknown")
    # A port per job, so two jobs sharing a node do not collide (PyTorch Lightning's
    # SLURMEnvironment also derives it from SLURM_JOB_ID); MASTER_PORT wins.
    job = (env.get("SLURM_JOB_ID") or "").strip()
    port = _env_int(env, "MASTER_PORT", 10000 + int(job) % 20000 if job.isdigit() else 29500)
    return LaunchEnv("slurm", rank, world, _env_int(env, "SLURM_LOCALID", 0),
                     int(per_node.group()) if per_node else 1, addr, port)


def _nproc_hint(env):
    nproc = (env.get("PET_NPROC_PER_NODE") or "1").strip()
    if nproc != "1":
        raise LaunchError(f"PET_NPROC_PER_NODE={nproc} asks for torchrun's processes per node:"
                          " start the job with torchrun (it reads PET_NNODES, PET_NODE_RANK and"
                          " PET_MASTER_* itself), or set numProcPerNode to 1")


def _from_pytorchjob(env):
    """Kubeflow Training Operator v1 PyTorchJob: MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK per pod
    (training-operator pkg/controller.v1/pytorch/envvar.go). Started without torchrun, one
    process per pod: RANK is this process's rank."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world, rank = _env_int(env, "WORLD_SIZE", low=1), _env_int(env, "RANK")
    _check_rank(rank, world, ("RANK", "WORLD_SIZE"))
    if world == 1:
        return LaunchEnv("pytorchjob")
    _nproc_hint(env)
    if not env.get("MASTER_ADDR"):
        raise LaunchError("WORLD_SIZE > 1 but MASTER_ADDR is not set")
    return LaunchEnv("pytorchjob", rank, world, 0, 1, env["MASTER_ADDR"],
                     _env_int(env, "MASTER_PORT", 29500))


def _from_trainjob(env):
    """Kubeflow Trainer v2 TrainJob: PET_NNODES/PET_NPROC_PER_NODE/PET_NODE_RANK/PET_MASTER_*
    (trainer pkg/runtime/framework/plugins/torch/torch.go), meant for torchrun. Started
    directly, with PET_NPROC_PER_NODE=1: one process per node, rank = PET_NODE_RANK."""
    if "PET_NNODES" not in env and "PET_NODE_RANK" not in env:
        return None
    nnodes = _env_int(env, "PET_NNODES", 1, low=1)
    if nnodes == 1:
        return LaunchEnv("trainjob")  # one node, one process: nothing can be duplicated
    _nproc_hint(env)
    rank = _env_int(env, "PET_NODE_RANK", 0)
    _check_rank(rank, nnodes, ("PET_NODE_RANK", "PET_NNODES"))
    addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
    if not addr:
        raise LaunchError("PET_NNODES > 1 but PET_MASTER_ADDR is not set")
    return LaunchEnv("trainjob", rank, nnodes, 0, 1, addr,
                     _env_int(env, "PET_MASTER_PORT", 29500))


def _from_partial_env(env):
    """Last: RANK/WORLD_SIZE/LOCAL_RANK that no launcher above accounted for. pyxis copies
    SLURM_PROCID -> RANK and SLURM_LOCALID -> LOCAL_RANK into every task of an image that sets
    PYTORCH_VERSION, and no WORLD_SIZE (pyxis_slurmstepd.c, pytorch_remap_list): with several
    tasks _from_slurm has taken it, so here it is a Slurm task of one. Anything else that sets
    RANK or WORLD_SIZE alone describes a job it does not give: refuse, never train as rank 0
    of 1 beside the job's other processes."""
    rank, world = ((env.get(k) or "").strip() for k in ("RANK", "WORLD_SIZE"))
    procid = (env.get("SLURM_PROCID") or "").strip()
    if procid and not world and rank in ("", procid):
        return None  # pyxis's remap in a single-task step
    if rank and not world:
        raise LaunchError(f"RANK={rank} is set but WORLD_SIZE is not: for a job of several"
                          " processes start it with torchrun (or set WORLD_SIZE, MASTER_ADDR"
                          " and MASTER_PORT too); for one process unset RANK")
    if world and world != "1" and not rank:
        raise LaunchError(f"WORLD_SIZE={world} is set but RANK is not: for a job of several"
                          " processes start it with torchrun (or set RANK, MASTER_ADDR and"
                          " MASTER_PORT too); for one process unset WORLD_SIZE")
    if "LOCAL_RANK" in env:  # e.g. LOCAL_RANK=1 alone: which GPU, in a job of one
        return LaunchEnv("env", 0, 1, _env_int(env, "LOCAL_RANK", 0),
                         _env_int(env, "LOCAL_WORLD_SIZE", 1, low=1))
    return None


def launch_env(env=None):
    """How this process was started, in this order: torchrun's variables (also torchrun inside
    srun), srun tasks (SLURM_NTASKS > 1 with SLURM_PROCID; also with pyxis's RANK/LOCAL_RANK),
    a Kubeflow PyTorchJob pod, a Kubeflow TrainJob node, an incomplete RANK/WORLD_SIZE
    (refused), else a single process. Never raises: a launcher whose variables
    say "several processes" but that cannot form one job comes back with .problem set."""
    env = os.environ if env is None else env
    for launcher, detect in (("torchrun", _from_torchrun), ("slurm", _from_slurm),
                             ("pytorchjob", _from_pytorchjob), ("trainjob", _from_trainjob),
                             ("env", _from_partial_env)):
        try:
            found = detect(env)
        except LaunchError as e:
            if launcher == "torchrun" and "TORCHELASTIC_RUN_ID" not in env:
                launcher = "env"
            return LaunchEnv(launcher, problem=f"{LAUNCHERS[launcher]}: {e}")
        if found:
            return found
    return LaunchEnv()


class Ranks:
    """This process's place in the job (see launch_env), or alone: rank 0 prints and saves;
    every rank trains. any_true/barrier are the collectives the training loop needs."""

    def __init__(self, env=None):
        self.env = launch_env() if env is None else env
        self.world, self.rank = self.env.world, self.env.rank
        self.local_rank, self.local_world = self.env.local_rank, self.env.local_world
        self.enabled = self.world > 1
        self.ctrl = None  # a gloo group for tiny CPU-side control messages (stop flag)

    @property
    def main(self):
        return self.rank == 0

    def check(self):
        """Refuse before any work when the launcher's tasks cannot form one job."""
        if self.env.problem:
            raise LaunchError(f"{self.env.problem}. Refusing to train: each task would run its"
                              " own copy of the job and overwrite the same checkpoint")

    def init(self, device, timeout_s=1800):
        if not self.enabled:
            return
        backend = "nccl" if device.type == "cuda" else "gloo"
        where = {}
        if self.env.master_addr:  # not torchrun: rendezvous at the address the launcher gave
            host = self.env.master_addr
            host = f"[{host}]" if ":" in host else host  # an IPv6 address
            where = {"init_method": f"tcp://{host}:{self.env.master_port}", "rank": self.rank,
                     "world_size": self.world}
        try:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                                    device_id=device if device.type == "cuda" else None,
                                    **where)
            # The stop flag is agreed on every step; on gloo (CPU) that never waits for the GPU.
            self.ctrl = dist.new_group(backend="gloo") if backend == "nccl" else None
            # Registered after torch's own: runs first at exit, and bounds the rest of it.
            atexit.register(signal.alarm, TEARDOWN_S)
        except (RuntimeError, ValueError, OSError) as e:  # DistError is a RuntimeError
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300].rstrip(".")
            raise LaunchError(
                f"{self.env.describe()}: could not form the {self.world}-process job within"
                f" --dist-timeout {timeout_s} s ({reason}). Refusing to train alone: check that"
                " every task started, that the master address resolves and its port is"
                " reachable from here, and the other tasks' logs (one may have stopped with an"
                " error)") from None

    def any_true(self, flag):
        if not self.enabled:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl)
        return bool(t.item())

    def barrier(self):
        if self.enabled:
            dist.barrier(group=self.ctrl)

    def close(self, status=0, clean=True):
        """Leave the job. After a clean end (every rank passed the same last barrier) the process
        group is destroyed, within TEARDOWN_S: past that this process prints its stacks and exits
        with `status` (its results are saved); the exit after it is bounded too (SIGALRM, armed
        at exit). After a failure the group is left to the OS: destroying it would wait for
        peers that may still be in a collective (pytorch/torchtitan#1342 does the same)."""
        if not (self.enabled and dist.is_initialized() and clean):
            return
        watchdog = threading.Timer(TEARDOWN_S, self._leave_anyway, args=(status,))
        watchdog.daemon = True
        watchdog.start()
        dist.destroy_process_group()
        watchdog.cancel()

    def _leave_anyway(self, status):
        print(f"{PROG}: rank {self.rank}: leaving the job (destroying the process group) took over"
              f" {TEARDOWN_S} s; training is done and saved, so this process exits now with"
              f" status {status}. Where it hangs:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(status)

    def print_on_main(self, *args, **kwargs):
        """print() on rank 0 only (flushed: the logs of several processes interleave)."""
        if self.main:
            print(*args, **kwargs, flush=True)


def writable_home():
    """Started without the entrypoint (pyxis, Kubernetes `command:`, `docker run --entrypoint
    ''`, Apptainer) as a UID with no passwd entry, the environment has HOME=/ (or none) and no
    user name. Then getpass.getuser() raises KeyError (Inductor names its cache
    /tmp/torchinductor_<user> with it), and Triton (~/.triton), torch hub, matplotlib and pip
    cannot write under HOME. Only in that case: a user name of uid<N> and a private HOME
    under the temp dir (the one folder a read-only root filesystem leaves writable). In the
    image the venv's start-up hook (team_uid_env.py) has done so already; this is for elsewhere."""
    try:
        getpass.getuser()
    except (KeyError, OSError):  # no LOGNAME/USER and no passwd entry for this UID
        os.environ["USER"] = f"uid{os.getuid()}"
    home = os.environ.get("HOME")
    if home and os.path.isdir(home) and os.access(home, os.W_OK):
        return
    fallback = pathlib.Path(tempfile.gettempdir(), f"home-{os.getuid()}")
    with contextlib.suppress(OSError):
        fallback.mkdir(mode=0o700, exist_ok=True)
    try:  # someone else's folder of that name (a shared /tmp) is never used
        ok = fallback.stat().st_uid == os.getuid() and os.access(fallback, os.W_OK)
    except OSError:
        ok = False
    if not ok:
        try:
            fallback = pathlib.Path(tempfile.mkdtemp(prefix=f"home-{os.getuid()}-"))
        except OSError:
            return  # nothing writable at all: leave HOME as it is
    os.environ["HOME"] = str(fallback)


def visible_gpus(env, count=None):
    """The GPUs this process can use, in CUDA's order (cuda:i is the i-th): the entries of
    CUDA_VISIBLE_DEVICES up to the first CUDA would reject (it ignores the rest), else
    0..count-1. Slurm sets the variable per task from gres.conf, so the list is known on a host
    without a GPU driver too; with a driver, `count` (torch.cuda.device_count()) caps it."""
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return [str(i) for i in range(count or 0)]
    ids = []
    for item in text.split(","):
        if not re.fullmatch(r"\d+|(GPU|MIG)-[\w/-]+", item.strip()):
            break
        ids.append(item.strip())
    return ids if count is None else ids[:count]


def node_gpus(env):
    """How many GPUs Slurm gave the step's tasks on this node (SLURM_GPUS_ON_NODE, the same in
    every task however they are bound), or None where nothing says (also 0: GPUs that Slurm does
    not manage): then every process on the node is taken to see the same GPUs."""
    text = (env.get("SLURM_GPUS_ON_NODE") or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def choose_gpu(local_rank, local_world, visible, on_node=None):
    """-> (index into `visible`, None), or (None, why not): which GPU a process uses.
    - One GPU visible: it (Slurm's --gpus-per-task=1 or --gpu-bind=single:1 show each task its
      own; else the node's only one).
    - At least one per process on the node: the local rank's (torchrun; srun showing every task
      all of the node's GPUs).
    - Fewer than the node's processes but more than one: Slurm showed each task its part of
      the node's GPUs, so local rank % N. With --gpus-per-task=N every task's set is its own;
      with --gpu-bind=closest the tasks of a socket share one, and get different GPUs of it
      when they are consecutive local ranks (--distribution=*:block). Where they are not, two
      land on one GPU and NCCL stops at start-up ("Duplicate GPU detected").
    Processes that must share a GPU (fewer on the node than processes) are an error, not a
    silent collision. `on_node`: the GPUs the node has for all its processes when the launcher
    says (node_gpus); else the visible ones."""
    n, on_node = len(visible), len(visible) if on_node is None else on_node
    shown = f"CUDA_VISIBLE_DEVICES={','.join(visible)}" if visible else "no GPU visible"
    if n == 0:
        return None, f"no GPU is visible to local rank {local_rank}"
    if on_node < local_world:
        return None, (f"{local_world} processes on this node but {on_node} GPU(s) for them"
                      f" ({shown}): processes would share a GPU. Start one process per GPU"
                      " (--ntasks-per-node or torchrun's --nproc-per-node = GPUs per node)")
    if n == 1:
        return 0, None
    if n >= local_world:
        if local_rank >= n:
            return None, (f"local rank {local_rank} but {n} GPUs visible ({shown}): start one"
                          " process per GPU, or show each process its own GPU")
        return local_rank, None
    return local_rank % n, None


def pick_device(args, ranks):
    if args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA GPU is visible: run the container with"
                         " --gpus all, or drop --device cuda")
    # srun --gpus-per-task or --gpu-bind (and other schedulers) may show each process only its
    # own GPUs, so the index comes from what this process sees, not from the local rank alone.
    visible = visible_gpus(os.environ, torch.cuda.device_count())
    index, problem = choose_gpu(ranks.local_rank, ranks.local_world, visible,
                                node_gpus(os.environ))
    if problem:
        raise UsageError(problem)
    return torch.device("cuda", index)


def print_launch(args, ranks, env=None):
    """--print-launch: the launch plan in one line, without a process group or a model, so a
    scheduler's binding can be checked (also on nodes without a GPU driver) -> exit status."""
    env = os.environ if env is None else env
    e = ranks.env
    if e.problem:
        print(f"{PROG}: error: {e.problem}", file=sys.stderr, flush=True)
        return EXIT_LAUNCH
    visible = visible_gpus(env, torch.cuda.device_count() if torch.cuda.is_available() else None)
    device, problem = "cpu", None
    if args.device != "cpu" and (visible or args.device == "cuda"):
        index, problem = choose_gpu(e.local_rank, e.local_world, visible, node_gpus(env))
        device = "none" if problem else f"cuda:{index} gpu={visible[index]}"
    master = f" master={e.master_addr}:{e.master_port}" if e.master_addr and e.world > 1 else ""
    print(f"launch plan: launcher={e.launcher} rank={e.rank} world={e.world}"
          f" local_rank={e.local_rank} local_world={e.local_world} device={device}"
          f" CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')}{master}",
          flush=True)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    return 0


# The signals that ask a run to stop. Only the trainer's main process decides what they mean.
# SIGHUP: the terminal hung up (an SSH session without tmux that dropped, a closed terminal
# window). Its default action killed the run with no checkpoint; it stops like SIGTERM instead:
# save, then exit 0. Output to the dead terminal fails with EIO, which streams.py drops quietly.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)


class StopRequest:
    """Set by SIGTERM/SIGINT/SIGHUP (docker stop, a scheduler's preemption, Ctrl-C, a dropped
    SSH session) and SIGUSR1 (a
    scheduler's warning before its time limit). The handler only sets it: the step in flight
    finishes, then every rank saves and exits together (0, or EXIT_REQUEUE once any SIGUSR1
    came: Slurm sends SIGUSR1 and then, at the limit, SIGTERM, and the requeue request must
    outlive the second signal)."""

    def __init__(self):
        self.requested, self.signal_name, self.requeue = False, None, False

    def install(self, ranks):
        main_pid = os.getpid()

        def on_signal(signum, _frame):
            name = signal.Signals(signum).name
            if not self.requested and ranks.main and os.getpid() == main_pid:  # not workers
                print(f"\n{name} received: stopping after this step", file=sys.stderr,
                      flush=True)
            seen = self.signal_name.split(" then ") if self.signal_name else []
            if name not in seen:  # "SIGUSR1 then SIGTERM": the log says what came, in order
                self.signal_name = " then ".join([*seen, name])
            self.requested = True
            self.requeue = self.requeue or signum == signal.SIGUSR1

        for signum in STOP_SIGNALS:
            signal.signal(signum, on_signal)
        return self


def ignore_stop_signals(_worker_id=None):
    """A DataLoader worker's worker_init_fn. `docker stop` (the image's services.sh signals
    every process), `kill -- -PGID`, `timeout` and scancel reach the workers too; torch's own
    worker handler then dies on SIGTERM, the main process raises "DataLoader worker ... killed
    by signal" and no checkpoint is written. Workers ignore the stop signals: the main process
    saves at the next step boundary and then shuts them down itself (its loader's shutdown
    does not need a signal; a worker whose main process is gone exits by torch's watchdog)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
