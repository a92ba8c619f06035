"""Speak to a registry the way Docker does (moby registry/config.go, isSecureIndex and the
endpoint list): HTTPS first, always. A registry Docker counts as insecure (listed by host:port
in daemon.json's insecure-registries, or whose address is in one of its CIDRs: 127.0.0.0/8 by
default) is then accepted with any certificate, and tried over plain HTTP when HTTPS fails; a
secure one gets HTTPS only, trusting the CAs in /etc/docker/certs.d/<host>/ as Docker does.

So a loopback registry with TLS (an `ssh -L` tunnel) works, and so does an HTTP-only registry on
the LAN that the daemon lists as insecure. Used by scripts/registry.py. Standard library only.
"""
import ipaddress
import json
import pathlib
import socket
import ssl
import subprocess
import urllib.error
import urllib.request

DEFAULT_CONFIG = {"InsecureRegistryCIDRs": ["127.0.0.0/8"], "IndexConfigs": {}}  # dockerd's default
CERTS_D = pathlib.Path("/etc/docker/certs.d")
PROBE_TIMEOUT = 3  # seconds: is there plain HTTP on the port (only asked after HTTPS failed)


def daemon_config(docker):
    """The daemon's RegistryConfig (what it counts as insecure); None when it does not answer."""
    try:
        out = subprocess.run([docker, "info", "--format", "{{json .RegistryConfig}}"], capture_output=True,
                             text=True, timeout=15, check=False).stdout
        config = json.loads(out)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _addresses(hostname):
    try:
        return {ipaddress.ip_address(hostname.strip("[]"))}
    except ValueError:
        pass
    try:
        return {ipaddress.ip_address(a[4][0].split("%")[0]) for a in socket.getaddrinfo(hostname, None)}
    except (OSError, ValueError):
        return set()


def is_insecure(host, config=None):
    """Docker's isSecureIndex, negated: host (host[:port]) listed by name with Secure false, or
    one of its addresses in an insecure CIDR."""
    config = config or DEFAULT_CONFIG
    listed = (config.get("IndexConfigs") or {}).get(host)
    if listed is not None:
        return not listed.get("Secure", True)
    hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    nets = []
    for cidr in config.get("InsecureRegistryCIDRs") or []:
        try:
            nets.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            continue
    return any(ip in net for ip in _addresses(hostname) for net in nets if ip.version == net.version)


def docker_says_insecure(host, docker):
    return is_insecure(host, daemon_config(docker))


def context(host, insecure):
    """The TLS settings Docker uses for host: any certificate when insecure, else the system CAs
    plus those in /etc/docker/certs.d/<host>/*.crt."""
    ctx = ssl.create_default_context()
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    for ca in sorted((CERTS_D / host).glob("*.crt")) if (CERTS_D / host).is_dir() else []:
        try:
            ctx.load_verify_locations(str(ca))
        except (OSError, ssl.SSLError):
            pass
    return ctx


def _speaks_plain_http(host):
    try:
        urllib.request.urlopen(f"http://{host}/v2/", timeout=PROBE_TIMEOUT).close()
    except urllib.error.HTTPError:
        return True  # an HTTP answer (401, 404): plain HTTP is there
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True


def unreachable(host, error, insecure):
    """The one line for a request that got no HTTP answer: a certificate Docker would not trust,
    plain HTTP where Docker wants HTTPS, or no answer at all."""
    reason = getattr(error, "reason", error)
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (f"the registry {host}'s certificate is not trusted ({reason.verify_message}): put its CA in "
                f"/etc/docker/certs.d/{host}/ca.crt (Docker trusts it there, and so does make pull), or list "
                f"{host} in /etc/docker/daemon.json's insecure-registries (then restart dockerd)")
    if isinstance(reason, ssl.SSLError) and not insecure and _speaks_plain_http(host):
        return (f"the registry {host} answers plain HTTP, not HTTPS: Docker speaks HTTP only to a registry that "
                f"/etc/docker/daemon.json lists in insecure-registries: add \"insecure-registries\": [\"{host}\"] "
                "there and restart dockerd, or serve the registry with TLS")
    return (f"cannot reach the registry {host} ({reason}): check REGISTRY, the network and any proxy, then "
            "run make pull again")
