"""The healthcheck reads the services' state file (ports, whether sshd runs) as data: it runs as
root, so no line of that file may run, and a state file another user wrote is not trusted."""
from conftest import READY, wait_for_health, wait_for_log, wait_until

SECOND = 1_000_000_000  # Docker's health durations are in nanoseconds
QUICK_HEALTH = {"test": ["CMD", "/usr/local/bin/healthcheck"], "interval": SECOND, "timeout": 10 * SECOND,
                "retries": 2}
STATE = "/run/team/services.env"


def new_checks(c, seen, count=3):
    """The next `count` health checks Docker ran after those in `seen` (their start times)."""
    def fresh():
        c.reload()
        return [h for h in c.attrs["State"]["Health"]["Log"] if h["Start"] not in seen]
    wait_until(lambda: len(fresh()) >= count, 30, lambda: f"the healthcheck stopped running: {fresh()}")
    return fresh()


def test_healthcheck_reads_the_state_file_as_data_and_only_one_root_wrote(start_container):
    """A command line in the state file should not run (the file is data), and a state file dev owns
    should neither run nor choose the port probed (JUPYTER_PORT=1 would turn the container unhealthy)."""
    c = start_container(healthcheck=QUICK_HEALTH)
    wait_for_log(c, READY, 120)
    wait_for_health(c, "healthy", timeout=60)
    seen = {h["Start"] for h in c.attrs["State"]["Health"]["Log"]}
    code, out = c.exec_run(["sh", "-c", f"echo 'touch /tmp/ran-from-state' >> {STATE}"])
    assert code == 0, out
    checks = new_checks(c, seen)
    assert c.exec_run(["test", "-e", "/tmp/ran-from-state"])[0] != 0, "the healthcheck ran a line of its state file"
    assert all(h["ExitCode"] == 0 for h in checks), f"an extra line should change nothing: {checks}"

    seen |= {h["Start"] for h in checks}
    plant = f"printf 'JUPYTER_PORT=1\\ntouch /tmp/ran-as-root\\n' > {STATE} && chown dev {STATE}"
    code, out = c.exec_run(["sh", "-c", plant])
    assert code == 0, out
    checks = new_checks(c, seen)
    assert c.exec_run(["test", "-e", "/tmp/ran-as-root"])[0] != 0, "the root healthcheck ran a line dev wrote"
    assert all(h["ExitCode"] == 0 and "JupyterLab on 8888" in h["Output"] for h in checks), (
        f"a state file dev owns should not pick the port probed: {checks}")
