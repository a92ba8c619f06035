#!/usr/bin/env python3
"""What pulling the image costs a node: compressed bytes per layer (gzip and zstd), cold pull
times from a registry on this host for both in the same run (Docker; Podman and containerd when present), and
what a node downloads to go from one image to the next. Writes
benchmarks/results/pull_<machine>_<date>.md.

Usage: bench_pull.py --image REF [--delta OLD NEW]... [--levels 1,3,7,11] [--zstd-level 3]
                     [--runs 1] [--machine NAME] [--out DIR] [--no-docker] [--no-podman]
                     [--no-containerd]

Each image is pushed to a fresh Debian docker-registry on 127.0.0.1: gzip by `docker push` (what
make push does), zstd by skopeo (what make push ZSTD=1 does). "Cold" means an empty store: each
Docker pull goes to a second dockerd started on an empty --data-root (the images here stay
untouched), each Podman pull to an empty --root. --levels compresses the whole image once per
level (skopeo to a directory) to choose ZSTD_LEVEL. A delta OLD NEW is the compressed size of
NEW's layers whose digests OLD lacks: what a node holding OLD downloads for NEW.
Needs root (the second dockerd), docker-registry, skopeo; podman and containerd's ctr optional. Tens of GB of disk
under --work (default /var/tmp) for the 7 GB image.
"""
import argparse
import contextlib
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import registry

DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")


