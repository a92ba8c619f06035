"""The image under Podman (Debian's podman; docs/podman.md): it starts, JupyterLab answers with its
token only, sshd lets the key in; as root, and rootless with --userns=keep-id when
PODMAN_ROOTLESS_USER names a user with /etc/subuid ranges (a second copy of the image: opt-in).

The image is copied from Docker into podman's storage once per module (`podman pull
docker-daemon:`; measured in docs/podman.md) and removed from it afterwards, so podman's storage
holds no 7 GB copy after the suite (unless it was there before)."""
import json
import os
import pathlib
import pwd
import re
import resource
import subprocess
import time

import pytest
from conftest import READY, require_tool, wait_for_log
from ssh_client import Key, ssh_connect, ssh_run
from test_jupyter import api

# Slow (the 7 GB image copied into podman's storage, 95 s of CI's 103) and Podman's support
# rarely breaks between two Dockerfile changes: make test-slow, weekly (docs/testing.md).
pytestmark = pytest.mark.slow

ROOTLESS_USER = os.environ.get("PODMAN_ROOTLESS_USER", "")


def hybrid_cgroups(root="/sys/fs/cgroup"):
    """Whether this host mounts cgroup v1 controllers and a cgroup2 tree beside them (systemd's
    "hybrid" layout, this CI machine's): crun, podman's default runtime when installed, refuses
    it ("cgroups in hybrid mode not supported"); runc runs there."""
    mounts = pathlib.Path("/proc/self/mounts").read_text().split("\n")
    kinds = {f[2] for f in (m.split() for m in mounts) if len(f) > 2 and f[1].startswith(root)}
    return {"cgroup", "cgroup2"} <= kinds


class Podman:
    """The podman CLI as root, or as `user` (rootless: through runuser, in that user's home).
    On a hybrid cgroup host it runs containers with runc (docs/podman.md says why)."""

    def __init__(self, user=None):
        self.user = user
        self.home = pwd.getpwnam(user).pw_dir if user else None
        self.prefix = ["runuser", "-u", user, "--"] if user else []
        self.runtime = (["--runtime", "runc"] if hybrid_cgroups() and not user
                        and require_tool("runc", "runc") else [])

    def __call__(self, *args, timeout=120, check=True, **kw):
        r = subprocess.run([*self.prefix, require_tool("podman", "podman"), *self.runtime, *args], cwd=self.home,
                           capture_output=True, text=True, timeout=timeout, check=False, **kw)
        assert not check or r.returncode == 0, f"podman {' '.join(args)}: {r.returncode}\n{r.stderr}"
        return r

    def copy_from_docker(self, ref):
        """Copy the image from Docker's storage into podman's: -> True when it was not there."""
        if self("image", "exists", ref, check=False).returncode == 0:
            return False
        start = time.monotonic()
        if self.user:  # docker-daemon: needs Docker's socket, which only root may use
            save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
            self("load", "-q", stdin=save.stdout, timeout=900)
            assert save.wait() == 0, "docker save failed"
        else:
            self("pull", "-q", f"docker-daemon:{ref}", timeout=900)
        print(f"\ncopied {ref} into podman{' (' + self.user + ')' if self.user else ''}'s storage "
              f"in {time.monotonic() - start:.0f} s")
        return True


class PodmanContainer:
    """What conftest's wait_for_log and ssh_client's ssh_connect ask of a Docker SDK container."""

    def __init__(self, podman, cid):
        self.podman, self.id = podman, cid
        self.reload()

    def reload(self):
        self.attrs = json.loads(self.podman("inspect", self.id).stdout)[0]
        self.status = self.attrs["State"]["Status"]

    def logs(self):
        r = self.podman("logs", self.id, check=False)
        return (r.stdout + r.stderr).encode()


