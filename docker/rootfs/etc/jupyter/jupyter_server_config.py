# JupyterLab's settings in the team image, read by Jupyter each time it starts (docker-stacks
# ships its jupyter_server_config.py the same way). Other settings go in files of their own in
# /etc/jupyter/jupyter_server_config.d/ (*.json or *.py), loaded at the end of this one.
#
# Only the services' JupyterLab is configured: services.sh starts it with TEAM_JUPYTER_DIR set.
# Step 40-jupyter.sh has already checked what the user gave (JUPYTER_PORT, JUPYTER_TOKEN[_FILE],
# JUPYTER_PASSWORD_HASH) and put the secrets in files in that folder, which only the user Jupyter
# runs as can read; read from there, they are never in argv (`ps`) nor in the kernels'
# environment. A `jupyter` command run with `docker run IMAGE jupyter ...` keeps Jupyter's defaults.
import json
import os
import pathlib
import sys
import time

from traitlets.config import Config

c = get_config()  # noqa: F821  (Jupyter defines it for config files)
secrets = os.environ.get("TEAM_JUPYTER_DIR")

if secrets:
    c.ServerApp.ip = "0.0.0.0"
    c.ServerApp.port = int(os.environ["JUPYTER_PORT"])
    c.ServerApp.port_retries = 0  # a busy port is an error, not a silent move to another one
    c.ServerApp.open_browser = False
    c.ServerApp.allow_root = False
    c.ServerApp.root_dir = "/workspace"
    c.ServerApp.terminado_settings = {"shell_command": ["/bin/bash", "-l"]}
    # jupyter_server pairs a 30 s ping with a 90 s timeout, which tornado >= 6.5 cuts to 30 s
    # with a WARN on every websocket: ask for the 30 s it ends up with anyway.
    c.ServerApp.tornado_settings = {"ws_ping_timeout": 30000}
    # Kernels on unix sockets (mode 700 runtime dir), not localhost TCP ports that any process
    # in the container can reach; also ends ipykernel's "running over TCP" WARNING per kernel.
    c.KernelManager.transport = "ipc"
    # The token: empty only with a password, or with JUPYTER_ALLOW_INSECURE=1 (40-jupyter.sh).
    c.IdentityProvider.token = pathlib.Path(secrets, "token").read_text()
    password_hash = pathlib.Path(secrets, "password_hash")
    if password_hash.exists():
        c.PasswordIdentityProvider.hashed_password = password_hash.read_text()

# Drop-ins, in name order, after the settings above (so a drop-in wins on the same setting).
# Jupyter itself takes only the extension switches (ServerApp.jpserver_extensions) from the
# *.json files there; the rest of what they say is loaded here. A broken one (a syntax error,
# invalid JSON, an exception) is named and skipped whole: uncaught, its error made Jupyter drop
# this entire file, and it then listened on 127.0.0.1 only and ignored the token, while the
# ready line and the healthcheck (which probe from inside) said all was well.
for dropin in sorted(pathlib.Path("/etc/jupyter/jupyter_server_config.d").glob("*")):
    try:
        if dropin.suffix == ".json":
            c.merge(Config(json.loads(dropin.read_text())))
        elif dropin.suffix == ".py":
            load_subconfig(str(dropin))  # noqa: F821  (Jupyter defines it for config files)
    except Exception as e:  # noqa: BLE001 - any error in a drop-in is the drop-in's, reported
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        sys.stderr.write(
            f"ERROR [{time.strftime('%H:%M:%S', time.gmtime())}] Jupyter drop-in {dropin} is "
            f"broken and was skipped: {type(e).__name__}{where}: {e}. The image's settings stand "
            "(port, 0.0.0.0, token or password). Fix: correct or remove that file\n")
