"""doctor.py's checks of what `make run` publishes and names: its host ports (free, or held by
which container, and the next free one) and its container name (valid, not already taken), and
the default name itself (`doctor.py name`)."""
import os
import pwd
import re
import socket

from doctor_report import FAIL, OK, WARN, Row

# Docker's container names (daemon/names: RestrictedNamePattern).
VALID_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")


def sanitise(text):
    """Runs of characters Docker refuses in a name become one dash; no dash, dot or underscore
    at either end (Docker wants a letter or digit first; a trailing dash reads as a lost part)."""
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-_.")


def container_name(image, user):
    """IMAGE-USER as a valid Docker name: a namespace or tag (ml/team-dl:dev) becomes dashes, an
    unset USER (root shells, CI, sudo) falls back to the account name (`id -un`), and no name
    ever ends in a dash."""
    if not user:
        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:  # a UID with no passwd entry (docker run --user 1234): no suffix
            user = ""
    name = "-".join(p for p in (sanitise(image), sanitise(user)) if p)
    return name if VALID_NAME.match(name) else f"team-dl-{name}".strip("-")


def port_holders(h, port):
    """Names of containers publishing host port `port`."""
    rx = re.compile(rf"(?:^|[\s,])[\w.:\[\]]*:{port}->")
    return [c.get("Names", "?") for c in h.containers()
            if c.get("State") == "running" and rx.search(c.get("Ports") or "")]


def port_free(port):
    """Can make run's `-p PORT:...` bind it? Docker binds every address, as this does; address
    reuse on, as Docker's proxy has it, so only a listener (not TIME_WAIT) counts as taken."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, port))
        except OSError as e:
            if e.errno != 99:  # EADDRNOTAVAIL: IPv6 disabled, not a taken port
                return False
        finally:
            s.close()
    return True


def check_ports(h, ports, container, strict):
    rows = []
    others = {p for _, p in ports}
    for var, port in ports:
        if not 1 <= port <= 65535:
            rows.append(Row(FAIL, f"port {port}", f"{var}={port} is not a TCP port",
                            f"make run {var}=<1..65535>"))
            continue
        if port_free(port):
            rows.append(Row(OK, f"port {port}", f"{var}={port} is free"))
            continue
        nxt = next((p for p in range(port + 1, min(port + 200, 65536))
                    if p not in others and port_free(p)), None)
        holders = port_holders(h, port)
        by = f" by container {', '.join(holders)}" if holders else " by another program"
        fix = [f"make run {var}={nxt}" + (" (the next free port)" if nxt else "")]
        if holders and container in holders:
            rows.append(Row(FAIL if strict else WARN, f"port {port}",
                            f"{var}={port} is taken by your running {container}",
                            ["make stop, then make run again; or make logs for its URL"] + fix))
            continue
        if holders:
            fix.append(f"or stop that container: docker stop {holders[0]}")
        else:
            fix.append(f"or find the program: ss -ltnp 'sport = :{port}'")
        rows.append(Row(FAIL, f"port {port}", f"{var}={port} is in use{by}", fix))
    return rows


def check_container(h, container, strict):
    if not VALID_NAME.match(container):
        good = sanitise(container)
        good = good if VALID_NAME.match(good) else f"team-dl-{good}".strip("-")
        return [Row(FAIL, "container name", f"CONTAINER={container!r} is not a valid Docker name "
                    "(letters, digits, _ . -; starting with a letter or digit)",
                    f"make run CONTAINER={good}")]
    same = [c for c in h.containers() if c.get("Names") == container]
    if not same:
        return [Row(OK, "container name", f"{container} (no container of that name yet)")]
    c = same[0]
    if c.get("State") == "running":
        return [Row(FAIL if strict else WARN, "container name",
                    f"{container} is already running ({c.get('Status', '')}, {c.get('Image', '')})",
                    [(f"reach it: make logs (the ==> READY line has the JupyterLab URL), or "
                     f"docker attach {container}"),
                     "stop it: make stop",
                     ("or start a second one: make run CONTAINER=<other name> PORT_JUPYTER=<port> "
                     "PORT_SSH=<port>")])]
    return [Row(FAIL if strict else WARN, "container name",
                f"a stopped container named {container} exists ({c.get('Status', '')})",
                "remove it: make stop (or docker rm " + container + ")")]
