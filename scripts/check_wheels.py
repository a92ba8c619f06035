#!/usr/bin/env python3
"""Ask pip's resolver, for every versions.json row and every platform the row publishes, whether
the row's torch/torchvision/torchaudio pins, the image's other Python packages
(docker/build/requirements.txt, pip itself) and all their dependencies install on the row's
Python (the base's python3): the question a build answers only after pulling the base, and one
the stand-in base (another Python) cannot answer. On the stand-in's Python only the pins are
asked (CI's build there installs the rest itself). A release published as an sdist alone (pip
cannot ask for another Python's sdists) is built into a wheel here when it is pure Python, so its
own requirements are checked too.

pip runs as on each platform's CPU (pip_for_machine.py): `--platform` alone picks the wheels'
tags but leaves their environment markers answering for this host, and torch 2.6.0's aarch64
wheel, CPU-only, needs its CUDA libraries only `platform_machine == "x86_64"`. A resolution
without CUDA libraries fails the row ("not a CUDA build there").

It reads metadata only: PEP 658 files where the index has them (PyPI), HTTP range requests into
each wheel where it has not (pip's fast-deps): a few MB per row, not the ~3 GB of wheels a plain
`pip install --dry-run` downloads from such an index. Range reads that work took pip 26.3 here
(24.3 and 25.1 still downloaded whole wheels): tests/requirements.txt pins it for .venv-test,
and a run that downloads anyway says so. It asks the index the build asks:
PIP_INDEX_URL / PIP_EXTRA_INDEX_URL when set (make build hands the same variables to the
build), else PyPI. pip's config files are not read: a machine's own pip.conf (an extra index, a
constraints file) would change the answer for this machine only.

A pass is remembered (CACHE_DIR, for CACHE_DAYS) where its answer cannot change: PyPI read as of
versions.json's pypi_as_of, with the same row, requirements.txt, pip and these scripts; a run
with those inputs says "OK (cached ...)" without asking pip. CHECK_WHEELS_CACHE=0 asks anyway.
Not cached: a failure, a mirror (it has no cutoff), an unset pypi_as_of. A release yanked or
deleted from PyPI later would change the answer: hence the expiry, shorter than the weekly build.

Usage: check_wheels.py [--row NAME]...
Exit status: 0 every row resolves; 1 a row does not (pip's reason printed); 2 an index could
not be reached, so nothing was proved for the rows named (never a silent pass: make lint fails;
CHECK_WHEELS=0 skips the check and says so).
"""
import concurrent.futures
import hashlib
import importlib.metadata
import json
import os
import pathlib
import re
import shlex
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import versions

PYPI = "https://pypi.org/simple"
PIP_FOR_MACHINE = pathlib.Path(__file__).resolve().parent / "pip_for_machine.py"
# What the build installs beside the row's pins (Dockerfile: upgrade_pip, then the rest layer).
REQUIREMENTS = pathlib.Path(__file__).resolve().parent.parent / "docker" / "build" / "requirements.txt"
# pip's answer for a requirement with no candidate at all, where no version was set aside for
# its Requires-Python: only an sdist is published (the dry run may take wheels alone).
NO_CANDIDATE = re.compile(r"satisfies the requirement (\S+) \(from versions: none\)")
# Where passes are remembered, and for how long (see the docstring).
CACHE_DIR = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "team-dl" / "check-wheels"
CACHE_DAYS = 6
# Docker's platform names (versions.json `platforms`) -> the machine name in wheel tags.
WHEEL_ARCH = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
# PEP 600 tags older than manylinux_2_x; manylinux2010/manylinux1 exist for x86 only.
LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
# What pip prints when it could not talk to an index (as opposed to an index that answered
# "no such wheel"): urllib3/requests connection errors, a proxy or TLS failure.
UNREACHABLE = re.compile(r"Could not fetch URL|Max retries exceeded|Failed to establish a new connection|"
                         r"NewConnectionError|NameResolutionError|ProxyError|SSLError|ConnectTimeout")


class Unreachable(Exception):
    """An index did not answer: nothing can be concluded about the wheels."""


def manylinux_tags(arch, glibc):
    """Every manylinux tag a system with this glibc accepts, newest first, as pip computes them
    for its own host: pip's --platform takes the list literally (manylinux_2_28 alone would miss
    NVIDIA's manylinux_2_27 cuDNN wheel)."""
    major, minor = (int(x) for x in glibc.split("."))
    floor = 5 if arch in ("x86_64", "i686") else 17
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, floor - 1, -1)]
    tags += [f"{name}_{arch}" for m, name in LEGACY.items()
             if floor <= m <= minor and (m == 17 or arch in ("x86_64", "i686"))]
    return tags


