"""Ready-made ways to run the image: docker-compose.yml parses, reserves the GPU, and its CPU
profile starts a healthy service on this GPU-less host with the token and key from .env;
.devcontainer/devcontainer.json is valid and names the image.

Compose: `docker compose` (v2 plugin) where it exists, else Debian's `docker-compose` (v1.29);
COMPOSE="..." picks one explicitly.
"""
import json
import os
import pathlib
import re
import shlex
import subprocess
import uuid

import build_info
import paramiko
import pytest
import requests
import versions
import yaml
from conftest import host_port, wait_for_health

ROOT = pathlib.Path(__file__).resolve().parent.parent

COMPOSE_FILE = ROOT / "docker-compose.yml"
DEVCONTAINER = ROOT / ".devcontainer" / "devcontainer.json"
HOST_UID = 4242 if os.geteuid() == 0 else os.geteuid()


def compose_command():
    if os.environ.get("COMPOSE"):
        return shlex.split(os.environ["COMPOSE"])
    for cmd in (["docker", "compose"], ["docker-compose"]):
        try:
            if subprocess.run([*cmd, "version"], capture_output=True, check=False).returncode == 0:
                return cmd
        except FileNotFoundError:
            pass
    pytest.fail("neither `docker compose` nor `docker-compose` works: make host-setup installs it "
                "(or: apt-get install docker-compose)")


@pytest.fixture
def project(tmp_path, docker_client):
    """A compose project in tmp_path (its .env and /workspace), with free host ports.
    Yields run(*args) -> CompletedProcess; `down -v` removes everything afterwards."""
    name = f"teamdltest{uuid.uuid4().hex[:8]}"
    key = paramiko.RSAKey.generate(2048)
    # Host port 0: Docker binds a free port itself when the service starts (read back with
    # host_port), instead of a port picked here and released, which another process can take.
    env = dict(os.environ, PORT_JUPYTER="0", PORT_SSH="0")
    env.pop("TEAM_IMAGE", None)
    state = {"env": env, "token": uuid.uuid4().hex, "key": key, "name": name, "dir": tmp_path}
    # The project directory belongs to a non-root host user, as a real checkout does: as root
    # (this CI), a made-up one; otherwise (a GitHub runner) the user running the tests.
    if os.geteuid() == 0:
        os.chown(tmp_path, HOST_UID, HOST_UID)
    (tmp_path / ".env").write_text(
        f"JUPYTER_TOKEN={state['token']}\nPUBLIC_KEY={key.get_name()} {key.get_base64()} test\n")
    base = [*compose_command(), "-f", str(COMPOSE_FILE), "--project-directory", str(tmp_path),
            "-p", name]

    def run(*args, extra_env=None):
        return subprocess.run([*base, *args], capture_output=True, text=True, check=False,
                              env=dict(env, **(extra_env or {})), timeout=300)

    state["run"] = run
    yield state
    run("--profile", "cpu", "down", "-v", "--remove-orphans", "-t", "5")
    for c in docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={name}"}):
        c.remove(force=True, v=True)


