"""doctor.py's checks for a team member (REGISTRY set: make run pulls, nothing is built): the
registry has the tag (for which platforms), the SSH key make run hands over, a WORKSPACE the
container's user can write. Each is a Row with its fix; the build base is no concern here."""
import pathlib
import shutil
import subprocess

import registry
import ssh_key
from doctor_report import FAIL, OK, WARN, Row

# make doctor and make run's pre-flight must answer in seconds, not after pull.py's 20 s a request.
REGISTRY_TIMEOUT = 5
# The image's user (Dockerfile ARG NB_UID): the entrypoint gives it the UID of the mounted
# /workspace's owner, except root's (HOST_UID=0 is refused), so a root-owned one stays 1000's problem.
NB_UID = 1000


def check_registry(image):
    """The registry answers and has REF; which platforms its index holds."""
    registry.TIMEOUT = REGISTRY_TIMEOUT
    try:
        ref = registry.Ref(image)
        digest, media_type, data = registry.Client(ref).manifest()
    except registry.RegistryError as e:
        return [Row(FAIL, "registry", str(e).replace(", then run make pull again", "").replace(
            "then run make pull again", "then make doctor again"))]
    except ValueError as e:
        return [Row(FAIL, "registry", f"{image}: {e}")]
    if media_type in registry.INDEX_TYPES or "manifests" in data:
        platforms = sorted({f"{m['platform']['os']}/{m['platform']['architecture']}" for m in data["manifests"]
                            if m.get("platform", {}).get("os") not in (None, "unknown")})
        what = ", ".join(platforms) or "no platform named"
    else:
        what = "one platform (no index)"
    return [Row(OK, "registry", f"{ref.host} has {image.split('/', 1)[-1]} ({digest[:19]}; {what})")]


def check_ssh_key():
    """The key make run hands the container (scripts/ssh_key.py's order), or how to make one."""
    source, _ = ssh_key.choose(".env")
    if source:
        return [Row(OK, "ssh key", f"make run hands the container the key from {source}")]
    return [Row(WARN, "ssh key", "no SSH public key (no ~/.ssh/*.pub, no ssh-agent key, PUBLIC_KEY unset): "
                "make run starts JupyterLab but not SSH", ["ssh-keygen -t ed25519, then make run"])]


def acl_grants(path, uid):
    """True when an ACL entry lets uid write path (getfacl; False without it)."""
    if not shutil.which("getfacl"):
        return False
    r = subprocess.run(["getfacl", "-p", "-n", str(path)], capture_output=True, text=True, check=False)
    return any(ln.startswith(f"user:{uid}:") and "w" in ln.split(":")[2][:3] for ln in r.stdout.splitlines())


def check_workspace(workspace, strict):
    """WORKSPACE (make run's /workspace) must be writable by the container's user: one the root
    user owns is not (the entrypoint would say so after the start), unless an ACL or o+w lets it."""
    path = pathlib.Path(workspace or ".")
    shown = "." if path.resolve() == pathlib.Path.cwd().resolve() else str(path)
    if not path.is_dir():
        return [Row(FAIL if strict else WARN, "workspace", f"WORKSPACE={path} is not a folder here",
                    [f"mkdir -p {shown}"])]
    st = path.stat()
    if st.st_uid != 0 or st.st_mode & 0o002 or acl_grants(path, NB_UID):
        return [Row(OK, "workspace", f"{shown} is on /workspace (owner UID {st.st_uid}: the container's user "
                    "takes that UID and writes there)")]
    return [Row(FAIL, "workspace", f"{shown} belongs to root (mode {st.st_mode & 0o777:o}), so the container's user "
                f"(UID {NB_UID}) cannot save notebooks or files there",
                ["one step here, as root (root stays the owner; apt-get install acl):",
                 f"  setfacl -R -m u:{NB_UID}:rwX -m d:u:{NB_UID}:rwX {shown}",
                 "or keep your work elsewhere: make run WORKSPACE=<a folder of your user's>"])]


def team_rows(h, o):
    """make doctor with REGISTRY: what a team member's make run needs, instead of the base."""
    rows = [Row(OK, "image", f"{o.image} is here (make pull fetches a newer one)")] if h.image_present(o.image) \
        else [Row(OK, "image", f"{o.image} is not here: make run pulls it (no build base needed)")]
    return rows + check_registry(o.image) + check_ssh_key() + check_workspace(o.workspace, strict=False)
