"""Root runs nothing the user dev can write. dev may write /opt/venv (pip install: a .pth file
runs at every start of its Python, a file in /opt/venv/bin is found by a PATH search) and /tmp;
the entrypoint, the healthcheck and an admin's `docker exec` run as root. Each test plants, as
dev, code that notes the UID it runs as, then does what root does: no note may say 0."""
import hashlib

from conftest import READY, wait_for_health, wait_for_log, wait_until
from test_health_state import QUICK_HEALTH

# As dev: a .pth in site-packages and, in /opt/venv/bin, a stand-in for each command NAMES
# lists, which notes "<uid> <name>" in /tmp/ran-as and then runs the real one. The notes file
# is dev's, mode 666, so that any UID can add its line.
PLANT = r"""set -e
: > /tmp/ran-as; chmod 666 /tmp/ran-as
for site in /opt/venv/lib/python3*/site-packages; do
  echo "import os; open('/tmp/ran-as', 'a').write(f'{os.getuid()} .pth\n')" > "$site/zz-test.pth"
done
for name in $NAMES; do
  real=$(command -v "$name" || echo "/usr/bin/$name")
  printf '#!/bin/sh\necho "$(/usr/bin/id -u) %s" >> /tmp/ran-as\nexec %s "$@"\n' "$name" "$real" > /opt/venv/bin/$name
  chmod 755 /opt/venv/bin/$name
done
"""
# The line the report appended as dev: for any shell that sources the file, a note.
APPEND = 'echo "$(/usr/bin/id -u) environment" >> /tmp/ran-as'
# What a root shell or the entrypoint's steps and the healthcheck run by name.
STEP_COMMANDS = ("bash ls cat id env install chown chmod mkdir mktemp setpriv stat awk sed grep "
                 "ps curl ss date sort head tr cut rm od")


def notes(c):
    """The lines of /tmp/ran-as: "<uid> <what ran>"."""
    return c.exec_run(["cat", "/tmp/ran-as"]).output.decode(errors="replace").splitlines()


def plant(c, names):
    code, out = c.exec_run(["bash", "-c", PLANT], user="dev", environment={"NAMES": names})
    assert code == 0, f"dev could not plant its code (the test's premise):\n{out.decode()}"


def test_a_root_shell_and_roots_python_run_nothing_dev_wrote(start_container):
    """An admin's `docker exec -it C bash` should neither source a line dev added to
    /etc/team/environment nor find a `bash` or `ls` dev put in /opt/venv/bin; `docker exec C
    python` should refuse root with the command to run instead (dev's .pth would run as root)."""
    c = start_container(["sleep", "infinity"])
    wait_until(lambda: c.exec_run(["pgrep", "-x", "sleep"]).exit_code == 0, 60, "the command did not start")
    plant(c, "bash ls id")
    code, out = c.exec_run(["sh", "-c", f"echo {APPEND!r} >> /etc/team/environment"], user="dev")
    appended = code == 0

    code, out = c.exec_run(["bash", "-ic", "ls / > /dev/null"], tty=True)
    assert code == 0, f"root's interactive bash failed:\n{out.decode()}"
    code, out = c.exec_run(["python", "-c", "print('ran')"])
    refusal = out.decode(errors="replace")
    # dev's own python runs the venv and its .pth: what proves the plant works.
    dev_code, dev_out = c.exec_run(["python", "-c", "print('ran')"], user="dev")

    seen = notes(c)
    as_root = [line for line in seen if line.split()[0] == "0"]
    assert not as_root, f"root ran code dev wrote (appended to the environment file: {appended}): {as_root}"
    assert not appended, "dev could change /etc/team/environment, which dev's SSH sessions source"
    assert code == 126 and "ran" not in refusal.split() and "docker exec -u dev" in refusal, (
        f"root's python should be refused (126) with the fix, got {code}: {refusal!r}")
    assert dev_code == 0 and "1000 .pth" in seen, f"dev's python should run the venv: {dev_out!r}, notes {seen}"


def test_a_restart_and_the_healthcheck_run_nothing_dev_wrote_as_root(start_container):
    """At a restart the root entrypoint checks JUPYTER_PASSWORD_HASH with the venv's Python and
    runs its steps by name; the healthcheck runs as root every interval. None of it should run
    dev's .pth or a command dev put in /opt/venv/bin as root."""
    salt = "00ff"
    hashed = f"sha1:{salt}:{hashlib.sha1(b'a password' + salt.encode()).hexdigest()}"
    c = start_container(environment={"JUPYTER_PASSWORD_HASH": hashed}, healthcheck=QUICK_HEALTH)
    wait_for_log(c, READY, 120)
    plant(c, STEP_COMMANDS)
    c.restart(timeout=10)
    wait_until(lambda: c.logs().decode(errors="replace").count("==> READY") >= 2, 120,
               lambda: f"no second READY after the restart:\n{c.logs().decode(errors='replace')[-4000:]}")
    wait_for_health(c, "healthy", timeout=60)

    seen = notes(c)
    as_root = sorted({line for line in seen if line.split()[0] == "0"})
    assert not as_root, f"root ran code dev wrote at the restart or in the healthcheck: {as_root}"
    assert any(line.endswith(" .pth") for line in seen), f"dev's own Python should have run the .pth: {seen}"