def test_compose_config_reserves_the_gpu_with_shm_ports_volume_and_env_file(project):
    """docker-compose.yml should parse, reserve all NVIDIA GPUs, set shm, ports, volume, env."""
    result = project["run"]("config")
    assert result.returncode == 0, f"compose config failed:\n{result.stderr}"
    config = yaml.safe_load(result.stdout)
    dl = config["services"]["dl"]
    devices = dl["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices), \
        f"no NVIDIA GPU reservation: {devices}"
    assert str(dl["shm_size"]).lower() in ("8gb", "8589934592"), f"shm_size is {dl['shm_size']}"
    targets = {int(p["target"]) if isinstance(p, dict) else int(str(p).rsplit(":", 1)[1])
               for p in dl["ports"]}
    assert targets == {8888, 22}, f"published container ports are {targets}"
    mounts = [v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in dl["volumes"]]
    assert any(m.split(":")[1] == "/workspace" for m in mounts), f"no /workspace volume: {mounts}"
    assert dl["environment"]["JUPYTER_TOKEN"] == project["token"], "the .env token was not read"
    assert "profiles" not in dl, "the GPU service should start by default"


def test_compose_tells_the_entrypoint_its_stop_grace_period(project):
    """docker-compose.yml should set STOP_TIMEOUT to its stop_grace_period in seconds, so jobs
    in tmux or a terminal get that time to save on `docker compose stop`, not the default 10 s."""
    result = project["run"]("config")
    assert result.returncode == 0, f"compose config failed:\n{result.stderr}"
    dl = yaml.safe_load(result.stdout)["services"]["dl"]
    grace = str(dl["stop_grace_period"])
    seconds = int(grace[:-1]) * {"s": 1, "m": 60}[grace[-1]]
    assert dl["environment"].get("STOP_TIMEOUT") == str(seconds), (
        f"STOP_TIMEOUT should be {seconds} (stop_grace_period {grace}), is "
        f"{dl['environment'].get('STOP_TIMEOUT')!r}")
    # One setting for both, and the host ports for the ready line, from the environment or .env.
    moved = yaml.safe_load(project["run"]("config", extra_env={"STOP_TIMEOUT": "45", "PORT_JUPYTER": "18888"}).stdout)
    dl = moved["services"]["dl"]
    assert (str(dl["stop_grace_period"]), dl["environment"].get("STOP_TIMEOUT")) == ("45s", "45"), dl
    assert dl["environment"].get("HOST_PORT_JUPYTER") == "18888", dl["environment"]


def test_compose_default_image_is_the_version_file_tag(project):
    """The compose and devcontainer image should be versions.json's descriptive tag."""
    config = yaml.safe_load(project["run"]("config").stdout)
    expected = f"team-dl:{build_info.tag(versions.row())}"
    assert config["services"]["dl"]["image"] == expected, \
        f"compose names {config['services']['dl']['image']}, versions.json says {expected}"
    devcontainer = load_jsonc(DEVCONTAINER)
    assert devcontainer["image"] == expected, \
        f"devcontainer names {devcontainer['image']}, versions.json says {expected}"


def test_compose_cpu_profile_starts_a_healthy_service_with_token_and_key(project, image_ref,
                                                                         docker_client):
    """On a GPU-less host the cpu profile should start; Jupyter and SSH use the .env secrets."""
    extra = {"TEAM_IMAGE": image_ref}
    up = project["run"]("--profile", "cpu", "up", "-d", "dl-cpu", extra_env=extra)
    assert up.returncode == 0, f"compose up failed:\n{up.stdout}\n{up.stderr}"
    [container] = docker_client.containers.list(
        all=True, filters={"label": [f"com.docker.compose.project={project['name']}",
                                     "com.docker.compose.service=dl-cpu"]})
    wait_for_health(container, timeout=180)

    api = f"http://127.0.0.1:{host_port(container, '8888/tcp')}/api/status"
    assert requests.get(api, params={"token": project["token"]}, timeout=10).status_code == 200, \
        "Jupyter refused the token from .env"
    assert requests.get(api, timeout=10).status_code == 403, "Jupyter answered without a token"

    marker = project["dir"] / f"from-host-{uuid.uuid4().hex[:6]}"
    marker.write_text("hi\n")
    ssh = paramiko.SSHClient()
    ssh.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # fresh per-container host keys
    try:
        ssh.connect("127.0.0.1", port=host_port(container, "22/tcp"), username="dev",
                    pkey=project["key"], allow_agent=False, look_for_keys=False, timeout=20)
        _, out, _ = ssh.exec_command(
            "id -un; touch /workspace/by-dev; ls /workspace; df -k /dev/shm | tail -1", timeout=30)
        text = out.read().decode()
    finally:
        ssh.close()
    lines = text.split()
    assert lines[0] == "dev", f"SSH session runs as {lines[0]!r}, not dev"
    assert marker.name in text, f"the project directory is not /workspace:\n{text}"
    owner = (project["dir"] / "by-dev").stat().st_uid
    assert owner == HOST_UID, f"a file dev wrote in /workspace belongs to {owner}, not {HOST_UID}"
    shm_kb = int(re.findall(r"\s(\d+)\s+\d+\s+\d+\s+\d+%", text)[-1])
    assert shm_kb >= 8 * 1024 * 1024 - 1, f"/dev/shm is {shm_kb} kB, compose asks for 8 GB"


def load_jsonc(path):
    """JSON with whole-line // comments, as VS Code writes devcontainer.json."""
    text = "\n".join(line for line in path.read_text().splitlines()
                     if not line.lstrip().startswith("//"))
    return json.loads(text)


def test_devcontainer_json_is_valid_and_opens_the_workspace_as_dev():
    """devcontainer.json should parse, run the entrypoint as is, and log in as dev at /workspace."""
    config = load_jsonc(DEVCONTAINER)
    assert config["remoteUser"] == "dev", f"remoteUser is {config.get('remoteUser')}"
    assert config["workspaceFolder"] == "/workspace", f"workspaceFolder {config['workspaceFolder']}"
    assert "target=/workspace" in config["workspaceMount"], f"mount {config['workspaceMount']}"
    assert config["hostRequirements"]["gpu"] in (True, "optional"), "no GPU request"
    assert "--shm-size=8g" in config["runArgs"], f"no shm size in {config['runArgs']}"
    assert config["overrideCommand"] is False, "the tooling would replace the entrypoint's services"


def devcontainer_cli():
    """The Dev Containers CLI (npm @devcontainers/cli): $DEVCONTAINER, .venv-test/npm, PATH."""
    import shutil

    for candidate in (os.environ.get("DEVCONTAINER"),
                      str(ROOT / ".venv-test" / "npm" / "node_modules" / ".bin" / "devcontainer"),
                      shutil.which("devcontainer")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no Dev Containers CLI: make test-deps installs it into .venv-test/npm (needs npm: "
                "make host-setup)")


def test_devcontainer_up_opens_the_workspace_as_dev_with_services(tmp_path, image_ref,
                                                                   docker_client):
    """`devcontainer up` should start the image's entrypoint and open /workspace as dev."""
    workspace = tmp_path / "project"
    (workspace / ".devcontainer").mkdir(parents=True)
    config = load_jsonc(DEVCONTAINER)
    config["image"] = image_ref  # the name itself is checked against versions.json above
    (workspace / ".devcontainer" / "devcontainer.json").write_text(json.dumps(config))
    if os.geteuid() == 0:
        os.chown(workspace, HOST_UID, HOST_UID)
    cli = [devcontainer_cli(), "--workspace-folder", str(workspace), "--docker-path", "docker"]
    label = f"devcontainer.local_folder={workspace}"
    try:
        up = subprocess.run([cli[0], "up", *cli[1:]], capture_output=True, text=True,
                            check=False, timeout=300)
        assert up.returncode == 0 and '"outcome":"success"' in up.stdout, \
            f"devcontainer up failed:\n{up.stdout}\n{up.stderr}"
        run = subprocess.run(
            [cli[0], "exec", *cli[1:], "sh", "-c",
             "id -un; id -u; pwd; touch by-dev; ps -o args= -p 1; pgrep -u dev -f jupyter-lab"],
            capture_output=True, text=True, check=False, timeout=120)
        assert run.returncode == 0, f"devcontainer exec failed:\n{run.stdout}\n{run.stderr}"
        user, uid, cwd, pid1, jupyter = run.stdout.strip().splitlines()[:5]
        assert (user, int(uid), cwd) == ("dev", HOST_UID, "/workspace"), \
            f"opened as {user}/{uid} in {cwd}, not dev/{HOST_UID} in /workspace"
        assert pid1.startswith("/usr/bin/tini"), f"PID 1 is {pid1!r}: the entrypoint was replaced"
        assert jupyter.strip().isdigit(), "JupyterLab is not running as dev"
        assert (workspace / "by-dev").stat().st_uid == HOST_UID, "files in /workspace not the host user's"
    finally:
        for c in docker_client.containers.list(all=True, filters={"label": label}):
            c.remove(force=True, v=True)
