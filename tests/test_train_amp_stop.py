"""A stop loses nothing, whatever the job looks like: train_amp.py with DataLoader workers, piped
into `tee`, or with a stream closed, stopped by a signal to it alone or to its whole process
group (`kill -- -PGID`, `timeout`, Ctrl-C, scancel), saves at the next step boundary and exits
with the status the signals ask for. Its workers and its output never decide that."""
import re
import shlex

import pytest
from train_amp_helpers import CKPT_STEP, JOB_800, MAKE_FOLDER_800

# Waits (up to 3 min) until the log shows a step past the third, or the job has ended.
WAIT_FOR_STEP = r"""
for _ in $(seq 900); do
  grep -qE 'step ([3-9]|[1-9][0-9]+)/100' "$1" 2>/dev/null && break
  kill -0 "$2" 2>/dev/null || break
  sleep 0.2
done"""
def run_stop(run_in_image, body):
    """Run the folder set-up, `body` (a bash snippet that starts and stops the job and prints
    "EXIT <status>"), then CKPT. -> (exit status, checkpoint (epoch, step) or None, output)."""
    script = "\n".join(["cd /tmp", f"waitstep() {{ {WAIT_FOR_STEP}\n}}", MAKE_FOLDER_800, body,
                        CKPT_STEP])
    code, out = run_in_image(["bash", "-c", script], timeout=400)
    assert code == 0, f"the test script failed ({code}):\n{out[-4000:]}"
    status = re.search(r"^EXIT (\d+)$", out, re.MULTILINE)
    assert status, f"no EXIT line:\n{out[-4000:]}"
    ckpt = re.search(r"^CKPT (\d+) (\d+)$", out, re.MULTILINE)
    return int(status[1]), ckpt and (int(ckpt[1]), int(ckpt[2])), out


def assert_saved_mid_epoch(ckpt, out):
    assert ckpt is not None and ckpt[0] == 0 and ckpt[1] >= 3, (
        f"the stop should have saved epoch 0 at the step it reached (>= 3), found "
        f"{ckpt}:\n{out[-4000:]}")


def test_sigterm_to_the_whole_process_group_saves_though_the_workers_get_it_too(run_in_image):
    """SIGTERM to the job's process group (`kill -- -PGID`, `timeout`, what scancel and the
    image's docker stop do) reaches the DataLoader workers as well: the run should still save
    mid-epoch and exit 0 (it used to die with "DataLoader worker ... killed by signal")."""
    status, ckpt, out = run_stop(run_in_image, f"""
setsid {JOB_800} > log 2>&1 &
pid=$!
waitstep log $pid
kill -TERM -- -$pid
wait $pid; echo "EXIT $?"
cat log""")
    assert status == 0, f"stopped by SIGTERM after saving should exit 0, got {status}:\n{out[-4000:]}"
    assert re.search(r"^stopped by SIGTERM at epoch 1 step \d+/100 .*checkpoint saved", out,
                     re.MULTILINE), f"no 'stopped by SIGTERM ... saved' line:\n{out[-4000:]}"
    assert "killed by signal" not in out, out[-4000:]
    assert_saved_mid_epoch(ckpt, out)


@pytest.mark.parametrize("signal_name", ["INT", "TERM"])
def test_a_job_piped_into_tee_saves_when_tee_dies_with_it(run_in_image, signal_name):
    """`train_amp.py ... | tee log` stopped by Ctrl-C (SIGINT to the group) or by a SIGTERM to
    the group (docker stop signals every process) loses its tee first: the stop message and the
    progress lines hit a dead pipe. The run should still save mid-epoch and exit 0."""
    # A background job ignores SIGINT, and so would its children: env restores the default, as
    # a terminal's foreground job has it. The trap keeps the shell alive to write the status.
    inner = f"trap true INT TERM; {JOB_800} 2>&1 | tee log; echo \"EXIT ${{PIPESTATUS[0]}}\" > exit"
    status, ckpt, out = run_stop(run_in_image, f"""
setsid env --default-signal=INT bash -c {shlex.quote(inner)} > /dev/null 2>&1 &
pid=$!
waitstep log $pid
kill -{signal_name} -- -$pid
wait $pid
cat exit""")
    assert status == 0, f"the run should exit 0 after saving, got {status}:\n{out[-4000:]}"
    assert_saved_mid_epoch(ckpt, out)


