"""What SSH sessions and the services are handed: each forwarding kind as decided in sshd's
config; /etc/team/environment, the file sessions load, readable by dev only and without the
secrets that common tools keep in variables (by name or by value); and no variable that only
the entrypoint reads in JupyterLab's or a command's environment. Each test uses fresh containers."""
import re
import secrets

from conftest import wait_until
from ssh_client import exec_in, start_with_ssh

# sshd -T's effective settings: what a client may forward (docs/container.md: SSH and tmux).
FORWARDING = {
    "allowtcpforwarding": "yes",           # VS Code Remote-SSH, ssh -L / -D
    "gatewayports": "no",                  # -R ports listen on the container's loopback only
    "allowagentforwarding": "no",          # ssh -A would give every dev process your agent
    "allowstreamlocalforwarding": "no",    # no unix-socket forwards either way
    "x11forwarding": "no",
    "permittunnel": "no",
}


def test_sshd_forwards_tcp_but_not_the_agent_or_unix_sockets(start_container, key):
    """sshd in the container should allow TCP forwarding only: no agent, stream-local, X11 or
    tun forwarding, as its effective configuration (sshd -T) for a dev session says."""
    c = start_with_ssh(start_container, key.public)
    rc, out = exec_in(c, "sshd -T -C user=dev,host=laptop,addr=192.0.2.1")
    assert rc == 0, f"sshd -T failed: {out}"
    effective = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    wrong = {k: effective.get(k) for k, v in FORWARDING.items() if effective.get(k) != v}
    assert not wrong, f"forwarding settings differ from the decided ones {FORWARDING}: {wrong}"


# Names the secret filter must know, as tools spell them; and look-alikes that must pass.
TOOL_SECRETS = ("GH_PAT", "GITLAB_PAT", "AZURE_DEVOPS_PAT", "NPM_AUTH", "NPM_CONFIG__AUTH",
                "DOCKER_AUTH_CONFIG", "SENTRY_DSN", "MYSQL_PWD", "SMTP_PASS", "GPG_PASSPHRASE",
                "GOOGLE_APPLICATION_CREDENTIALS", "AWS_CREDS", "OPENAI_APIKEY",
                "SLACK_WEBHOOK_URL", "SESSION_COOKIE")
NOT_SECRETS = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "FILE_PATTERN", "PATH_PREFIX")
ENV_PROBE = ("stat -c 'MODE %U:%G %a' /etc/team/environment; cut -d= -f1 /etc/team/environment"
             " | sed -n 's/^export /NAME /p'")


def test_environment_file_is_roots_readable_by_dev_only_and_leaves_out_tool_secrets(run_in_image):
    """Container should write /etc/team/environment as root's, readable by dev's group only (mode
    640: dev's SSH sessions source it, so dev must not be able to change it), with the variables
    SSH sessions need but none whose name says a tool's secret (GH_PAT, NPM_AUTH, SENTRY_DSN...)."""
    env = {name: secrets.token_hex(8) for name in (*TOOL_SECRETS, *NOT_SECRETS)}
    code, out = run_in_image(["bash", "-c", ENV_PROBE], environment={**env, "HOST_UID": "2345"})
    assert code == 0, f"the probe failed:\n{out}"
    mode = re.search(r"^MODE (.*)$", out, re.MULTILINE)
    assert mode and mode.group(1) == "root:dev 640", (
        f"/etc/team/environment should be root's, group dev, mode 640, is {mode and mode.group(1)!r}:\n{out}")
    written = set(re.findall(r"^NAME (\w+)$", out, re.MULTILINE))
    leaked = sorted(set(TOOL_SECRETS) & written)
    assert not leaked, f"secrets written for SSH sessions: {leaked}"
    missing = sorted(set(NOT_SECRETS) - written)
    assert not missing, f"ordinary variables left out: {missing}"


# Secrets the filter once missed: by name, and by value under an ordinary name.
MORE_SECRETS = ("AUTH", "BEARER", "OPENAI_BEARER", "API_KEYS", "AWS_KEYS", "DISCORD_HOOK_URL",
                "TEAMS_HOOK_URL")
PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA{}\n-----END OPENSSH PRIVATE KEY-----"


