"""The user `dev` as the entrypoint maps it, and what it says about bad input: UIDs/GIDs compared
as numbers, never another account's UID or a privileged group, sudo under no-new-privileges, a
/workspace dev cannot list, a derived image's NB_UID/NB_GID honoured as the default IDs, and a
non-root start told apart by its cause (the image's USER line or --user). Each test uses fresh
containers."""
import io
import os
import re
import uuid

import pytest
from conftest import SLOWDOWN, needs_root, remove_image, wait_for_log
from ssh_client import Key

# What the command prints when the container gets that far: the IDs and groups dev runs with.
SHOW_IDS = ["bash", "-c", "echo ids=$(id -u):$(id -g) groups=$(id -Gn | tr ' ' ,)"]


@pytest.mark.parametrize("env,named", [
    ({"HOST_UID": "00"}, "HOST_UID=0 would run"),
    ({"HOST_UID": "000"}, "HOST_UID=0 would run"),
    ({"HOST_GID": "000"}, "HOST_GID=0 would give"),
    ({"HOST_UID": "-0"}, "HOST_UID='-0' is not a valid ID"),
    ({"HOST_GID": "0x10"}, "HOST_GID='0x10' is not a valid ID"),
    ({"HOST_UID": "+1000"}, "HOST_UID='+1000' is not a valid ID"),
], ids=["uid-00", "uid-000", "gid-000", "uid-minus-0", "gid-hex", "uid-plus"])
def test_root_spelled_with_zeros_or_signs_is_refused(run_in_image, env, named):
    """Container should refuse a HOST_UID/HOST_GID that is root as a number (00, 000) or is not a
    plain decimal number (-0, 0x10, +1000), naming the variable and the fix, and run nothing."""
    code, out = run_in_image(SHOW_IDS, environment=env)
    assert code == 64, f"{env} should stop the container with 64, got {code}:\n{out}"
    assert re.search(rf"^ERROR .*{re.escape(named)}.*Fix: ", out, re.MULTILINE), \
        f"the ERROR should say {named!r} with the fix:\n{out}"
    assert "ids=" not in out, f"the command ran although {env} was refused:\n{out}"


def test_leading_zeros_are_read_as_the_decimal_number(run_in_image):
    """Container should take HOST_UID=01000 as UID 1000 (dev's own): no change, no tool noise."""
    code, out = run_in_image(SHOW_IDS, environment={"HOST_UID": "01000", "HOST_GID": "02345"})
    assert code == 0 and "ids=1000:2345" in out, f"dev should be 1000:2345:\n{out}"
    assert "usermod" not in out and "no changes" not in out, f"a stray tool message:\n{out}"


@pytest.mark.parametrize("env,named", [
    ({"HOST_UID": "100"}, r"HOST_UID=100 is the UID of the image's 'sshd' account"),
    ({"HOST_UID": "65534"}, r"HOST_UID=65534 is the UID of the image's 'nobody' account"),
    ({"HOST_UID": "1"}, r"HOST_UID=1 is the UID of the image's 'daemon' account"),
    ({"HOST_GID": "42"}, r"HOST_GID=42 is the GID of the privileged group 'shadow'"),
    ({"HOST_GID": "27"}, r"HOST_GID=27 is the GID of the privileged group 'sudo'"),
    ({"HOST_GID": "0042"}, r"HOST_GID=42 is the GID of the privileged group 'shadow'"),
    ({"HOST_GID": "1"}, r"HOST_GID=1 is the GID of 'daemon', the image's 'daemon' account's group"),
    ({"HOST_GID": "65534"}, r"HOST_GID=65534 is the GID of 'nogroup', the image's '\w+' account's group"),
], ids=["sshd", "nobody", "daemon", "shadow", "sudo", "shadow-0042", "daemon-group", "nogroup"])
def test_system_account_uids_and_privileged_gids_are_refused(run_in_image, env, named):
    """Container should refuse a HOST_UID another account of the image has, or the GID of a
    privileged group (shadow reads /etc/shadow, sudo) or of another account's group (daemon,
    nogroup), naming it and the fix."""
    code, out = run_in_image(SHOW_IDS, environment=env)
    assert code == 64, f"{env} should stop the container with 64, got {code}:\n{out}"
    assert re.search(rf"^ERROR .*{named}.*refused\. Fix: -e HOST_", out, re.MULTILINE), \
        f"the ERROR should say {named!r} with the fix:\n{out}"
    assert "ids=" not in out, f"the command ran as a shared account:\n{out}"


def test_an_unprivileged_existing_group_is_still_allowed(run_in_image):
    """Container should accept HOST_GID of an ordinary group (20: macOS users' 'staff' GID, which
    is 'dialout' here) and never add a privileged group to dev."""
    code, out = run_in_image(SHOW_IDS, environment={"HOST_UID": "501", "HOST_GID": "20"})
    assert code == 0 and "ids=501:20" in out, f"dev should be 501:20:\n{out}"
    groups = re.search(r"groups=(\S+)", out).group(1).split(",")
    assert not {"shadow", "sudo", "root", "adm"} & set(groups), f"dev got a privileged group: {groups}"


