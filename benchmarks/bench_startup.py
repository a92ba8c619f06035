#!/usr/bin/env python3
"""Start-up benchmark: time from `docker run` to JupyterLab answering, to the first SSH key login,
and how long `docker stop` takes; median of N runs, printed as a table. Not a test: figures only.

    .venv-test/bin/python benchmarks/bench_startup.py --image team-dl:<tag> --runs 5
"""
import argparse
import io
import logging
import statistics
import subprocess
import threading
import time

import paramiko
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def docker(*args):
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout.strip()


def new_key():
    """A fresh ed25519 key pair: (paramiko key, OpenSSH public key line)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption()).decode()
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                        serialization.PublicFormat.OpenSSH).decode()
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem)), pub + " bench"


def wait_until(probe, t0, timeout, result, name):
    """Call probe() until it returns True; store the seconds since t0 in result[name]."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            up = probe()
        except (OSError, paramiko.SSHException, requests.RequestException):
            up = False  # not up yet: refused, reset, no banner, key not installed yet
        if up:
            result[name] = time.monotonic() - t0
            return
        time.sleep(0.05)


def jupyter_answers(port):
    return requests.get(f"http://127.0.0.1:{port}/api", timeout=2).status_code == 200


def ssh_login(port, key):
    client = paramiko.SSHClient()
    # Every container makes new host keys at start, so there is nothing to pin in a benchmark.
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        client.connect("127.0.0.1", port=port, username="dev", pkey=key, timeout=3,
                       banner_timeout=3, auth_timeout=3, look_for_keys=False, allow_agent=False)
        _, out, _ = client.exec_command("true")
        return out.channel.recv_exit_status() == 0
    finally:
        client.close()


def one_run(image, key, pub, timeout):
    t0 = time.monotonic()
    cid = docker("run", "-d", "--shm-size=1g", "-e", f"PUBLIC_KEY={pub}",
                 "-p", "127.0.0.1::8888", "-p", "127.0.0.1::22", image)
    try:
        jport = int(docker("port", cid, "8888/tcp").splitlines()[0].rsplit(":", 1)[1])
        sport = int(docker("port", cid, "22/tcp").splitlines()[0].rsplit(":", 1)[1])
        result = {}
        threads = [
            threading.Thread(target=wait_until, args=(lambda: jupyter_answers(jport), t0, timeout, result, "jupyter")),
            threading.Thread(target=wait_until, args=(lambda: ssh_login(sport, key), t0, timeout, result, "ssh")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t1 = time.monotonic()
        docker("stop", cid)
        result["stop"] = time.monotonic() - t1
        result["exit_code"] = int(docker("inspect", "-f", "{{.State.ExitCode}}", cid))
        return result
    finally:
        subprocess.run(["docker", "rm", "-f", cid], check=False, capture_output=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", required=True, help="image reference, e.g. team-dl:<tag>")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for each service")
    args = p.parse_args()

    # paramiko logs every refused attempt while sshd is still starting; the retries are expected.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    key, pub = new_key()
    runs = []
    for i in range(args.runs):
        r = one_run(args.image, key, pub, args.timeout)
        runs.append(r)
        shown = "  ".join(f"{k}={v:.2f}s" if k != "exit_code" else f"exit={v}" for k, v in r.items())
        print(f"run {i + 1}/{args.runs}: {shown}", flush=True)

    rows = [("docker run -> Jupyter /api answers", "jupyter"),
            ("docker run -> first SSH key login", "ssh"),
            ("docker stop", "stop")]
    print(f"\n{args.image}, {args.runs} runs (seconds)")
    print(f"{'measure':<38} {'median':>7} {'min':>7} {'max':>7}  ok")
    for label, k in rows:
        vals = [r[k] for r in runs if k in r]
        if vals:
            print(f"{label:<38} {statistics.median(vals):7.2f} {min(vals):7.2f} {max(vals):7.2f}  {len(vals)}/{args.runs}")
        else:
            print(f"{label:<38} {'-':>7} {'-':>7} {'-':>7}  0/{args.runs}")
    codes = sorted({r["exit_code"] for r in runs})
    print(f"exit codes after docker stop: {codes}")


if __name__ == "__main__":
    main()