def indexes(env):
    """The index the build uses, then its extra indexes (pip's own variables, space-separated)."""
    return [env.get("PIP_INDEX_URL") or PYPI, *env.get("PIP_EXTRA_INDEX_URL", "").split()]


def probe(index, env, timeout=20):
    """Raise Unreachable unless the index answers HTTP at all (a 404 for torch is an answer)."""
    url = index.rstrip("/") + "/torch/"
    if not url.startswith(("http://", "https://")):
        return  # file:// and paths: pip reports a missing one itself
    cafile = env.get("PIP_CERT") or env.get("REQUESTS_CA_BUNDLE") or env.get("SSL_CERT_FILE")
    context = ssl.create_default_context(cafile=cafile) if url.startswith("https://") else None
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout, context=context)
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable(f"{index} did not answer ({getattr(e, 'reason', e)})") from None


def pip_env(env):
    """pip's environment: no config files, and of the PIP_* variables only those about the
    connection (the indexes go on the command line, from indexes())."""
    keep = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_TRUSTED_HOST", "PIP_PROXY"}
    out = {k: v for k, v in env.items() if not k.startswith("PIP_") or k in keep}
    out.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return out


def targets(row, standin):
    """(platform, python, glibc, on what) for each check of a row: every platform it publishes on
    its base's Python, and on the stand-in's (CI builds every row there: Debian has no stand-in
    with each row's Python)."""
    out = []
    for platform in row["platforms"]:
        out.append((platform, row["python"], row["glibc"], "base"))
        if (standin["python"], standin["glibc"]) != (row["python"], row["glibc"]):
            out.append((platform, standin["python"], standin["glibc"], "stand-in"))
    return out


def runner():
    """pip_for_machine.py, or CHECK_WHEELS_PIP (a command line: the tests' fake pip), which gets
    the machine and then pip's arguments."""
    return shlex.split(os.environ.get("CHECK_WHEELS_PIP", "")) or [sys.executable, str(PIP_FOR_MACHINE)]


def index_args(index_urls, as_of):
    """pip's index options: PyPI as the build sees it (docker/build/pip-env.sh), as of `as_of`
    (default versions.json's pypi_as_of), so a row whose torch came out later fails here, not
    half way through its build; a mirror without the cutoff, as in the build."""
    cmd = ["--index-url", index_urls[0]]
    for url in index_urls[1:]:
        cmd += ["--extra-index-url", url]
    as_of = versions.pypi_as_of() if as_of is None else as_of
    if index_urls == [PYPI] and as_of:
        cmd += ["--uploaded-prior-to", as_of]
    return cmd


def pip_command(row, platform, python, glibc, index_urls, target, report, as_of=None, find_links=None,
                full=True):
    """pip run as on the platform's CPU (pip_for_machine.py: its environment markers then answer
    for that machine, not this one), asked for what the build installs on that Python and glibc:
    the row's pins, and with `full` pip and requirements.txt; find_links: wheels built here."""
    arch = WHEEL_ARCH[platform]
    cmd = [*runner(), arch, "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
           "--use-feature=fast-deps", "--no-cache-dir", "--retries", "1", "--timeout", "30",
           "--python-version", python, "--implementation", "cp",
           "--target", str(target), "--report", str(report), *index_args(index_urls, as_of)]
    if find_links:
        cmd += ["--find-links", str(find_links)]
    for tag in manylinux_tags(arch, glibc):
        cmd += ["--platform", tag]
    pins = [f"{name}=={row[name]}" for name in ("torch", "torchvision", "torchaudio")]
    return cmd + pins + (["pip", "--requirement", str(REQUIREMENTS)] if full else [])


def build_sdist(spec, into, index_urls, env, as_of):
    """A wheel of `spec` (name==version) built here from its sdist, into `into`: None when it is
    pure Python (its metadata then holds on any Python and CPU), else why it cannot stand in."""
    cmd = [*runner(), "x86_64", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", spec.split("==")[0],
           "--wheel-dir", str(into), *index_args(index_urls, as_of), spec]
    out = subprocess.run(cmd, capture_output=True, text=True, env=pip_env(env), check=False)
    name = re.sub(r"[-_.]+", "_", spec.split("==")[0]).lower()
    made = [w.name for w in into.glob("*.whl") if w.name.lower().startswith(name + "-")]
    if out.returncode != 0 or not made:
        return f"{spec} is published as an sdist only, and building it here failed:\n" + (
            out.stdout + out.stderr)[-1500:]
    if not all(w.endswith("-none-any.whl") for w in made):
        return (f"{spec} is published as an sdist only and is not pure Python ({made[0]}): the build"
                " compiles it, and its requirements on another Python cannot be checked here")
    return None


def resolved(report):
    """{normalised name: version} of what pip would install."""
    return {re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(): item["metadata"]["version"]
            for item in report.get("install", [])}


