"""Builds through mirrors: `make build` hands PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST
and APT_MIRROR to the build as BuildKit secrets. Each test shows a setting reaching the tool that
uses it: pip in both pip steps downloading from a real PyPI server (pypiserver) on 127.0.0.1, pip
using an extra index on a plain-HTTP host only because it is trusted, apt fetching from the mirror
(and failing naming it when it is unreachable); and a credential in them stays out of the image.

The builds here reuse the layer cache of the image under test: only the steps whose inputs the
test changes run (the fake torch versions below make the pip steps run, --no-cache the apt one).
"""
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import uuid
import zipfile

import pytest
from conftest import ROOT, remove_image, stop_process, wait_for_server

MIRROR_VARS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "APT_MIRROR")
PYPI_SERVER = pathlib.Path(sys.executable).parent / "pypi-server"
# A name for the extra index that is not localhost: pip treats 127.0.0.0/8 and localhost as
# secure, so only a plain-HTTP host with another name needs PIP_TRUSTED_HOST.
EXTRA_HOST = "pypi-extra.test"


def make_build(*args, env=None, timeout=1500):
    """`make build` as a user runs it: BASE_IMAGE, PYTHON_VERSION, CA_BUNDLE and ROW from the
    environment `make test` set up; no mirror setting unless the test gives one."""
    clean = {k: v for k, v in os.environ.items()
             if k not in MIRROR_VARS + ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "IMAGE", "TAG")}
    return subprocess.run(["make", "-C", str(ROOT), "build", "PREFLIGHT=0", "DOCKER=/usr/bin/docker", *args],
                          env={**clean, **(env or {})}, capture_output=True, text=True, check=False,
                          timeout=timeout)