def test_sigusr1_then_sigterm_saves_and_still_asks_for_a_requeue(run_in_image):
    """Slurm's --signal=USR1@N at a time limit or preemption, followed by its SIGTERM: the run
    should save and exit 75 (requeue), not 0: torchrun and Kubernetes only see the status."""
    status, ckpt, out = run_stop(run_in_image, f"""
setsid {JOB_800} > log 2>&1 &
pid=$!
waitstep log $pid
kill -USR1 $pid; sleep 0.1; kill -TERM $pid
wait $pid; echo "EXIT $?"
cat log""")
    assert status == 75, f"a SIGUSR1 then SIGTERM should exit 75, got {status}:\n{out[-4000:]}"
    assert re.search(r"^stopped by SIGUSR1 then SIGTERM at epoch 1 step .*exit status 75:"
                     r" requeue the job$", out, re.MULTILINE), out[-4000:]
    assert_saved_mid_epoch(ckpt, out)


def test_a_run_with_stderr_closed_trains_and_saves(run_in_image):
    """`train_amp.py ... 2>&-` (a wrapper that closes stderr) should train, save and exit 0,
    its output on stdout intact (it used to exit 1 at once, silently)."""
    status, ckpt, out = run_stop(run_in_image, f"""
{JOB_800.replace('--epochs 3', '--steps 4')} 2>&- > log
echo "EXIT $?"
cat log""")
    assert status == 0, f"exited {status}:\n{out[-4000:]}"
    assert re.search(r"^epoch 1/1: train_loss", out, re.MULTILINE), out[-4000:]
    assert ckpt == (0, 4), f"the run's checkpoint should be at step 4, found {ckpt}:\n{out}"


# A terminal that hangs up, as sshd's does when an SSH connection without tmux drops: the job
# runs on a pseudo-terminal (pty.fork: it leads a session whose controlling terminal that is),
# and once it has passed step 3 the terminal's other end is closed. The kernel then sends the
# job SIGHUP, and its writes to the terminal fail (EIO). Prints "EXIT <status>" as a shell would.
HANG_UP = r"""python3 - "$@" <<'EOF'
import os, pty, re, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp("bash", ["bash", "-c", "exec " + sys.argv[1]])
seen, deadline = b"", time.time() + 180
while time.time() < deadline and not re.search(rb"step ([3-9]|[1-9][0-9]+)/100", seen):
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    seen += chunk
os.close(fd)
_, status = os.waitpid(pid, 0)
print("EXIT", os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
EOF"""


def test_a_run_whose_terminal_hangs_up_saves_and_exits_0(run_in_image):
    """An SSH session without tmux that drops hangs up the job's terminal: SIGHUP, and every
    write to the terminal fails. The run should save mid-epoch and exit 0, as on SIGTERM (it was
    killed by SIGHUP: exit 129, no checkpoint)."""
    status, ckpt, out = run_stop(run_in_image, f"hangup() {{ {HANG_UP}\n}}\nhangup {shlex.quote(JOB_800)}")
    assert status == 0, f"a hung-up run should save and exit 0, got {status}:\n{out[-4000:]}"
    assert_saved_mid_epoch(ckpt, out)


# Minutes on 2 cores (torchrun's start, a rank's DataLoader workers) for a line of text, its
# behaviour (torchrun's) not the project's: make test-slow.
@pytest.mark.slow
def test_a_stop_under_torchrun_says_torchruns_traceback_is_the_signal_not_a_crash(run_in_image):
    """SIGTERM to a torchrun job's process group saves, but torchrun then exits 1 with a
    SignalException traceback, which reads as a crash: the run's last line of its own should say
    what that traceback means."""
    status, ckpt, out = run_stop(run_in_image, f"""
setsid torchrun --nproc-per-node 1 /usr/local/bin/{JOB_800} > log 2>&1 &
pid=$!
waitstep log $pid
kill -TERM -- -$pid
wait $pid; echo "EXIT $?"
cat log""")
    assert_saved_mid_epoch(ckpt, out)
    assert re.search(r"^stopped by SIGTERM at epoch 1 .*checkpoint saved", out, re.MULTILINE), out[-4000:]
    assert re.search(r"^under torchrun: .*SignalException.*not a crash", out, re.MULTILINE), (
        f"no line saying what torchrun's traceback means (torchrun exited {status}):\n{out[-4000:]}")
