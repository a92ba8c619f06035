"""Run at every Python start in /opt/venv (team-uid-env.pth in its site-packages holds the
import). Started without the image's entrypoint (pyxis, a Kubernetes `command:` with
runAsUser, `docker run --entrypoint ''`, Apptainer) as a UID with no passwd entry, a process
has no user name and HOME=/ (or none): getpass.getuser() raises KeyError, which breaks
torch.compile in the user's own code (Inductor names its cache /tmp/torchinductor_<user>), and
Triton, torch hub, matplotlib and pip cannot write under HOME. Only in that case: USER=uid<N>
and a private HOME under the temp dir (the one folder a read-only root filesystem leaves
writable). train_amp.writable_home does the same for itself where this file is absent (outside
the image). Never raises: Python must start whatever happens here."""
import os


def _private_home():
    path = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"home-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except OSError:
        pass
    try:  # someone else's folder of that name (a shared /tmp) is never used
        st = os.stat(path)
        if st.st_uid == os.getuid() and os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    try:
        import tempfile  # only now: its import costs more than the rest of this file
        return tempfile.mkdtemp(prefix=f"home-{os.getuid()}-")
    except OSError:
        return None


def _fix():
    # getpass.getuser()'s own lookup, without importing getpass (a few ms at every start).
    if not any(os.environ.get(k) for k in ("LOGNAME", "USER", "LNAME", "USERNAME")):
        import pwd
        try:
            pwd.getpwuid(os.getuid())
        except KeyError:  # no passwd entry for this UID
            os.environ["USER"] = f"uid{os.getuid()}"
    home = os.environ.get("HOME")
    if home and os.path.isdir(home) and os.access(home, os.W_OK):
        return
    home = _private_home()
    if home:
        os.environ["HOME"] = home


try:
    _fix()
except Exception:  # noqa: BLE001, S110 - a start-up hook must not stop Python from starting
    pass