def podman_ulimits():
    """As root, podman raises nofile and nproc to its own defaults (1048576, 4194304) and runc
    fails ("error setting rlimit type 7: operation not permitted") on hosts whose hard limits are
    lower (this project's VMs: nofile 20000); ask for the host's instead. nproc is also capped
    at pid_max: there, 32768 (pid_max) worked and 50000 failed though the hard limit is 96367."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    pid_max = int(pathlib.Path("/proc/sys/kernel/pid_max").read_text())
    nproc = min(n for n in (resource.getrlimit(resource.RLIMIT_NPROC)[1], pid_max)
                if n != resource.RLIM_INFINITY)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def podman_for(user):
    if user is None:
        if os.geteuid() != 0:
            pytest.skip("podman as root needs a root test runner (make test as root, as CI)")
        return Podman()
    if not user:
        pytest.skip("rootless podman copies the image again (~7 GB): set PODMAN_ROOTLESS_USER to a "
                    "user with /etc/subuid and /etc/subgid ranges (useradd makes them) to run it")
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK) or os.stat("/dev/net/tun").st_mode & 0o006 != 0o006:
        pytest.skip("rootless podman's network (slirp4netns) needs /dev/net/tun open to users: "
                    "chmod 0666 /dev/net/tun (its usual mode)")
    return Podman(user)


@pytest.fixture(scope="module", params=[None, ROOTLESS_USER], ids=["root", "rootless-keep-id"])
def podman(request, image_ref):
    """(Podman, image_ref) with the image in that podman's storage; removed afterwards if copied."""
    p = podman_for(request.param)
    copied = p.copy_from_docker(image_ref)
    yield p, image_ref
    if copied:
        for ref in (image_ref, f"localhost/{image_ref}"):
            p("rmi", "-f", ref, check=False)
        assert p("image", "exists", image_ref, check=False).returncode != 0, "the copy is still there"


@pytest.fixture
def start_podman(podman, tmp_path):
    """Factory: start a detached container with Jupyter and SSH on random 127.0.0.1 ports and a
    /workspace owned by a host user (rootless: the podman user; root: UID 4242); always removed.
    -> (container, workspace, that UID)."""
    p, ref = podman
    started = []

    def start(*flags):
        workspace = pathlib.Path(p.home or tmp_path) / f"ws-{tmp_path.name}"
        workspace.mkdir()
        owner = pwd.getpwnam(p.user).pw_uid if p.user else 4242
        os.chown(workspace, owner, owner)
        cid = p("run", "-d", "--shm-size=1g", "-p", "127.0.0.1::8888", "-p", "127.0.0.1::22",
                "-v", f"{workspace}:/workspace", *flags, ref).stdout.strip()
        started.append((cid, workspace))
        return PodmanContainer(p, cid), workspace, owner

    yield start
    for cid, workspace in started:
        p("rm", "-f", cid, check=False)
        subprocess.run(["rm", "-rf", str(workspace)], check=False)


def test_podman_starts_jupyter_with_its_token_and_ssh_with_a_key(podman, start_podman):
    """Container under podman should start cleanly, serve JupyterLab to its token only and let
    the key in over SSH as dev, who owns the files it makes in /workspace on the host."""
    p, _ = podman
    key = Key()
    flags = ["-e", f"PUBLIC_KEY={key.public}"]
    # Rootless: the host user is dev's UID 1000 inside (plain keep-id adds the user's own UID to
    # /etc/passwd, which the entrypoint then refuses to give dev), and the entrypoint starts as root.
    flags += ["--userns=keep-id:uid=1000,gid=1000", "--user", "root"] if p.user else podman_ulimits()
    c, workspace, owner = start_podman(*flags)
    logs = wait_for_log(c, READY, timeout=180)
    assert not [ln for ln in logs.splitlines() if ln.startswith(("WARN", "ERROR"))], logs
    token = re.search(r"/lab\?token=([0-9a-f]+)", logs)  # the ready line's (Jupyter's is redacted)
    assert token, f"no generated token in the ready line:\n{logs}"
    token = token.group(1)
    base = f"http://127.0.0.1:{c.attrs['NetworkSettings']['Ports']['8888/tcp'][0]['HostPort']}"
    assert api(base, "/api/contents").status_code == 403, "no token should be refused"
    assert api(base, "/api/contents", token).status_code == 200, "the logged token should work"
    client = ssh_connect(c, key.pkey)
    try:
        rc, out, err = ssh_run(client, "id -un && touch /workspace/made-over-ssh")
    finally:
        client.close()
    assert (rc, out.strip()) == (0, "dev"), (rc, out, err)
    made = (workspace / "made-over-ssh").stat().st_uid
    assert made == owner, f"a file dev made is owned by UID {made} on the host, not {owner} (/workspace's)"