def check_report(row, platform, have):
    """What the row claims beside the pins (cuDNN, NCCL, CUDA: the tag and the labels say them)
    against the wheels torch's metadata pulls in; a platform whose torch has no CUDA is wrong."""
    errors = [f"{name} resolves to {have.get(name)}, the row pins {row[name]}"
              for name in ("torch", "torchvision", "torchaudio") if have.get(name) != row[name]]
    for what, pattern in (("cudnn", r"nvidia-cudnn(-cu\d+)?"), ("nccl", r"nvidia-nccl(-cu\d+)?"),
                          ("cuda", r"nvidia-cuda-runtime(-cu\d+)?")):
        found = {n: v for n, v in have.items() if re.fullmatch(pattern, n)}
        if not found:
            errors.append(f"no {pattern.split('(')[0]} in the resolution: torch {row['torch']} for "
                          f"{platform} is not a CUDA build there")
        elif not any((v + ".").startswith(row[what] + ".") for v in found.values()):
            errors.append(f"{what} is {', '.join(f'{n} {v}' for n, v in found.items())}, the row says {row[what]}")
    return errors


def downloaded_mb(output):
    """Megabytes of whole wheels pip says it downloaded (none when it read metadata only)."""
    scale = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}
    return sum(float(n) * scale[u] for n, u in re.findall(r"Downloading \S+\.whl \(([\d.]+) (kB|MB|GB)\)", output))


