#!/usr/bin/env python3
"""Time to first work on a cold node: the same run for gzip, zstd and eStargz (lazy).
Seconds from nothing on the node to the container started, to Jupyter's /api/status answering, to
`import torch` done, to the first AMP training step (CPU), and the bytes the registry sent by then;
then the same on the warm node (image present). Writes benchmarks/results/start_<machine>_<date>.md.

Usage: bench_start.py --image REF [--formats gzip,zstd,esgz] [--machine NAME] [--work DIR]
                      [--period 120] [--no-docker-check] [--keep-registry]

A node is a second containerd (own root, no CRI) with our stargz snapshotter daemon
(scripts/lazy/build-daemon.sh) beside it, started empty for each format; the registry is Debian's
docker-registry on 127.0.0.1 and its log counts the blob bytes it sent. Tags: gzip by `docker
push`; zstd by skopeo from it (level --zstd-level, as make push ZSTD=1); esgz by `ctr-remote image
optimize` from it, which runs the first-work workload (the entrypoint starting sshd and Jupyter:
nothing for `import torch` or the AMP step, see RECORD_ENTRYPOINT) in the converting containerd and
puts the files it read first in each layer (its record
is written beside the results: scripts/lazy/first-work.jsonl is made from it). --docker-check
also pulls the -esgz tag into a second, empty dockerd (Docker 20.10 here) and runs `import torch`:
the tag must run as an ordinary image there. Needs root, tens of GB under --work.
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "lazy"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import node

DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
REPO = "team-dl-bench-start"
FIRST_WORK = ROOT / "scripts" / "lazy" / "first-work.jsonl"
PORT = 18931  # Jupyter's port on the host network of the node: not 8888, which the tests use
TOKEN = secrets.token_hex(24)
# One AMP step on the CPU: the trainer's own code path, small enough for 2 cores.
AMP_STEP = ["train_amp.py", "--device", "cpu", "--amp", "bf16", "--model", "resnet18", "--data", "synthetic",
            "--synthetic-size", "16", "--image-size", "64", "--batch-size", "8", "--steps", "1",
            "--num-workers", "0", "--compile", "off", "--progress", "none", "--checkpoint-dir", "/tmp/bench-ckpt"]
# The workload optimize records: the entrypoint as on a real start (sshd with a key, Jupyter), and
# nothing else. Jupyter first: everything before a layer's prefetch landmark is what the snapshotter
# prefetches at mount, and the container's start waits for it (up to prefetch_timeout_sec, 10 s by
# default). Recorded with `import torch` and an AMP step too, the list held torch's and CUDA's
# libraries (0.95 GB), and with the stock config Jupyter answered after 69.5 s
# (results/start_2core_2026-12-07.md). torch's files now sit after the landmark: the background
# fetch or the first read brings them.
RECORD_ENTRYPOINT = ["/usr/bin/tini", "-g", "-s", "--", "/usr/local/bin/entrypoint.sh"]


def log(message):
    print(f"[{datetime.datetime.now(datetime.UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def run(*args, timeout=3600):
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed: {proc.stderr.strip()[-1500:]}")
    return proc


def has_tag(reg, tag):
    try:
        node.image_layers(reg, REPO, tag)
        return True
    except urllib.error.HTTPError:
        return False


def public_key():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    return Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + " bench"


def publish(reg, o, work):
    """The three tags in the registry (kept across runs with --keep-registry). -> seconds per step."""
    ref, took = f"{reg.address}/{REPO}", {}
    if not has_tag(reg, "gzip"):
        log("docker push (gzip)")
        start = time.monotonic()
        run(DOCKER, "tag", o.image, f"{ref}:gzip")
        try:
            run(DOCKER, "push", "-q", f"{ref}:gzip")
        finally:
            run(DOCKER, "rmi", f"{ref}:gzip")
        took["gzip"] = time.monotonic() - start
    if "esgz" in o.formats and not has_tag(reg, "esgz"):
        log(f"ctr-remote image optimize (records the first-work workload for {o.period} s, converts)")
        start = time.monotonic()
        with node.containerd_node(work / "convert") as n:
            n.ctr("images", "pull", "--plain-http", f"{ref}:gzip")
            n.ctr("images", "optimize", "--oci", "--estargz-compression-level", str(o.esgz_level),
                  "--period", str(o.period), "--record-out", str(o.record), "--entrypoint", json.dumps(RECORD_ENTRYPOINT),
                  "--env", f"PUBLIC_KEY={public_key()}", "--env", f"JUPYTER_TOKEN={TOKEN}",
                  f"{ref}:gzip", f"{ref}:esgz", timeout=7200)
            n.ctr("images", "push", "--plain-http", f"{ref}:esgz")
        took["esgz"] = time.monotonic() - start
        write_first_work(o.record)
    if "zstd" in o.formats and not has_tag(reg, "zstd"):
        log(f"skopeo copy to zstd level {o.zstd_level}")
        start = time.monotonic()
        # Through a local OCI layout: copied registry to registry, skopeo 1.9 reuses the gzip blobs
        # it knows are there instead of recompressing (the first try here published gzip layers
        # under :zstd). From the Docker image, as make push ZSTD=1 does.
        layout = work / "zstd-oci"
        shutil.rmtree(layout, ignore_errors=True)
        try:
            run("skopeo", "copy", "--quiet", "--dest-compress-format", "zstd", "--dest-compress-level",
                str(o.zstd_level), f"docker-daemon:{o.image_id}", f"oci:{layout}:zstd")
            run("skopeo", "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false",
                f"oci:{layout}:zstd", f"docker://{ref}:zstd")
        finally:
            shutil.rmtree(layout, ignore_errors=True)
        types = {layer["mediaType"] for layer in node.image_layers(reg, REPO, "zstd")}
        if types != {"application/vnd.oci.image.layer.v1.tar+zstd"}:
            raise RuntimeError(f":zstd holds {types}, not only zstd layers")
        took["zstd"] = time.monotonic() - start
    return took


def write_first_work(record):
    """optimize's record -> scripts/lazy/first-work.jsonl: each path once, in the order first read
    (make push ESGZ=1 converts with it, so a push needs no workload run)."""
    seen = {}
    for line in pathlib.Path(record).read_text().splitlines():
        if line.strip():
            seen.setdefault(json.loads(line)["path"], None)
    FIRST_WORK.write_text("".join(json.dumps({"path": p}) + "\n" for p in seen))
    log(f"{len(seen)} paths read by the first-work workload -> {FIRST_WORK}")


def jupyter_answers():
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/api/status?token={TOKEN}", timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def first_work(n, reg, ref, snapshotter, name, t0, mark, timeout):
    """Start the container on node n and walk to the first AMP step. -> {milestone: (seconds, bytes)}."""
    out = {}

    def at(milestone):
        out[milestone] = (time.monotonic() - t0, reg.blob_bytes(mark))
        log(f"  {milestone}: {out[milestone][0]:.1f} s, {out[milestone][1] / 1e6:.1f} MB")

    n.ctr("run", "-d", "--net-host", "--snapshotter", snapshotter, "--env", "SSHD_ENABLED=0",
          "--env", f"JUPYTER_PORT={PORT}", "--env", f"JUPYTER_TOKEN={TOKEN}", ref, name)
    at("started")
    deadline = time.monotonic() + timeout
    while not jupyter_answers():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Jupyter did not answer within {timeout} s")
        time.sleep(0.2)
    at("jupyter")
    n.ctr("tasks", "exec", "--user", "dev", "--exec-id", "torch", name, "python", "-c", "import torch", timeout=timeout)
    at("torch")
    n.ctr("tasks", "exec", "--user", "dev", "--exec-id", "amp", name, *AMP_STEP, timeout=timeout)
    at("amp")
    n.ctr("tasks", "kill", "-s", "KILL", name, check=False)
    for _ in range(50):
        if n.ctr("tasks", "delete", name, check=False).returncode == 0:
            break
        time.sleep(0.2)
    n.ctr("containers", "delete", name, check=False)
    return out


# --on-demand: the snapshotter fetches only what is read (no prefetch of the first-work files at
# mount, no background fetch of the rest): what a read costs without anything competing with it.
ON_DEMAND = "noprefetch = true\nno_background_fetch = true\n"


def measure(reg, fmt, work, timeout, stargz_config=None):
    """A cold node for fmt: pull, first work; then warm: first work again on the same node."""
    ref = f"{reg.address}/{REPO}:{fmt}"
    lazy = fmt == "esgz"
    snapshotter = "stargz" if lazy else "overlayfs"
    with node.containerd_node(work / f"node-{fmt}", stargz_config=stargz_config) as n:
        load = pathlib.Path("/proc/loadavg").read_text().split()[:3]
        log(f"{fmt}: cold node (load {' '.join(load)})")
        mark, t0 = reg.mark(), time.monotonic()
        if lazy:
            n.ctr("images", "rpull", "--plain-http", ref)
        else:
            n.ctr("images", "pull", "--plain-http", ref)
        cold = {"pulled": (time.monotonic() - t0, reg.blob_bytes(mark))}
        log(f"  pulled: {cold['pulled'][0]:.1f} s")
        cold |= first_work(n, reg, ref, snapshotter, f"cold-{fmt}", t0, mark, timeout)
        log(f"{fmt}: warm node")
        mark, t0 = reg.mark(), time.monotonic()
        warm = first_work(n, reg, ref, snapshotter, f"warm-{fmt}", t0, mark, timeout)
        return {"cold": cold, "warm": warm, "layers": node.image_layers(reg, REPO, fmt), "load": load}


def docker_check(reg, work):
    """Docker 20.10 (this host's dockerd, as a second empty one) pulls and runs the -esgz tag."""
    import bench_pull
    ref = f"{reg.address}/{REPO}:esgz"
    with bench_pull.cold_dockerd(work) as sock:
        start = time.monotonic()
        run(DOCKER, "-H", sock, "pull", "-q", ref)
        pulled = time.monotonic() - start
        version = run(DOCKER, "-H", sock, "version", "--format", "{{.Server.Version}}").stdout.strip()
        torch = run(DOCKER, "-H", sock, "run", "--rm", "--network", "none", ref, "python", "-c",
                    "import torch; print(torch.__version__)").stdout.strip().splitlines()[-1]
    return {"docker": version, "pull_s": pulled, "torch": torch}


MILESTONES = [("pulled", "pull done"), ("started", "container started"), ("jupyter", "Jupyter /api/status"),
              ("torch", "`import torch` done"), ("amp", "first AMP step done")]


def cell(result, key):
    seconds, sent = result[key]
    return f"{seconds:.1f} s · {sent / 1e9:.2f} GB"


def report(o, results, took, dock, env):
    sizes = {f: sum(layer["size"] for layer in r["layers"]) for f, r in results.items()}
    lines = [f"# Time to first work on a cold node: gzip, zstd, eStargz (lazy) ({o.machine}, {o.date})", "",
             ("Question: how soon after a node that has never seen the image is asked to run it does it "
              "answer in Jupyter, finish `import torch` and one AMP step, and how many bytes has it "
              "fetched by then? ([docs/distributing.md](../../docs/distributing.md#lazy-pulls-estargz))"), "",
             f"- Image: `{o.image}` (`{o.image_id[:19]}`)",
             (f"- Machine: {os.cpu_count()} CPU cores ({platform.machine()}), shared with other work; "
              f"{env['containerd']}; stargz snapshotter: our daemon over Debian's library 0.12 "
              f"(scripts/lazy/build-daemon.sh), default config (background fetch on); registry: "
              f"{env['registry']} on 127.0.0.1, so the network costs nothing here"),
             "- Load average (1, 5, 15 min) as each cold node started: "
             + "; ".join(f"{f} {' '.join(r['load'])}" for f, r in results.items()),
             f"- Command: `python3 benchmarks/bench_start.py --image {o.image} --formats {','.join(o.formats)}"
             f" --period {o.period} --machine {o.machine}`" + (" (no Docker check)" if not dock else ""),
             ("- Cold: a second containerd and stargz daemon started on empty roots for each format; the "
              "clock starts before the pull (gzip, zstd: `ctr images pull`, fetch and unpack; esgz: "
              "`ctr-remote images rpull`, which mounts the layers lazily), then `ctr run -d` with the "
              "entrypoint starting Jupyter (SSH off), polling /api/status, then `ctr tasks exec` of "
              "`python -c 'import torch'`, then one AMP step (`" + " ".join(AMP_STEP) + "`), in that order. "
              "Warm: the same container start on the same node afterwards. Bytes: what the registry's log "
              "says it sent in blob responses (layers, configs; full and ranged) since the clock started."), "",
             "## Cold node (seconds since nothing · bytes fetched by then)", "",
             "| milestone | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for key, label in MILESTONES:
        lines.append(f"| {label} | " + " | ".join(cell(r["cold"], key) for r in results.values()) + " |")
    lines += ["", "## Warm node (image already there; seconds since `ctr run`)", "",
              "| milestone | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for key, label in MILESTONES[1:]:
        lines.append(f"| {label} | " + " | ".join(cell(r["warm"], key) for r in results.values()) + " |")
    lines += ["", "## Image sizes in the registry", "", "| format | layers | compressed bytes | made by (seconds here) |",
              "|---|---|---|---|"]
    how = {"gzip": "docker push", "zstd": f"skopeo copy, zstd level {o.zstd_level}",
           "esgz": f"ctr-remote image optimize, level {o.esgz_level}, {o.period} s workload"}
    for f, r in results.items():
        lines.append(f"| {f} | {len(r['layers'])} | {sizes[f] / 1e9:.2f} GB | {how[f]}"
                     + (f" ({took[f]:.0f} s)" if f in took else " (from an earlier run)") + " |")
    if dock:
        lines += ["", (f"Docker {dock['docker']} without the snapshotter (a second, empty dockerd): pulled the "
                       f"-esgz tag whole in {dock['pull_s']:.0f} s and ran `import torch` from it (torch "
                       f"{dock['torch']}): an ordinary image there.")]
    goals = []
    if "esgz" in results:
        jup = results["esgz"]["cold"]["jupyter"][0]
        goals.append(f"- Jupyter answering on a cold node with -esgz within 15 s: {jup:.1f} s, "
                     + ("met" if jup <= 15 else "**not met**"))
        if "gzip" in results:
            amp_e, amp_g = results["esgz"]["cold"]["amp"][0], results["gzip"]["cold"]["amp"][0]
            goals.append(f"- First AMP step with -esgz no later than after a full gzip pull: {amp_e:.1f} s "
                         f"against {amp_g:.1f} s, " + ("met" if amp_e <= amp_g else "**not met**"))
    lines += ["", "## Goals", "", *goals, ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", required=True, help="local Docker image to publish in the three formats")
    ap.add_argument("--formats", default="gzip,zstd,esgz")
    ap.add_argument("--machine", default=f"{os.cpu_count()}core")
    ap.add_argument("--work", default="/var/tmp/team-dl-bench-start")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--period", type=int, default=40, help="seconds optimize records the workload")
    ap.add_argument("--zstd-level", type=int, default=7)
    ap.add_argument("--esgz-level", type=int, default=6)
    ap.add_argument("--timeout", type=int, default=900, help="seconds each milestone may take")
    ap.add_argument("--no-docker-check", action="store_true")
    ap.add_argument("--on-demand", action="store_true", help="the snapshotter without prefetch and background fetch")
    ap.add_argument("--keep-registry", action="store_true", help="keep the registry's storage for a rerun")
    o = ap.parse_args()
    o.formats = [f for f in o.formats.split(",") if f]
    if set(o.formats) - {"gzip", "zstd", "esgz"} or not o.formats:
        ap.error(f"--formats takes gzip, zstd, esgz; got {','.join(o.formats)}")
    if os.geteuid() != 0:
        ap.error("needs root: the node's containerd, FUSE and overlay mounts")
    o.date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    o.image_id = run(DOCKER, "image", "inspect", "--format", "{{.Id}}", o.image).stdout.strip()
    work = pathlib.Path(o.work)
    work.mkdir(parents=True, exist_ok=True)
    o.record = work / "optimize-record.jsonl"
    env = {"containerd": run("containerd", "--version").stdout.strip().split(" ")[2],
           "registry": run("docker-registry", "--version").stdout.strip()}
    env["containerd"] = "containerd " + env["containerd"]
    results, dock = {}, None
    try:
        with node.registry(work / "registry") as reg:
            took = publish(reg, o, work)
            path = pathlib.Path(o.out) / f"start_{o.machine}_{o.date}.md"
            for fmt in o.formats:
                results[fmt] = measure(reg, fmt, work, o.timeout, ON_DEMAND if o.on_demand else None)
                path.write_text(report(o, results, took, dock, env))  # partial results survive a later failure
            if "esgz" in o.formats and not o.no_docker_check:
                dock = docker_check(reg, work)
    finally:
        if not o.keep_registry:
            shutil.rmtree(work / "registry", ignore_errors=True)
    text = report(o, results, took, dock, env)
    path.write_text(text)
    print(text)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
