"""The Slurm cluster tests/test_slurm.py runs its jobs on: a controller and two compute nodes,
each a container of the image plus Slurm's daemons and munge (tests/slurm-node/Dockerfile), on one
Docker network with a shared volume at /shared; the Cluster that runs commands in it, submits jobs
and reports what explains a failure. Fixtures: slurm_node_image, cluster_network, shared_cluster
(module-scoped) and slurm_cluster (both nodes idle); conftest loads this file as a plugin."""
import io
import json
import os
import re
import shlex
import subprocess
import tarfile
import time
import uuid

import pytest
from conftest import CONTAINER_ENV, ROOT, SLOWDOWN, remove_containers

import docker

# Declared per node and used instead of what slurmd finds (SlurmdParameters=config_overrides), so
# the tasks fit on any host, this 2-core one included (the GPU-binding job has 3 per node).
NODE_CPUS = 4
NODE_GPUS = 8
# Deadlines (seconds): each wait fails with the cluster's logs when it runs out.
CLUSTER_UP_S, JOB_S, NODE_FAIL_S = 120, 600, 180
# Lines every start of this cluster logs (no PMIx, no saved state yet): left out of failure reports.
STARTUP_NOISE = re.compile(r"pmix|MPI: Cannot create context|state file|backup state save|"
                           r"MailProg|to recover|CPU frequency")