def resolve(row, platform, python, glibc, index_urls, env, as_of=None, full=True):
    """(have, None, pip's output, seconds, built) where pip resolves what the build installs,
    else (None, pip's reasons, output, seconds, built); raises Unreachable. An sdist-only release
    that pip names is built into a wheel (build_sdist; `built` lists them) and pip asked again."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        built, tried = pathlib.Path(tmp, "built"), set()
        built.mkdir()
        while True:
            report = pathlib.Path(tmp, "report.json")
            cmd = pip_command(row, platform, python, glibc, index_urls, pathlib.Path(tmp, "target"), report,
                              as_of=as_of, find_links=built if tried else None, full=full)
            out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                 env={**pip_env(env), "MARKER_PYTHON": python})
            output = out.stdout + out.stderr
            if out.returncode == 0:
                return (resolved(json.loads(report.read_text())), None, output, time.monotonic() - start,
                        sorted(tried))
            if UNREACHABLE.search(output):
                raise Unreachable("pip could not reach " + " / ".join(index_urls) + ":\n"
                                  + "\n".join(ln for ln in output.splitlines() if UNREACHABLE.search(ln))[-2000:])
            sdist = NO_CANDIDATE.search(output)
            if sdist and "==" in sdist.group(1) and sdist.group(1) not in tried:
                tried.add(sdist.group(1))
                problem = build_sdist(sdist.group(1), built, index_urls, env, as_of)
                if problem is None:
                    continue
                return None, [problem], output, time.monotonic() - start, sorted(tried)
            reason = [ln if len(ln) < 400 else ln[:300] + " ... " + ln[-60:]
                      for ln in output.splitlines() if ln.startswith("ERROR")] or output.splitlines()[-5:]
            if "--uploaded-prior-to" in cmd:
                reason.append(f"(PyPI as of {cmd[cmd.index('--uploaded-prior-to') + 1]}, as the build sees it: a"
                              " release uploaded later is not there; move versions.json's pypi_as_of forward)")
            return None, reason, output, time.monotonic() - start, sorted(tried)


def check_row(row, platform, python, glibc, index_urls, env, full=True):
    """(ok, message) for one row on one platform, Python and glibc; raises Unreachable."""
    have, reason, output, took, built = resolve(row, platform, python, glibc, index_urls, env, full=full)
    if have is None:
        return False, "pip cannot install them:\n    " + "\n    ".join(reason)
    errors = check_report(row, platform, have)
    if errors:
        return False, "\n    ".join(["the resolution differs from the row:", *errors])
    heavy = downloaded_mb(output)
    note = f"; NOTE: pip downloaded {heavy:.0f} MB of whole wheels: this index has no PEP 658 " \
           "metadata and this pip did not read them by range (pip 26.3, tests/requirements.txt, does)" \
        if heavy > 50 else ""
    libs = ", ".join(f"{n} {v}" for n, v in sorted(have.items()) if re.match(r"nvidia-(cudnn|nccl|cuda-runtime)", n))
    sdists = f"; built here from sdists: {', '.join(built)}" if built else ""
    return True, f"{len(have)} packages ({libs}) in {took:.1f} s{sdists}{note}"


def cache_key(row, target, index_urls, env):
    """The file a pass of this check is remembered in, or None where the answer could change
    (a mirror, no pypi_as_of) or CHECK_WHEELS_CACHE=0: a hash of everything the answer depends on."""
    as_of = versions.pypi_as_of()
    if index_urls != [PYPI] or not as_of or env.get("CHECK_WHEELS_CACHE") == "0":
        return None
    digest = hashlib.sha256()
    here = pathlib.Path(__file__).resolve().parent
    # pip's version and the scripts' text, not their paths: every clone of the tree (CI's are
    # fresh each run) has its own .venv-test, and the answer is the same from each.
    for part in (json.dumps(row, sort_keys=True), repr(target), as_of, env.get("CHECK_WHEELS_PIP", ""),
                 importlib.metadata.version("pip"), REQUIREMENTS.read_text(),
                 *(p.read_text() for p in (here / "check_wheels.py", PIP_FOR_MACHINE, here / "versions.py"))):
        digest.update(part.encode() + b"\0")
    return CACHE_DIR / f"{digest.hexdigest()[:32]}.json"


def cached(key):
    """A remembered pass's message with how old it is, or None (none, expired or unreadable)."""
    try:
        saved = json.loads(key.read_text())
        age = time.time() - float(saved["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not 0 <= age < CACHE_DAYS * 86400:
        return None
    return (f"{saved['message']} (cached: these inputs passed {age / 3600:.0f} h ago, PyPI as of "
            f"{versions.pypi_as_of()}; CHECK_WHEELS_CACHE=0 asks pip again)")


def remember(key, message):
    """Keep a pass (written whole, then renamed: two lints at once never read half a file)."""
    key.parent.mkdir(parents=True, exist_ok=True)
    part = key.with_suffix(f".{os.getpid()}.part")
    part.write_text(json.dumps({"at": time.time(), "message": message}))
    part.replace(key)


def one(row, target, index_urls, env):
    """(what, ok, message) for one row and target; an Unreachable is returned, not raised."""
    platform, python, glibc, on = target
    what = f"{row['name']} {platform} on its {on} (Python {python}, glibc {glibc})"
    if platform not in WHEEL_ARCH:
        return what, False, f"no wheel architecture known for {platform} (have {sorted(WHEEL_ARCH)})"
    key = cache_key(row, target, index_urls, env)
    if key and (message := cached(key)):
        return what, True, message
    try:
        # requirements.txt on the base's Python alone: the stand-in's is the one CI builds with.
        ok, message = check_row(row, platform, python, glibc, index_urls, env, full=on == "base")
    except Unreachable as e:
        return what, None, str(e)
    pins = f"torch {row['torch']}, torchvision {row['torchvision']}, torchaudio {row['torchaudio']}"
    message = f"{pins}{' and ' + REQUIREMENTS.name if on == 'base' else ''}: {message}"
    if ok and key:
        remember(key, message)
    return what, ok, message


def main(argv):
    names = []
    while argv:
        if argv[0] == "--row" and len(argv) > 1:
            names.append(argv[1])
            argv = argv[2:]
        else:
            sys.exit(__doc__)
    rows = [versions.row(n) for n in names] if names else versions.DATA["matrix"]
    env = dict(os.environ)
    index_urls = indexes(env)
    failed, unreachable = [], []
    jobs = [(row, t) for row in rows for t in targets(row, versions.DATA["standin"])]
    # Every check remembered: nothing to ask the index (an offline lint of unchanged inputs passes).
    if not all((key := cache_key(row, t, index_urls, env)) and cached(key) for row, t in jobs):
        try:
            for url in index_urls:
                probe(url, env)
        except Unreachable as e:
            unreachable.append(str(e))
            jobs = []
    # Each pip run mostly waits on the index: run them side by side, report in order.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: one(*job, index_urls, env), jobs))
    for what, ok, message in results:
        if ok is None:
            unreachable.append(message)
            continue
        print(f"check_wheels: {'OK' if ok else 'FAIL'} {what}: {message}")
        if not ok:
            failed.append(what)
    if unreachable:
        print("check_wheels: UNREACHABLE: " + "\n".join(sorted(set(unreachable))) + "\ncheck_wheels: the "
              "rows' wheels were NOT checked. Fix: reach the index (PIP_INDEX_URL names a mirror, PIP_CERT a "
              "proxy's CA), or skip this check knowingly: make lint CHECK_WHEELS=0", file=sys.stderr)
        return 2
    if failed:
        print(f"check_wheels: {len(failed)} row/platform check(s) cannot be installed: {'; '.join(failed)}. "
              "Fix: pins that have CUDA wheels for the row's Python and platform, a base whose python3 has "
              "them, or fewer platforms (versions.json); for a requirements.txt line, a version for "
              "that Python (an environment marker: pkg==X; python_version >= \"3.11\")", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
