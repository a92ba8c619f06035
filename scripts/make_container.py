#!/usr/bin/env python3
"""make run's container after `docker run -d` (make run) and at `make stop`.

Usage: make_container.py ready --container NAME [--docker D] [--timeout S]
         print its log until the ==> READY line (the JupyterLab URL), then how to reach it and
         that it runs in the background; exit 1 when it stopped before READY
       make_container.py stop --container NAME [--docker D] [--timeout S]
         docker stop with the container's own stop timeout (docker run --stop-timeout, which
         make run sets from STOP_TIMEOUT and the entrypoint tells the jobs), unless --timeout is
         given; say "stopped" only when it left by itself, and "killed" when Docker had to SIGKILL it

Standard library only (the host's python3).
"""
import argparse
import json
import subprocess
import sys
import time

READY = "==> READY"
DOCKER_DEFAULT_STOP = 10  # Docker's own stop timeout when the container was given none
KILLED = 137              # 128 + SIGKILL: tini (PID 1) was killed at the end of the timeout


def docker(o, *args, timeout=30):
    return subprocess.run([o.docker, *args], capture_output=True, text=True, timeout=timeout, check=False)


def state(o):
    """The container's `docker inspect` dict, or None when there is none of that name."""
    r = docker(o, "container", "inspect", o.container)
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout)[0]
    except (ValueError, IndexError, KeyError):
        return None


def ready(o):
    deadline, shown = time.monotonic() + o.timeout, 0
    try:
        while True:
            r = subprocess.run([o.docker, "logs", o.container], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace", timeout=30, check=False)
            lines = r.stdout.splitlines()
            for line in lines[shown:]:
                print(line, file=sys.stderr)
            shown = max(shown, len(lines))
            if any(READY in line for line in lines):
                print(f"make run: {o.container} runs in the background (closing this terminal leaves it "
                      "running): make ssh logs in, make logs shows the log and URL again, make stop stops it",
                      file=sys.stderr)
                return 0
            s = state(o)
            if s is None or not s.get("State", {}).get("Running"):
                code = s and s["State"].get("ExitCode")
                print(f"ERROR: {o.container} stopped before it was ready (exit {code}): its log is above; "
                      "make logs shows it again, make stop removes it", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"make run: {o.container} is not ready after {o.timeout:.0f} s; it goes on starting "
                      "in the background: make logs LOGS_ARGS=-f follows it", file=sys.stderr)
                return 0
            time.sleep(1)
    except KeyboardInterrupt:
        print(f"\nmake run: stopped waiting; {o.container} goes on starting in the background "
              "(make logs, make stop)", file=sys.stderr)
        return 130


def stop_timeout(s):
    """The seconds this container was started to get (docker run --stop-timeout), else Docker's."""
    config = s.get("Config", {})
    if isinstance(config.get("StopTimeout"), int):
        return config["StopTimeout"]
    return DOCKER_DEFAULT_STOP


def stop(o):
    s = state(o)
    if s is None:
        print(f"no container named {o.container}: nothing to stop")
        return 0
    timeout = o.timeout if o.timeout is not None else stop_timeout(s)
    if s.get("State", {}).get("Running"):
        # `docker wait` from before the stop: it reports the exit code even of a --rm container
        # (make run DETACH=0), which is gone by the time `docker stop` returns.
        waiter = subprocess.Popen([o.docker, "wait", o.container], stdout=subprocess.PIPE, text=True)
        print(f"stopping {o.container}: its jobs get {timeout} s to save (make stop STOP_TIMEOUT=N to "
              "give another time)", file=sys.stderr)
        r = docker(o, "stop", "-t", str(timeout), o.container, timeout=timeout + 60)
        try:
            out, _ = waiter.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            waiter.kill()
            out = ""
        if r.returncode != 0:
            print(f"ERROR: docker stop {o.container} failed: {r.stderr.strip()}", file=sys.stderr)
            return 1
        code = int(out.strip()) if out.strip().isdigit() else None
    else:
        code = s.get("State", {}).get("ExitCode")
    docker(o, "rm", "-f", o.container)
    if code == KILLED:
        print(f"killed {o.container}: it did not stop within {timeout} s, so Docker killed it (SIGKILL); "
              f"a job that was still saving lost that save. Next time give it longer: make stop "
              f"STOP_TIMEOUT={max(2 * timeout, 30)} (or make run STOP_TIMEOUT=...)", file=sys.stderr)
        return 1
    print(f"stopped {o.container}" + (f" (exit {code})" if code not in (None, 0) else ""))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("ready", "stop"))
    p.add_argument("--container", required=True)
    p.add_argument("--docker", default="docker")
    p.add_argument("--timeout", type=float, default=None,
                   help="ready: seconds to wait (600); stop: seconds instead of the container's own")
    o = p.parse_args(argv)
    if o.action == "ready":
        o.timeout = 600.0 if o.timeout is None else o.timeout
        return ready(o)
    if o.timeout is not None:
        o.timeout = int(o.timeout)
    return stop(o)


if __name__ == "__main__":
    sys.exit(main())