TERMINAL = {"COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}

SLURM_CONF = """\
ClusterName=teamtest
SlurmctldHost={ctl}
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
# No cgroups in these containers: track processes by parent, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
# A dead node is noticed within ~10 s and comes back by itself when its slurmd registers again.
SlurmdTimeout=10
MessageTimeout=5
# Slurm's default: a cancelled or timed-out step gets SIGTERM, then SIGKILL 30 s later; the
# trainer saves only after the step in flight, which takes seconds on a loaded 2-core host. The
# 30 s are stretched by SLOWDOWN like every hang guard: on a busy machine (load 38 seen) a step
# plus the save outlasted 30 s and the scancel test found no checkpoint.
KillWait={kill_wait}
ReturnToService=2
JobRequeue=0
# Finished jobs stay in `scontrol show job` (no slurmdbd, so no sacct) and in the jobcomp file.
MinJobAge=900
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# GPUs: made-up device files (gres.conf), so Slurm allocates and binds them and sets each
# task's CUDA_VISIBLE_DEVICES as on a GPU node; nothing opens them.
GresTypes=gpu
NodeName={nodes} CPUs={cpus} RealMemory=1000 Gres=gpu:{gpus} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=30 State=UP
"""
# No NVML here: the devices are the listed files, numbered in their order.
GRES_CONF = """\
AutoDetect=off
Name=gpu File=/dev/fakegpu[0-{last}]
"""
# Each container: the test's munge key (0400, owned by munge), munged, then the Slurm daemon in
# the foreground (its log is the container's log).
START = """\
set -e
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
runuser -u munge -- /usr/sbin/munged
{extra}
exec {daemon} -D
"""


def tar_of(files):
    """A tar archive (bytes) of {path: (bytes, mode)} for put_archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, (data, mode) in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def slurm_node_image(docker_client, image_ref):
    """The image plus slurmctld/slurmd/munge, under a tag of its own; removed afterwards (the
    build cache keeps its layer, so the next run builds it in seconds)."""
    tag = f"{image_ref.rsplit(':', 1)[0]}-slurm-node:test-{uuid.uuid4().hex[:8]}"
    cmd = ["/usr/bin/docker", "build", "-f", str(ROOT / "tests/slurm-node/Dockerfile"),
           "--build-arg", f"IMAGE_REF={image_ref}", "-t", tag, str(ROOT)]
    if os.environ.get("CA_BUNDLE"):
        cmd[2:2] = ["--secret", f"id=ca_bundle,src={os.environ['CA_BUNDLE']}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "DOCKER_BUILDKIT": "1"}, check=False)
    if r.returncode != 0:
        pytest.fail(f"the Slurm node image did not build:\n{(r.stdout + r.stderr)[-4000:]}")
    yield tag
    try:
        docker_client.images.remove(tag)
    except docker.errors.NotFound:
        pass


class Cluster:
    """The running cluster: run commands in it, submit jobs, wait for states, print logs."""

    def __init__(self, ctl, nodes):
        self.ctl, self.nodes = ctl, nodes

    def sh(self, script, user="dev", container=None):
        """Run bash `script` in a container (the controller by default): (exit code, output)."""
        code, out = (container or self.ctl).exec_run(["bash", "-c", script], user=user)
        return code, out.decode(errors="replace")

    def sbatch(self, *args, env=None):
        """Submit as the image's user with `env` added to the environment sbatch passes on."""
        # CONTAINER_ENV too (one OpenMP thread per process where the xdist workers fill the cores).
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in {**CONTAINER_ENV, **(env or {})}.items())
        code, out = self.sh(f"{prefix}sbatch --parsable " + " ".join(shlex.quote(str(a)) for a in args))
        assert code == 0 and out.strip().split(";")[0].isdigit(), f"sbatch failed:\n{out}\n{self.logs()}"
        return out.strip().split(";")[0]

    def job(self, job_id):
        """scontrol's record of a job as a dict (JobState, Reason, ExitCode, NodeList, ...)."""
        code, out = self.sh(f"scontrol show job -o {job_id}")
        return dict(re.findall(r"(\w+)=(\S*)", out)) if code == 0 else {}

    def wait_job(self, job_id, timeout=JOB_S):
        timeout *= SLOWDOWN
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.get("JobState") in TERMINAL:
                return job
            if time.monotonic() > deadline:
                # Where it hangs, before the cancel: each task's Python stacks (train_amp.py
                # prints them on SIGUSR2, into the job's output) and the nodes' processes.
                self.sh(f"scancel --signal=USR2 {job_id}", user="root")
                time.sleep(5)
                procs = "".join(
                    f"\n--- {n.name} processes:\n"
                    + self.sh("ps -eo pid,ppid,stat,etime,wchan:24,args", "root", n)[1]
                    for n in self.nodes)
                self.sh(f"scancel {job_id}", user="root")
                brief = {k: job.get(k) for k in ("JobState", "Reason", "RunTime", "NodeList")}
                pytest.fail(f"job {job_id} did not finish within {timeout}s ({brief}):\n"
                            f"--- job {job_id} output:\n{self.output(job_id)[-6000:]}{procs}\n"
                            f"{self.logs()}")
            time.sleep(1)

    def output(self, job_id):
        return self.sh(f"cat /shared/out/*-{job_id}.out")[1]

    def wait_idle(self, timeout=CLUSTER_UP_S):
        """Until both compute nodes are idle (registered with the controller)."""
        timeout *= SLOWDOWN
        deadline = time.monotonic() + timeout
        while True:
            code, out = self.sh("sinfo -h -N -o '%N %t'")
            states = dict(ln.split() for ln in out.splitlines() if len(ln.split()) == 2)
            if code == 0 and [states.get(n.name) for n in self.nodes] == ["idle", "idle"]:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"the nodes are not idle after {timeout}s: {out}\n{self.logs()}")
            time.sleep(1)

    def logs(self, job_id=None):
        """What explains a failure, most telling first (CI shows a failure's head): the job's
        output (with the tasks' stacks where a hang was dumped), then each daemon's last lines,
        less the start-up noise every run of this cluster prints."""
        parts = []
        if job_id:
            parts.append(f"--- job {job_id} output:\n" + self.output(job_id)[-6000:])
        for c in (self.ctl, *self.nodes):
            try:
                c.reload()
            except docker.errors.APIError:
                pass
            with_status = f"{c.name} ({c.status})"
            try:
                lines = c.logs(tail=80).decode(errors="replace").splitlines()
                lines = [ln for ln in lines if not STARTUP_NOISE.search(ln)][-30:]
                parts.append(f"--- {with_status}:\n" + "\n".join(lines))
            except docker.errors.APIError as e:
                parts.append(f"--- {with_status}: no logs ({e})")
        return "\n".join(parts)