@needs_root
def test_a_workspace_owned_by_a_system_account_is_not_followed(run_in_image, tmp_path):
    """Container should keep dev's own UID/GID when the mounted /workspace belongs to another
    account of the image (UID 100, sshd) and group shadow (42), and say why."""
    os.chown(tmp_path, 100, 42)
    tmp_path.chmod(0o755)  # dev can list it, so only the ownership is in question
    code, out = run_in_image(SHOW_IDS, volumes={str(tmp_path): {"bind": "/workspace", "mode": "rw"}})
    assert code == 0 and "ids=1000:1000" in out, f"dev should keep 1000:1000:\n{out}"
    assert re.search(r"^INFO .*/workspace belongs to UID 100, the UID of the image's 'sshd' account", out,
                     re.MULTILINE), f"the log should say why the owner is not followed:\n{out}"


def test_grant_sudo_under_no_new_privileges_says_sudo_cannot_work(run_in_image):
    """Container should say at start that GRANT_SUDO=1 cannot work under
    --security-opt no-new-privileges, and not claim that dev has sudo."""
    code, out = run_in_image(["bash", "-c", "sudo -n true 2>/dev/null; echo sudo_rc=$?"],
                             environment={"GRANT_SUDO": "1"}, security_opt=["no-new-privileges"])
    assert code == 0 and "sudo_rc=1" in out, f"sudo should fail under no-new-privileges:\n{out}"
    assert re.search(r"^WARN .*GRANT_SUDO=1.*no-new-privileges.*sudo cannot work.*Fix: ", out,
                     re.MULTILINE), f"a WARN with the fix is expected:\n{out}"
    assert "has passwordless sudo" not in out, f"the log claims sudo works:\n{out}"


@needs_root
@pytest.mark.parametrize("command", [None, ["true"]], ids=["services", "command"])
def test_a_workspace_its_owner_cannot_list_stops_with_the_chmod_fix(start_container, tmp_path, command):
    """Container should stop at start, naming `chmod u+rwx` on the host, when the mounted
    /workspace belongs to the user but has mode 000, with no Jupyter tracebacks in the log."""
    os.chown(tmp_path, 4321, 4321)
    tmp_path.chmod(0o000)
    try:
        c = start_container(command, volumes={str(tmp_path): {"bind": "/workspace", "mode": "rw"}})
        code = c.wait(timeout=120 * SLOWDOWN)["StatusCode"]
        out = c.logs().decode(errors="replace")
    finally:
        tmp_path.chmod(0o755)  # so pytest can remove it
    assert code == 64, f"the container should stop with 64, got {code}:\n{out[-3000:]}"
    assert re.search(r"^ERROR .*/workspace \(owner 4321, mode 0\) cannot be listed.*Fix: on the "
                     r"host, .*chmod u\+rwx", out, re.MULTILINE), f"an ERROR with the chmod fix:\n{out[-3000:]}"
    assert "HOST_UID" not in out, f"ownership is not the problem here:\n{out[-3000:]}"
    assert "Traceback" not in out and "READY" not in out, f"the log should end at the error:\n{out[-3000:]}"


@pytest.fixture
def derived(docker_client, image_ref):
    """Factory: derived(*lines) -> a tag built FROM the image under test plus `lines` (ENV, USER),
    as a team's own image would; every one is removed after the test."""
    made = []

    def build(*lines):
        ref = f"team-dl-user-test:{uuid.uuid4().hex[:8]}"
        dockerfile = "\n".join((f"FROM {image_ref}", *lines)) + "\n"
        docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=ref, rm=True)
        made.append(ref)
        return ref

    yield build
    for ref in made:
        remove_image(ref)


def test_nb_uid_and_gid_in_a_derived_image_are_the_users_default_ids(run_in_image, derived):
    """A derived image's `ENV NB_UID=3000 NB_GID=3000` (docker-stacks' convention) should make dev
    3000:3000 at start, and say so; HOST_UID/HOST_GID still override it."""
    ref = derived("ENV NB_UID=3000 NB_GID=3000")
    code, out = run_in_image(SHOW_IDS, image=ref)
    assert code == 0 and "ids=3000:3000" in out, f"dev should run as 3000:3000 from ENV NB_UID/NB_GID:\n{out}"
    assert "User dev is now UID 3000, GID 3000" in out, f"the log should say that dev was remapped:\n{out}"
    code, out = run_in_image(SHOW_IDS, image=ref, environment={"HOST_UID": "4000", "HOST_GID": "4000"})
    assert code == 0 and "ids=4000:4000" in out, f"HOST_UID/HOST_GID should override NB_UID/NB_GID:\n{out}"


def _ssh_off_warning(start_container, **kwargs):
    """The WARN line a non-root start with a public key gives (SSH needs a root start)."""
    c = start_container(environment={"PUBLIC_KEY": Key().public}, **kwargs)
    logs = wait_for_log(c, r"(?m)^WARN .*SSH is off", 120)
    return next(line for line in logs.splitlines() if re.match(r"WARN .*SSH is off", line))


def test_a_user_line_in_the_image_gets_the_dockerfile_fix_not_remove_user(start_container, derived):
    """A derived image's `USER dev` (no --user given) should be named as the cause of the non-root
    start, with the fix in its Dockerfile (USER root), never "Remove --user"."""
    line = _ssh_off_warning(start_container, image=derived("USER dev"))
    assert "USER dev" in line and "USER root" in line, f"the image's USER line and its fix should be named:\n{line}"
    assert not re.search(r"[Rr]emove --user", line), (
        f"no --user was given, so removing it is no fix:\n{line}")


def test_a_user_flag_gets_the_remove_user_fix(start_container):
    """`docker run --user 1000:1000` should be named as the cause of the non-root start, with
    removing --user as the fix."""
    line = _ssh_off_warning(start_container, user="1000:1000")
    assert "--user 1000:1000" in line and "Remove --user" in line, f"--user and its fix should be named:\n{line}"
