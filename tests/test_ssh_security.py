"""What SSH sessions are handed (issue 33): each forwarding kind as decided in sshd's config,
and /etc/team/environment, the file sessions load, readable by dev only and without the
secrets that common tools keep in variables. Each test uses fresh containers."""
import re
import secrets

from test_ssh import exec_in, key, start_with_ssh  # noqa: F401 - key is a fixture

# sshd -T's effective settings: what a client may forward (docs/container.md: SSH and tmux).
FORWARDING = {
    "allowtcpforwarding": "yes",           # VS Code Remote-SSH, ssh -L / -D
    "gatewayports": "no",                  # -R ports listen on the container's loopback only
    "allowagentforwarding": "no",          # ssh -A would give every dev process your agent
    "allowstreamlocalforwarding": "no",    # no unix-socket forwards either way
    "x11forwarding": "no",
    "permittunnel": "no",
}


def test_sshd_forwards_tcp_but_not_the_agent_or_unix_sockets(start_container, key):  # noqa: F811
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


def test_environment_file_is_dev_only_and_leaves_out_tool_secrets(run_in_image):
    """Container should write /etc/team/environment readable by dev only (mode 600), with the
    variables SSH sessions need but none whose name says a tool's secret (GH_PAT, NPM_AUTH,
    SENTRY_DSN...)."""
    env = {name: secrets.token_hex(8) for name in (*TOOL_SECRETS, *NOT_SECRETS)}
    code, out = run_in_image(["bash", "-c", ENV_PROBE], environment={**env, "HOST_UID": "2345"})
    assert code == 0, f"the probe failed:\n{out}"
    mode = re.search(r"^MODE (.*)$", out, re.MULTILINE)
    assert mode and mode.group(1) == "dev:dev 600", (
        f"/etc/team/environment should be dev's, mode 600, is {mode and mode.group(1)!r}:\n{out}")
    written = set(re.findall(r"^NAME (\w+)$", out, re.MULTILINE))
    leaked = sorted(set(TOOL_SECRETS) & written)
    assert not leaked, f"secrets written for SSH sessions: {leaked}"
    missing = sorted(set(NOT_SECRETS) - written)
    assert not missing, f"ordinary variables left out: {missing}"