def fake_versions(version):
    """docker build flags that replace the torch/torchvision/torchaudio versions make passes."""
    return " ".join(f"--build-arg {a}_VERSION={version}" for a in ("TORCH", "TORCHVISION", "TORCHAUDIO"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_wheel(folder, name, version):
    """A pure-Python wheel of a few bytes: enough for pip to download and install."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, data in files.items():
            z.writestr(f, data)
    return path


@pytest.fixture
def pypi_server(tmp_path):
    """Factory: pypi_server(name, wheels) -> (port, log): a real PyPI server (pypiserver, no
    fallback to pypi.org) on 127.0.0.1 serving `wheels`, logging every request. Stopped afterwards."""
    if not PYPI_SERVER.exists():
        pytest.fail(f"{PYPI_SERVER} is missing: pip install -r tests/requirements.txt (pypiserver)")
    procs = []

    def start(name, wheels=()):
        packages = tmp_path / f"{name}-packages"
        packages.mkdir()
        for w in wheels:
            shutil.copy(w, packages)
        log, port = tmp_path / f"{name}.log", free_port()
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(
                [str(PYPI_SERVER), "run", "-i", "127.0.0.1", "-p", str(port), "--disable-fallback",
                 "-v", "--log-stream", "stderr", str(packages)], stdout=out, stderr=subprocess.STDOUT))
        wait_for_server(procs[-1], f"http://127.0.0.1:{port}/simple/", log, 30, "pypiserver")
        return port, log

    yield start
    for p in procs:
        stop_process(p)


def test_build_pip_steps_download_from_the_configured_index_and_trusted_extra_index(pypi_server, tmp_path):
    """PIP_INDEX_URL should reach pip in both pip steps, and PIP_EXTRA_INDEX_URL on a plain-HTTP
    host should be used because PIP_TRUSTED_HOST names it (pip ignores such a host otherwise)."""
    # A version no real index has, new on every run, so the pip steps run instead of being cached.
    version = f"0.0.0.post{uuid.uuid4().int % 10**9}"
    wheels = [fake_wheel(tmp_path, n, version) for n in ("torch", "torchvision", "torchaudio")]
    index_port, index_log = pypi_server("index", wheels)
    extra_port, extra_log = pypi_server("extra")
    result = make_build(
        "IMAGE=team-dl-mirrortest",
        # The build's containers share the host's network to reach 127.0.0.1; the extra index is
        # reached under a name that is not localhost. BUILD_OPTS come after make's build args:
        # docker takes the last value of a build arg given twice.
        f"BUILD_OPTS=--network=host --add-host={EXTRA_HOST}:127.0.0.1 {fake_versions(version)}",
        env={"PIP_INDEX_URL": f"http://127.0.0.1:{index_port}/simple/",
             "PIP_EXTRA_INDEX_URL": f"http://{EXTRA_HOST}:{extra_port}/simple/",
             "PIP_TRUSTED_HOST": EXTRA_HOST})
    out = result.stdout + result.stderr
    index, extra = index_log.read_text(), extra_log.read_text()
    # Step 1 (torch) installs the fake wheels from the index; step 2 (requirements.txt) then asks
    # the index for JupyterLab & co., which it does not have: the build fails there, as it should.
    for name in ("torch", "torchvision", "torchaudio"):
        assert f"GET /packages/{name}-{version}-py3-none-any.whl" in index, (
            f"pip did not download {name} from PIP_INDEX_URL:\n{index[-3000:]}\n{out[-3000:]}")
    assert '"GET /simple/jupyterlab/' in index, f"the second pip step did not ask the index:\n{index[-3000:]}"
    assert result.returncode != 0 and "jupyterlab" in out.lower(), (
        f"the build should fail on jupyterlab, which the test index lacks:\n{out[-3000:]}")
    assert '"GET /simple/torch/' in extra and '"GET /simple/jupyterlab/' in extra, (
        f"pip did not use the trusted extra index {EXTRA_HOST}:\n{extra[-3000:]}\n{out[-3000:]}")


def test_build_apt_fails_naming_an_unreachable_apt_mirror():
    """APT_MIRROR should reach apt: a mirror that does not resolve fails the build naming it."""
    mirror = "http://apt-mirror.invalid"  # RFC 2606: never resolves
    # --no-cache makes the apt step run; a torch version no index has stops a build that ignored
    # the mirror at the next step, instead of rebuilding the whole image.
    result = make_build("IMAGE=team-dl-mirrortest", f"BUILD_OPTS=--no-cache {fake_versions('0.0.0.post0.dev0')}",
                        env={"APT_MIRROR": mirror}, timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode != 0, f"the build ignored APT_MIRROR={mirror}:\n{out[-3000:]}"
    assert "apt-mirror.invalid" in out and "apt-install.sh" in out, (
        f"the failure should name the mirror apt tried:\n{out[-3000:]}")


def test_apt_mirror_serves_the_install_and_the_sources_stay_the_distributions(run_in_image, tmp_path):
    """apt-install.sh with APT_MIRROR should fetch every index from the mirror and leave
    /etc/apt's sources as the distribution ships them (the image keeps the default sources)."""
    base = os.environ.get("BASE_IMAGE")
    if not base:
        pytest.skip("BASE_IMAGE is not set (make test sets it)")
    # The mirror: the base's own archive host on an explicit port, a different URL for the same
    # server, so the lists apt downloads (named after the URL) show which one it used.
    listing = "cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources"
    _, sources = run_in_image(["bash", "-c", f"{listing} 2>/dev/null"], image=base, entrypoint=[], user="root")
    host = next(w.split("/")[2] for w in sources.split() if w.startswith("http://") and "nvidia" not in w)
    secret = tmp_path / "APT_MIRROR"
    secret.write_text(f"http://{host}:80\n")
    # apt-install.sh removes NVIDIA's own source on purpose (test_base.py): compare the others.
    distro = "cat /etc/apt/sources.list $(grep -L nvidia /etc/apt/sources.list.d/* 2>/dev/null) 2>/dev/null | md5sum"
    script = (f"before=$({distro}) && /build/apt-install.sh hello && after=$({distro})"
              " && ls /var/lib/apt/lists/ && [ \"$before\" = \"$after\" ] && echo sources-unchanged"
              " && ! grep -rq ':80' /etc/apt/ && echo no-mirror-in-etc-apt && hello")
    code, out = run_in_image(["bash", "-c", script], image=base, entrypoint=[], user="root", volumes={
        str(ROOT / "docker" / "build"): {"bind": "/build", "mode": "ro"},
        str(secret): {"bind": "/run/secrets/APT_MIRROR", "mode": "ro"}})
    assert code == 0 and "Hello, world!" in out, f"apt-install.sh through the mirror failed:\n{out[-3000:]}"
    lists = [f for f in out.split() if f.endswith(("Release", "Packages.lz4", "Packages"))]
    assert lists and all(f.startswith(f"{host}:80_") for f in lists), (
        f"apt fetched indexes from elsewhere than the mirror http://{host}:80: {lists}")
    assert "sources-unchanged" in out and "no-mirror-in-etc-apt" in out, f"apt's sources changed:\n{out[-2000:]}"


def test_mirror_credentials_are_in_no_history_entry_label_or_config(docker_client, tmp_path):
    """A user:password in the mirror settings should appear nowhere in the built image's history,
    labels or config (they are secrets, not build args, which `docker history` would show)."""
    password = f"s3cret-{uuid.uuid4().hex[:8]}"
    ref = "team-dl-mirrortest:credentials"
    # Every layer is in the cache of the image under test, so no mirror is contacted: what is
    # checked is what the build records of its settings.
    result = make_build(
        "IMAGE=team-dl-mirrortest", "TAG=credentials",
        env={"PIP_INDEX_URL": f"https://mirror-user:{password}@pypi.invalid/simple",
             "PIP_EXTRA_INDEX_URL": f"https://mirror-user:{password}@extra.invalid/simple",
             "PIP_TRUSTED_HOST": "pypi.invalid", "APT_MIRROR": f"http://mirror-user:{password}@apt.invalid"})
    try:
        assert result.returncode == 0, f"the cached build failed:\n{(result.stdout + result.stderr)[-3000:]}"
        assert password not in result.stdout + result.stderr, "make echoed a mirror credential"
        history = subprocess.run(["/usr/bin/docker", "history", "--no-trunc", ref], capture_output=True,
                                 text=True, check=True).stdout
        inspect = subprocess.run(["/usr/bin/docker", "image", "inspect", ref], capture_output=True,
                                 text=True, check=True).stdout
        assert "RUN" in history and "team.torch.version" in inspect, "nothing to search: wrong image?"
        assert password not in history, f"a mirror credential is in the image history:\n{history}"
        assert password not in inspect, "a mirror credential is in the image config or labels"
    finally:
        remove_image(ref)


# Slow (a second image build, 70 s in CI) and rarely broken: make test-slow, weekly.
@pytest.mark.slow
def test_keep_mirrors_leaves_the_mirrors_configured_in_the_image_only_when_asked(run_in_image):
    """make build KEEP_MIRRORS=1 should leave apt's sources on the mirror (and apt should work
    through it) and pip's index settings in the venv's pip.conf, beside the version constraint;
    a second build with another index must keep that one (secrets are no cache key); the default
    image keeps neither."""
    base = os.environ.get("BASE_IMAGE")
    if not base:
        pytest.skip("BASE_IMAGE is not set (make test sets it)")
    _, sources = run_in_image(["bash", "-c", "cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null"],
                              image=base, entrypoint=[], user="root")
    host = next(w.split("/")[2] for w in sources.split() if w.startswith("http://") and "nvidia" not in w)
    ref = "team-dl-mirrortest:keep"
    # Cached up to the KEEP_MIRRORS step: nothing is downloaded through the mirrors at build time.
    for index in (f"http://pypi-{uuid.uuid4().hex[:8]}.test/simple", f"http://pypi-{uuid.uuid4().hex[:8]}.test/simple"):
        mirrors = {"APT_MIRROR": f"http://{host}:80", "PIP_INDEX_URL": index,
                   "PIP_EXTRA_INDEX_URL": "http://extra.mirror.test/simple", "PIP_TRUSTED_HOST": "extra.mirror.test"}
        result = make_build("IMAGE=team-dl-mirrortest", "TAG=keep", "KEEP_MIRRORS=1", env=mirrors)
        try:
            assert result.returncode == 0, f"the build failed:\n{(result.stdout + result.stderr)[-3000:]}"
            script = ("grep -h '^deb\\|^URIs' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null;"
                      " apt-get update -qq && ls /var/lib/apt/lists/ && /opt/venv/bin/pip config list")
            code, out = run_in_image(["bash", "-c", script], image=ref, entrypoint=[], user="root")
            assert code == 0, f"apt/pip in the image with kept mirrors failed:\n{out[-3000:]}"
            lists = [f for f in out.split() if f.endswith(("Release", "Packages"))]
            assert lists and all(f.startswith(f"{host}:80_") for f in lists), f"apt did not use the kept mirror: {out}"
            for line in (f"global.index-url='{index}'",
                         "global.extra-index-url='http://extra.mirror.test/simple'",
                         "global.trusted-host='extra.mirror.test'",
                         "global.constraint='/opt/venv/etc/constraints.txt'"):
                assert line in out, f"pip config lacks {line}:\n{out[-2000:]}"
        finally:
            remove_image(ref)
    code, out = run_in_image(["bash", "-c", "/opt/venv/bin/pip config list; grep -rh ':80' /etc/apt/ || true"],
                             entrypoint=[], user="root")
    assert "index-url" not in out and ":80" not in out, f"the default image kept a mirror:\n{out}"