@pytest.fixture(scope="module")
def cluster_network(docker_client):
    """The cluster's own bridge network (its DNS resolves the node names), for the module."""
    net = docker_client.networks.create(f"slurm-{uuid.uuid4().hex[:10]}", driver="bridge")
    yield net
    net.reload()
    remove_containers(net.containers)
    net.remove()


@pytest.fixture(scope="module")
def shared_cluster(docker_client, slurm_node_image, cluster_network):
    """slurmctld and two slurmd nodes on one network, a fresh munge key and a shared volume at
    /shared holding slurm/ (the scripts users copy). One cluster serves the module, as a real
    one serves many jobs: each test writes under its own /shared paths, and a test that kills
    a node brings it back before it ends. Everything is removed afterwards."""
    prefix = f"slurm{uuid.uuid4().hex[:6]}"
    ctl_name, node_names = f"{prefix}-ctl", [f"{prefix}-node{i}" for i in range(2)]
    conf = SLURM_CONF.format(ctl=ctl_name, nodes=f"{prefix}-node[0-1]", cpus=NODE_CPUS,
                             gpus=NODE_GPUS, kill_wait=round(30 * SLOWDOWN))
    files = {"slurm/slurm.conf": (conf.encode(), 0o644),
             "slurm/gres.conf": (GRES_CONF.format(last=NODE_GPUS - 1).encode(), 0o644),
             "munge/munge.key": (os.urandom(1024), 0o400)}
    volume = docker_client.volumes.create(f"{prefix}-shared")
    started = []
    try:
        for name in (ctl_name, *node_names):
            is_ctl = name == ctl_name
            # The controller owns the shared volume's set-up: the image's user owns it, and it
            # holds slurm/ as it is in this checkout.
            extra = ("install -d -o dev -g dev /shared/out && chown dev:dev /shared" if is_ctl
                     else f"for i in $(seq 0 {NODE_GPUS - 1}); do mknod /dev/fakegpu$i c 1 3; done")
            c = docker_client.containers.create(
                slurm_node_image,
                ["bash", "-c", START.format(extra=extra, daemon="slurmctld" if is_ctl else "slurmd")],
                name=name, hostname=name, network=cluster_network.name, entrypoint="",
                user="root", shm_size="1g", volumes={volume.name: {"bind": "/shared", "mode": "rw"}})
            started.append(c)
            c.put_archive("/etc", tar_of(files))
            if is_ctl:
                scripts = {f"slurm/{p.name}": (p.read_bytes(), 0o755)
                           for p in sorted((ROOT / "slurm").glob("*.sbatch"))}
                c.put_archive("/shared", tar_of(scripts))
            c.start()
        yield Cluster(started[0], started[1:])
    finally:
        remove_containers(started)
        volume.remove(force=True)


@pytest.fixture
def slurm_cluster(shared_cluster):
    """The module's cluster with both nodes idle: registered, and no job of an earlier test left."""
    shared_cluster.wait_idle()
    return shared_cluster


def checkpoint_of(cluster, path):
    """global_step and world_size of a train_amp checkpoint on /shared, or None."""
    code, out = cluster.sh(
        "python3 -c 'import json,sys,torch; c=torch.load(sys.argv[1],map_location=\"cpu\","
        "weights_only=True); print(\"CKPT\", json.dumps({\"global_step\": c[\"global_step\"],"
        " \"world_size\": c[\"config\"][\"world_size\"]}))' " + path)
    m = re.search(r"^CKPT (.*)$", out, re.MULTILINE)
    return json.loads(m.group(1)) if code == 0 and m else None