def test_environment_file_leaves_out_auth_bearer_keys_hook_urls_and_private_keys(run_in_image):
    """Container should leave out of /etc/team/environment AUTH, *BEARER*, *_KEYS, *HOOK_URL and any
    variable whose value is a private key or an HTTP bearer credential, and keep look-alikes."""
    env = {name: secrets.token_hex(8) for name in (*MORE_SECRETS, *NOT_SECRETS, "KEYBOARD_LAYOUT")}
    env["DEPLOY_MATERIAL"] = PRIVATE_KEY.format(secrets.token_hex(8))
    env["UPSTREAM_HEADER"] = "Bearer " + secrets.token_hex(16)
    code, out = run_in_image(["bash", "-c", ENV_PROBE], environment=env)
    assert code == 0, f"the probe failed:\n{out}"
    written = set(re.findall(r"^NAME (\w+)$", out, re.MULTILINE))
    leaked = sorted((set(MORE_SECRETS) | {"DEPLOY_MATERIAL", "UPSTREAM_HEADER"}) & written)
    assert not leaked, f"secrets written for SSH sessions: {leaked}"
    missing = sorted({*NOT_SECRETS, "KEYBOARD_LAYOUT"} - written)
    assert not missing, f"ordinary variables left out: {missing}"


# What only the entrypoint reads (entrypoint.sh ENTRYPOINT_ONLY), none of them needed after it.
ENTRYPOINT_ONLY = ("PUBLIC_KEY", "PUBLIC_KEY_FILE", "JUPYTER_TOKEN_FILE", "JUPYTER_ALLOW_INSECURE",
                   "HOST_UID", "HOST_GID", "GRANT_SUDO", "SSH_HOST_KEYS_DIR")
# As dev, the names in JupyterLab's initial environment (what /proc/PID/environ shows any
# process of the same user).
ENVIRON_PROBE = ("for p in $(pgrep -x jupyter-lab); do"
                 " tr '\\0' '\\n' < /proc/$p/environ | sed -n 's/^\\([A-Za-z0-9_]*\\)=.*/JUPYTER \\1/p'; done")


def test_services_and_commands_do_not_inherit_what_only_the_entrypoint_reads(start_container, run_in_image,
                                                                            key, tmp_path):
    """Container should unset PUBLIC_KEY_FILE, JUPYTER_TOKEN_FILE, HOST_UID/HOST_GID, GRANT_SUDO and
    the other variables only the entrypoint reads before JupyterLab or a command starts: a process
    of dev can read JupyterLab's environment in /proc. The user's own variables still get there."""
    (tmp_path / "key.pub").write_text(key.public + "\n")
    (tmp_path / "token").write_text("tok-" + secrets.token_hex(8) + "\n")
    tmp_path.chmod(0o755)
    env = {"PUBLIC_KEY_FILE": "/run/secrets/ssh_public_key", "JUPYTER_TOKEN_FILE": "/run/secrets/jupyter_token",
           "HOST_UID": "1000", "HOST_GID": "1000", "GRANT_SUDO": "0", "SSH_HOST_KEYS_DIR": "/tmp/hostkeys",
           "JUPYTER_ALLOW_INSECURE": "0", "TEAM_TEST_SETTING": "kept"}
    mounts = {str(tmp_path / "key.pub"): {"bind": "/run/secrets/ssh_public_key", "mode": "ro"},
              str(tmp_path / "token"): {"bind": "/run/secrets/jupyter_token", "mode": "ro"}}
    c = start_with_ssh(start_container, key.public, environment=env, volumes=mounts)
    wait_until(lambda: exec_in(c, "curl -fsS -o /dev/null http://127.0.0.1:8888/api")[0] == 0, 120,
               lambda: f"JupyterLab did not come up:\n{c.logs().decode()}")
    _, out = exec_in(c, ENVIRON_PROBE, user="dev")
    seen = set(re.findall(r"^JUPYTER (\w+)$", out, re.MULTILINE))
    assert "TEAM_TEST_SETTING" in seen, f"the probe should see JupyterLab's environment: {out!r}"
    assert not seen & set(ENTRYPOINT_ONLY), f"JupyterLab inherited: {sorted(seen & set(ENTRYPOINT_ONLY))}"
    code, out = run_in_image(["bash", "-c", "compgen -e"], environment=env, volumes=mounts)
    names = set(out.split())
    assert code == 0 and "TEAM_TEST_SETTING" in names, f"the command should see the user's variables:\n{out}"
    assert not names & set(ENTRYPOINT_ONLY), f"the command inherited: {sorted(names & set(ENTRYPOINT_ONLY))}"
