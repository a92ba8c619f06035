"""Run at every Python start in /opt/venv (team-pip-guard.pth in its site-packages holds the
import); does something only in `pip install --upgrade` (or -U, also as `python -m pip`) naming a
package the image pins. /etc/pip.conf's constraint (/opt/venv/etc/constraints.txt) keeps torch,
torchvision, torchaudio, triton and nvidia-* at the versions the tag names, and pip then says
only "Requirement already satisfied" and exits 0, as if no newer version existed. This prints,
when pip ends, which pinned packages stayed where and why, after checking that they did: when
the pins were bypassed (e.g. PIP_CONSTRAINT= set empty) and pip replaced one, it says that
instead. Never raises: Python must start whatever happens here, and in every other process it
costs a look at argv (no imports)."""
import os
import sys

CONSTRAINTS = "/opt/venv/etc/constraints.txt"


def _pip_args(argv):
    """The arguments after `pip` (the script, or `python -m pip`), or None for any other program."""
    # argv[0] is the interpreter: the pip script (pip, pip3, pip3.11) is argv[1].
    if len(argv) > 1 and os.path.basename(argv[1]).rstrip("0123456789.") == "pip":
        return argv[2:]
    for i, arg in enumerate(argv[1:3], start=1):
        if arg == "-m" and argv[i + 1:i + 2] == ["pip"]:
            return argv[i + 2:]
    return None


def _norm(name):
    return name.lower().replace("_", "-").replace(".", "-")


def _name(requirement):
    """The project name at the start of a requirement: torchvision of 'torchvision[x]>=0.2'."""
    for i, ch in enumerate(requirement):
        if not (ch.isalnum() or ch in "-_."):
            return requirement[:i]
    return requirement


def _held_back(args):
    """[(name, pinned version)] of pinned packages an `install --upgrade` names, else []."""
    words = [a for a in args if not a.startswith("-")]
    if not words or words[0] != "install" or "--isolated" in args:
        return []
    if not any(a == "--upgrade" or (a[:2] != "--" and a[:1] == "-" and "U" in a) for a in args):
        return []
    # The guard is off for this command (README, "The tag tells the truth": PIP_CONFIG_FILE=/dev/null) or replaced.
    if os.environ.get("PIP_CONFIG_FILE") or os.environ.get("PIP_CONSTRAINT"):
        return []
    pins = {}
    with open(CONSTRAINTS) as f:
        for line in f:
            # name===version (no local label) or name==version+label: the exact build.
            name, pinned, version = line.strip().partition("==")
            if pinned and not name.startswith("#"):
                pins[_norm(name)] = version.lstrip("=")
    named = {_norm(_name(w)) for w in words[1:]}
    return sorted((name, pins[name]) for name in named if name in pins)


def _installed(name):
    """The version of `name` installed now (as pip left it), or None when it is gone."""
    import importlib.metadata
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _note(held):
    kept = [(name, pin) for name, pin in held if _installed(name) == pin]
    moved = [(name, pin, _installed(name)) for name, pin in held if _installed(name) != pin]
    if kept:
        what = ", ".join(f"{name} {version}" for name, version in kept)
        sys.stderr.write(
            f"team-dl: {what}: held at the image's pinned version, so --upgrade left it as it was "
            f"(the pins, {CONSTRAINTS} through /etc/pip.conf, keep torch and its CUDA libraries "
            "matching the image tag). For newer versions use a newer image; to override for one "
            "command: PIP_CONFIG_FILE=/dev/null pip install ...\n")
    if moved:
        what = ", ".join(f"{name} {pin} -> {now or 'removed'}" for name, pin, now in moved)
        sys.stderr.write(
            f"team-dl: WARNING: {what}: the image's pin ({CONSTRAINTS}) was bypassed and the build "
            "the image tag names is gone; the image's tests and smoke suite no longer describe "
            "this environment. Fix: start a fresh container (or: pip install -c "
            f"{CONSTRAINTS} --force-reinstall <package> from the index the image was built from)\n")


try:
    _args = _pip_args(list(getattr(sys, "orig_argv", sys.argv)))
    _held = _held_back(_args) if _args is not None else []
    if _held:
        import atexit
        atexit.register(_note, _held)
except Exception:  # noqa: BLE001, S110 - see the docstring
    pass