def log(message):
    print(f"[{datetime.datetime.now(datetime.UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def sh(*args, check=True):
    return subprocess.run(args, capture_output=True, text=True, check=check)


def timed(*args):
    """-> (seconds, CompletedProcess) of a command that must succeed."""
    start = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    return time.monotonic() - start, proc


@contextlib.contextmanager
def local_registry(work):
    """Debian's docker-registry on 127.0.0.1:<a port it picks>, storing under work. -> host:port."""
    work.mkdir(parents=True, exist_ok=True)
    config, log_path = work / "registry.yml", work / "registry.log"
    config.write_text(f"version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: "
                      f"{work / 'registry-data'}\nhttp:\n  addr: 127.0.0.1:0\n")
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([shutil.which("docker-registry") or "/usr/bin/docker-registry", "serve",
                                 str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            found = re.search(r'listening on (127\.0\.0\.1:\d+)', log_path.read_text())
            if found:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the registry did not start:\n{log_path.read_text()[-2000:]}")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def daemon(name, root, args, ready):
    """A second `name` daemon started with args, its log in root, until the command `ready`
    succeeds; stopped at the end."""
    log_path = root / f"{name}.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(150):
            if sh(*ready, check=False).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the cold {name} did not start:\n{log_path.read_text()[-2000:]}")
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def failure(proc):
    """None when the command succeeded, else the last line of what it said."""
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]


@contextlib.contextmanager
def cold_dockerd(work):
    """A second dockerd on an empty data root (no bridge, no iptables: it only pulls). -> its -H."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="cold-dockerd-", dir=work))
    sock = f"unix://{root}/docker.sock"
    # Its own bridge, never `--bridge none`: a dockerd without a bridge deletes docker0 at start
    # (moby daemon_unix.go removeDefaultBridgeInterface), which cuts every running container of
    # the main engine off its published ports. (Found by the lead: docker0 vanished mid-tests.)
    bridge = f"coldbr{os.getpid() % 100000}"
    sh("ip", "link", "add", bridge, "type", "bridge")
    try:
        with daemon("dockerd", root, ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
                                      "--pidfile", str(root / "pid"), "-H", sock, "--bridge", bridge,
                                      "--iptables=false", "--ip-masq=false"], [DOCKER, "-H", sock, "info"]):
            yield sock
    finally:
        sh("ip", "link", "delete", bridge, check=False)
        shutil.rmtree(root, ignore_errors=True)


def cold_docker_pull(work, ref):
    """-> (seconds, None) or (seconds until it failed, the error's last line)."""
    with cold_dockerd(work) as sock:
        seconds, proc = timed(DOCKER, "-H", sock, "pull", ref)
    return seconds, failure(proc)


def cold_podman_pull(work, ref):
    root = pathlib.Path(tempfile.mkdtemp(prefix="cold-podman-", dir=work))
    run = tempfile.mkdtemp(prefix="podrun-")  # podman refuses a runroot path over 50 characters
    try:
        seconds, proc = timed("podman", "--root", str(root / "root"), "--runroot", run,
                              "pull", "-q", "--tls-verify=false", ref)
        return seconds, failure(proc)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


def cold_containerd_pull(work, ref):
    """`ctr images pull` (fetch, then unpack into the overlayfs snapshotter, as a node does) into a
    second containerd on an empty root (its own content store and snapshots; no CRI plugin): what
    a Kubernetes node or Docker >= 23 with the containerd image store pulls with."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="cold-ctrd-", dir=work))
    sock = str(root / "c.sock")
    (root / "config.toml").write_text('version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
    try:
        with daemon("containerd", root, ["containerd", "--config", str(root / "config.toml"), "--root",
                                         str(root / "root"), "--state", str(root / "state"), "--address", sock],
                    ["ctr", "--address", sock, "version"]):
            seconds, proc = timed("ctr", "--address", sock, "--namespace", "bench", "images", "pull",
                                  "--plain-http", ref)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if proc.returncode == 0 and "unpacking" not in proc.stdout:
        return seconds, "ctr fetched but did not say it unpacked: not a whole pull"
    return seconds, failure(proc)


def skopeo_zstd(source, dest, level):
    """skopeo copy recompressing every layer with zstd; the registry here is plain http."""
    # zstd layers exist only in OCI manifests: say so for dir: (docker:// converts by itself).
    args = ["skopeo", "copy", "--quiet", "--format", "oci", "--dest-compress-format", "zstd",
            "--dest-compress-level", str(level), "--src-tls-verify=false"]
    args.append("--dest-compress" if dest.startswith("dir:") else "--dest-tls-verify=false")
    return timed(*args, source, dest)


def publish(regs, image, name, level):
    """Push image as GZIP_REGISTRY/bench:name (docker push) and ZSTD_REGISTRY/bench:name-zstd
    (skopeo recompressing the gzip one). Two registries: with the gzip blobs at its destination,
    skopeo 1.9 reuses them instead of recompressing (its -zstd image would hold gzip layers). -> facts."""
    gz_ref, zs_ref = f"{regs[0]}/bench:{name}", f"{regs[1]}/bench:{name}-zstd"
    sh(DOCKER, "tag", image, gz_ref)
    try:
        log(f"docker push {gz_ref} (gzip)")
        gz_s, proc = timed(DOCKER, "push", gz_ref)
        if proc.returncode != 0:
            raise RuntimeError(f"docker push {gz_ref}: {proc.stderr.strip()}")
    finally:
        sh(DOCKER, "image", "rm", gz_ref, check=False)
    log(f"skopeo copy {gz_ref} -> {zs_ref} (zstd {level})")
    zs_s, proc = skopeo_zstd(f"docker://{gz_ref}", f"docker://{zs_ref}", level)
    if proc.returncode != 0:
        raise RuntimeError(f"skopeo copy: {proc.stderr.strip()}")
    facts = {"image": image, "gzip_ref": gz_ref, "zstd_ref": zs_ref, "gzip_push_s": gz_s, "zstd_push_s": zs_s}
    for kind, ref in (("gzip", gz_ref), ("zstd", zs_ref)):
        client = registry.Client(ref)
        _, manifest = client.image_manifest()
        facts[kind] = registry.layers(manifest)
        facts[kind + "_config"] = json.loads(client.blob(manifest["config"]["digest"]))
    wrong = [media for _, _, media in facts["zstd"] if not media.endswith("+zstd")]
    if wrong:
        raise RuntimeError(f"{zs_ref} holds layers that are not zstd: {wrong}")
    return facts


def layer_rows(facts):
    """[(created_by, gzip bytes, zstd bytes)] per layer, in order; the step from the image history."""
    history = [h for h in facts["gzip_config"].get("history", []) if not h.get("empty_layer")]
    steps = [re.sub(r"\s+", " ", h.get("created_by") or "(base image)") for h in history]
    steps += ["?"] * (len(facts["gzip"]) - len(steps))
    return [(step, gz[1], zs[1]) for step, gz, zs in zip(steps, facts["gzip"], facts["zstd"], strict=True)]


def free_bytes(path):
    return shutil.disk_usage(path).free


def level_sweep(work, source, levels, need, notes, results):
    """Append (level, seconds, bytes) to results (kept when a later level fails): the whole image
    (source: its gzip tag in the registry here) recompressed with zstd at each level into a
    directory; a level is skipped, and noted, when the disk has less than `need` bytes free."""
    for level in levels:
        if free_bytes(work) < need:
            notes.append(f"zstd level {level} not measured: {free_bytes(work) / 1e9:.0f} GB free, "
                         f"{need / 1e9:.0f} GB wanted")
            continue
        out = pathlib.Path(tempfile.mkdtemp(prefix=f"zstd-{level}-", dir=work))
        try:
            log(f"zstd level {level}: skopeo copy to {out}")
            seconds, proc = skopeo_zstd(f"docker://{source}", f"dir:{out}", level)
            if proc.returncode != 0:
                raise RuntimeError(f"skopeo copy (level {level}): {proc.stderr.strip()}")
            manifest = json.loads((out / "manifest.json").read_text())
            results.append((level, seconds, sum(size for _, size, _ in registry.layers(manifest))))
        finally:
            shutil.rmtree(out, ignore_errors=True)


def delta(old, new, kind):
    """Bytes a node holding `old` downloads for `new`: new's layers whose digests old lacks."""
    have = {digest for digest, _, _ in old[kind]}
    return sum(size for digest, size, _ in new[kind] if digest not in have), \
        sum(1 for digest, _, _ in new[kind] if digest not in have)


def versions():
    def first_line(*args):
        try:
            return sh(*args, check=False).stdout.strip().splitlines()[0]
        except (OSError, IndexError):
            return "absent"
    return {"docker": first_line(DOCKER, "version", "--format", "{{.Server.Version}}"),
            "skopeo": first_line("skopeo", "--version"), "podman": first_line("podman", "--version"),
            "containerd": first_line("containerd", "--version"),
            "registry": first_line("docker-registry", "--version")}


def gb(n):
    return f"{n / 1e9:.2f} GB"


def mb(n):
    return f"{n / 1e6:.1f} MB" if n < 1e9 else gb(n)


def report(o, main, pulls, sweep, deltas, env, notes):
    """The results file's text."""
    rows = layer_rows(main)
    gz_total, zs_total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    lines = [
        f"# Pull cost: compressed sizes, cold pulls, update deltas ({o.machine}, {o.date})", "",
        ("Question: what does a node download and how long does a cold pull take, gzip against zstd; "
        "what does an update cost a node? ([docs/distributing.md](../../docs/distributing.md))"), "",
        f"- Image: `{o.image}` (`{o.image_id[:19]}`, {len(rows)} layers)",
        (f"- Machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
        f"{env['docker']} (dockerd), {env['skopeo']}, {env['podman']}, {env['containerd']}, registry: {env['registry']} on 127.0.0.1"),
        f"- Command: `python3 benchmarks/bench_pull.py --image {o.image}"
        + "".join(f" --delta {a} {b}" for a, b in o.delta) + (f" --levels {o.levels}" if o.levels else "")
        + f" --zstd-level {o.zstd_level} --runs {o.runs} --machine {o.machine}"
        + " --no-docker" * o.no_docker + " --no-podman" * o.no_podman + " --no-containerd" * o.no_containerd + "`",
        ("- Cold: each Docker pull into a second dockerd on an empty data root, each Podman pull into an empty "
        "--root, each containerd pull (`ctr images pull`: fetch and unpack) into a second containerd on an "
        "empty root; the registry on the same host, so the network costs nothing and the pull is mostly "
        "download-to-disk plus decompression and unpacking."), "",
        "## Compressed bytes per layer", "",
        (f"gzip: `docker push` (Docker {env['docker']}); zstd: `skopeo copy --dest-compress-format zstd "
        f"--dest-compress-level {o.zstd_level}`."), "",
        "| # | Step (image history) | gzip | zstd | zstd/gzip |", "|---|---|---|---|---|"]
    for i, (step, gz, zs) in enumerate(rows, 1):
        lines.append(f"| {i} | `{step[:90].replace('|', '/')}` | {mb(gz)} | {mb(zs)} | {zs / gz:.2f} |")
    lines += [f"| | **total** | **{gb(gz_total)}** | **{gb(zs_total)}** | **{zs_total / gz_total:.2f}** |", "",
              (f"Push time (this host, registry on 127.0.0.1): gzip `docker push` {main['gzip_push_s']:.0f} s, "
              f"zstd `skopeo copy` recompressing that gzip image, registry to registry, {main['zstd_push_s']:.0f} s."), ""]
    if sweep:
        lines += ["## zstd level (skopeo; the whole image from its gzip tag, written to a directory)", "",
                  "| level | bytes | vs gzip | seconds |", "|---|---|---|---|"]
        lines += [f"| {lv} | {gb(n)} | {n / gz_total:.2f} | {s:.0f} |" for lv, s, n in sweep]
        lines.append("")
    if pulls:
        lines += ["## Cold pull time", "", "| client | gzip | zstd | zstd/gzip |", "|---|---|---|---|"]
    for client, results in pulls.items():
        if not results["gzip"] or not results["zstd"]:
            continue
        cells = []
        for kind in ("gzip", "zstd"):
            runs = results[kind]
            errors = [e for _, e in runs if e]
            cells.append(f"failed after {runs[0][0]:.0f} s: `{errors[0][:100]}`" if errors else
                         " / ".join(f"{s:.0f} s" for s, _ in runs))
        ok = all(not e for kind in ("gzip", "zstd") for _, e in results[kind])
        ratio = (min(s for s, _ in results["zstd"]) / min(s for s, _ in results["gzip"])) if ok else None
        lines.append(f"| {client} | {cells[0]} | {cells[1]} | {f'{ratio:.2f}' if ratio else '-'} |")
    lines.append("")
    if deltas:
        lines += ["## Update deltas", "", ("What a node that holds OLD downloads to run NEW: the compressed size of "
                  "NEW's layers whose digests OLD lacks (both pushed to the one registry)."), "",
                  "| OLD -> NEW | layers | gzip | zstd |", "|---|---|---|---|"]
        for (a, b), (gz, zs) in deltas.items():
            lines.append(f"| `{a}` -> `{b}` | {gz[1]} of {gz[2]} | {mb(gz[0])} | {mb(zs[0])} |")
        lines.append("")
    if notes:
        lines += ["## Not measured in this run", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines) + "\n"


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True, help="the image to measure (a local Docker image)")
    ap.add_argument("--delta", nargs=2, action="append", default=[], metavar=("OLD", "NEW"),
                    help="two local images: what a node holding OLD downloads for NEW (repeatable)")
    ap.add_argument("--levels", default="", help="zstd levels to compare, e.g. 1,3,7,11 (skopeo's encoder "
                                                 "has four speeds: below 3, 3-5, 6-9, 10 and up)")
    ap.add_argument("--zstd-level", type=int, default=3, help="the level of the -zstd tag measured")
    ap.add_argument("--runs", type=int, default=1, help="cold pulls of each kind per client")
    ap.add_argument("--machine", default=f"{os.cpu_count()}core", help="file name part: the machine")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--work", default="/var/tmp", help="where the registry, the level sweep and the cold stores live")
    ap.add_argument("--no-docker", action="store_true", help="skip the cold Docker pulls")
    ap.add_argument("--no-podman", action="store_true", help="skip the cold Podman pulls")
    ap.add_argument("--no-containerd", action="store_true", help="skip the cold containerd (ctr) pulls")
    o = ap.parse_args(argv)
    o.date = datetime.date.today().isoformat()
    return o


def main(argv):
    o = parse(argv)
    # By image id from here on: a rebuild under the same tag while this runs changes nothing.
    ids = {image: json.loads(sh(DOCKER, "image", "inspect", image).stdout)[0]["Id"]
           for image in {o.image, *(i for pair in o.delta for i in pair)}}
    o.image_id = ids[o.image]
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-pull-", dir=o.work))
    main_facts, pulls, sweep, deltas, notes = None, {}, [], {}, []
    try:
        with local_registry(work / "gzip") as gz_reg, local_registry(work / "zstd") as zs_reg:
            reg = (gz_reg, zs_reg)
            main_facts = publish(reg, ids[o.image], "main", o.zstd_level)
            gz_total = sum(size for _, size, _ in main_facts["gzip"])
            published = {o.image: main_facts}
            for i, (old, new) in enumerate(o.delta):
                for image in (old, new):
                    if image not in published:
                        published[image] = publish(reg, ids[image], f"d{i}-{len(published)}", o.zstd_level)
                deltas[(old, new)] = tuple(delta(published[old], published[new], kind) + (len(published[new][kind]),)
                                           for kind in ("gzip", "zstd"))
            levels = [int(x) for x in o.levels.split(",") if x]
            level_sweep(work, main_facts["gzip_ref"], levels, gz_total + 5e9, notes, sweep)
            cold_pulls(o, work, main_facts, gz_total, pulls, notes)
    except Exception as e:  # the measurements so far still go into the file, with the failure
        notes.append(f"the run stopped: {type(e).__name__}: {str(e)[:300]}")
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if main_facts:
            text = report(o, main_facts, pulls, sweep, deltas, versions(), notes)
            path = pathlib.Path(o.out) / f"pull_{o.machine}_{o.date}.md"
            path.write_text(text)
            print(text)
            log(f"wrote {path}")


def cold_pulls(o, work, facts, gz_total, pulls, notes):
    """Each client's cold pulls of both tags, o.runs times; skipped (and noted) when the shared disk
    cannot hold an unpacked copy (about 3x the gzip download, with 5 GB to spare)."""
    clients = ([("docker", cold_docker_pull)] if not o.no_docker else []) + (
        [("podman", cold_podman_pull)] if not o.no_podman and shutil.which("podman") else []) + (
        [("containerd", cold_containerd_pull)] if not o.no_containerd and shutil.which("ctr") else [])
    for client, pull in clients:
        pulls[client] = {"gzip": [], "zstd": []}
        for _ in range(o.runs):
            for kind in ("gzip", "zstd"):
                if free_bytes(work) < 3 * gz_total + 5e9:
                    notes.append(f"a cold {client} pull ({kind}) skipped: {free_bytes(work) / 1e9:.0f} GB free")
                    continue
                log(f"cold {client} pull ({kind})")
                pulls[client][kind].append(pull(work, facts[f"{kind}_ref"]))
                log(f"  {pulls[client][kind][-1]}")


if __name__ == "__main__":
    main(sys.argv[1:])
