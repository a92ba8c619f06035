"""train_amp.py under torchrun in the image, on CPU: two containers as two nodes over c10d, two
processes in one container sharding the data, and ranks leaving together."""
import json
import re
import shlex
import time
import uuid

from conftest import SLOWDOWN, wait_for_log
from train_amp_helpers import SUMMARY, SYNTH, read_from_container


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
    codes = [n.wait(timeout=420 * SLOWDOWN)["StatusCode"] for n in nodes]
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
    status = c.wait(timeout=120 * SLOWDOWN)["StatusCode"]
    assert status == 0, f"torchrun exited {status}:\n{c.logs().decode(errors='replace')[-3000:]}"


# Ranks whose process-group teardown never returns (pytorch/pytorch#75097), with a short bound.
HANGING_TEARDOWN = """
import sys, time
import torch.distributed as dist
import trainamp.launch
trainamp.launch.TEARDOWN_S = 3
dist.destroy_process_group = lambda *a, **k: time.sleep(3600)
from trainamp.main import main
sys.exit(main())
"""


def test_a_finished_job_whose_teardown_hangs_still_exits_with_its_status(run_in_image):
    """When destroying the process group hangs after a finished run (all saved), each rank should
    print where it hangs and exit within TEARDOWN_S with the run's status (0), instead of holding
    its node until the scheduler's time limit."""
    script = "cat > /tmp/hang.py <<'PY'\n" + HANGING_TEARDOWN + "PY\n"
    code, logs = run_in_image(["bash", "-c", script + "exec torchrun --nproc-per-node 2 /tmp/hang.py "
                               + shlex.join(SYNTH) + " --epochs 1 --checkpoint-dir /tmp/ck"], timeout=300)
    assert code == 0, f"torchrun exited {code}:\n{logs[-4000:]}"
    assert SUMMARY.search(logs), f"the run did not finish its epoch:\n{logs[-4000:]}"
    left = re.findall(r"rank (\d): leaving the job \(destroying the process group\) took over 3 s", logs)
    assert sorted(left) == ["0", "1"], f"each rank should say it left past the bound:\n{logs[-4000:]}"
    assert "hang.py" in logs, f"no stack of where it hung:\n{logs[-4000:]}"
