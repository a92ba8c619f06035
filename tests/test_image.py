"""What the image is: metadata, exact versions, one copy of cuDNN/NCCL, pip cannot replace
torch, no secrets in any layer, torch.compile works. Each test uses fresh containers."""
import io
import json
import os
import pathlib
import re
import subprocess
import tarfile
import zipfile

import pytest
from conftest import ROOT

VERSIONS = json.loads((ROOT / "versions.json").read_text())
ROW = next(r for r in VERSIONS["matrix"] if r["name"] == VERSIONS["default"])


def test_image_runs_commands_as_non_root_dev_user_in_workspace(run_in_image):
    """Container should run `docker run IMAGE cmd` as uid 1000 (dev) in a /workspace it owns."""
    code, out = run_in_image(["bash", "-c", "id -u; id -un; pwd; stat -c %U /workspace"])
    assert code == 0, out
    assert out.split()[-4:] == ["1000", "dev", "/workspace", "dev"], f"unexpected identity/workdir:\n{out}"


def test_image_metadata_exposes_ports_and_uses_tini(image):
    """Image should expose 8888 and 22, run tini -g as PID 1 and set WORKDIR /workspace."""
    cfg = image.attrs["Config"]
    assert {"8888/tcp", "22/tcp"} <= set(cfg["ExposedPorts"]), cfg["ExposedPorts"]
    assert cfg["Entrypoint"][:3] == ["/usr/bin/tini", "-g", "--"], cfg["Entrypoint"]
    assert cfg["WorkingDir"] == "/workspace", cfg["WorkingDir"]


def test_image_labels_state_the_versions_from_versions_json(image):
    """Image labels should carry OCI metadata and the versions declared in versions.json."""
    labels = image.labels
    for key in ("source", "revision", "version", "created"):
        value = labels.get(f"org.opencontainers.image.{key}", "")
        assert value and value != "unknown", f"OCI label {key} is {value!r}"
    for key in ("torch", "torchvision", "torchaudio", "cuda", "cudnn", "nccl"):
        assert labels.get(f"team.{key}.version") == ROW[key], f"label team.{key}.version={labels.get(f'team.{key}.version')!r}, versions.json says {ROW[key]!r}"
    assert labels["team.python.version"] == os.environ.get("PYTHON_VERSION", ROW["python"])


def test_installed_versions_match_the_labels(image, run_in_image):
    """Container should hold exactly the torch/vision/audio, CUDA, cuDNN, NCCL the labels name."""
    probe = (
        "import json,torch,torchvision,torchaudio;"
        "c=torch.backends.cudnn.version();"
        "print(json.dumps({'torch':torch.__version__,'torchvision':torchvision.__version__,"
        "'torchaudio':torchaudio.__version__,'cuda':torch.version.cuda,"
        "'cudnn':f'{c//10000}.{c//100%100}','nccl':'.'.join(map(str,torch.cuda.nccl.version()[:2]))}))"
    )
    code, out = run_in_image(["python", "-c", probe])
    assert code == 0, out
    have = json.loads(out.strip().splitlines()[-1])
    labels = image.labels
    for key in ("torch", "torchvision", "torchaudio"):
        assert have[key].split("+")[0] == labels[f"team.{key}.version"], f"{key}: {have[key]} vs label"
    for key in ("cuda", "cudnn", "nccl"):
        assert have[key] == labels[f"team.{key}.version"], f"{key}: {have[key]} vs label {labels[f'team.{key}.version']}"


def test_image_has_exactly_one_libcudnn_and_one_libnccl(run_in_image):
    """Image should carry one libcudnn and one libnccl (the wheels'), not a second system copy."""
    code, out = run_in_image(["bash", "-c", "find / -xdev \\( -name 'libcudnn.so*' -o -name 'libnccl.so*' \\) -type f"],
                             entrypoint=[], user="root")
    assert code == 0, out
    files = [line for line in out.splitlines() if line.startswith("/")]
    for lib in ("libcudnn.so", "libnccl.so"):
        copies = [f for f in files if os.path.basename(f).startswith(lib)]
        assert len(copies) == 1, f"expected one {lib}*, found {copies}"


def _wheel(path, name, version, requires=()):
    """Write a minimal, valid pure-Python wheel: enough for pip to consider installing it."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{name.replace('-', '_')}_fake.py": "",
        f"{dist}/METADATA": meta,
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    whl = path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return whl


@pytest.mark.parametrize("requirement", ["torch==2.5.1", "needs-old-torch"])
def test_pip_cannot_replace_torch(run_in_image, tmp_path, requirement):
    """Container should refuse `pip install` of anything that would replace torch."""
    _wheel(tmp_path, "torch", "2.5.1")
    _wheel(tmp_path, "needs-old-torch", "1.0", requires=["torch==2.5.1"])
    os.chmod(tmp_path, 0o755)
    pip = f"pip install --dry-run --no-index --find-links /wheels {requirement}"
    script = f"{pip}; echo rc=$?; PIP_CONFIG_FILE=/dev/null {pip} >/dev/null 2>&1; echo unconstrained_rc=$?; python -c 'import torch; print(torch.__version__)'"
    code, out = run_in_image(["bash", "-c", script], volumes={str(tmp_path): {"bind": "/wheels", "mode": "ro"}})
    assert code == 0, out
    # The control proves the fake wheel would install if the constraint were lifted.
    assert "unconstrained_rc=0" in out, f"control install failed, the test proves nothing:\n{out}"
    assert re.search(r"rc=[1-9]", out), f"pip accepted {requirement}:\n{out}"
    assert "Cannot install" in out or "conflict" in out.lower(), f"no conflict message:\n{out}"
    assert out.strip().splitlines()[-1].startswith(ROW["torch"]), out


def test_user_can_pip_install_other_packages_into_the_venv(run_in_image, tmp_path):
    """Container should let dev pip-install packages that leave torch alone, into /opt/venv."""
    _wheel(tmp_path, "harmless-pkg", "1.0", requires=["torch>=2.0"])
    os.chmod(tmp_path, 0o755)
    script = ("pip install --no-index --find-links /wheels harmless-pkg"
              " && python -c 'import harmless_pkg_fake, sys; print(sys.prefix)'")
    code, out = run_in_image(["bash", "-c", script],
                             volumes={str(tmp_path): {"bind": "/wheels", "mode": "ro"}})
    assert code == 0, out
    assert out.strip().splitlines()[-1] == "/opt/venv", f"installed outside the venv:\n{out}"


def test_image_contains_no_ssh_host_keys(run_in_image):
    """Image should hold no SSH host keys: they are made at first start, unique per container."""
    code, out = run_in_image(["bash", "-c", "ls /etc/ssh/ | grep -c ssh_host_ || true"], entrypoint=[])
    assert code == 0, out
    assert out.strip() == "0", f"host keys baked into the image:\n{out}"


SETUID_ALLOWED = {"/usr/bin/sudo", "/usr/sbin/unix_chkpwd", "/usr/bin/ssh-agent",
                  "/usr/lib/x86_64-linux-gnu/utempter/utempter", "/usr/lib/aarch64-linux-gnu/utempter/utempter"}


def test_setuid_and_setgid_binaries_are_an_allow_list(run_in_image):
    """Image should keep setuid/setgid bits only on sudo, unix_chkpwd, utempter and ssh-agent."""
    code, out = run_in_image(["bash", "-c", "find / -xdev -perm /6000 -type f 2>/dev/null; true"],
                             entrypoint=[], user="root")
    assert code == 0, out
    found = {line for line in out.splitlines() if line.startswith("/")}
    assert found, "find listed no setuid binary at all: sudo should be one, the probe is broken"
    assert found <= SETUID_ALLOWED, f"setuid/setgid beyond the allow-list: {sorted(found - SETUID_ALLOWED)}"


def test_no_account_has_a_usable_password(run_in_image):
    """Image should have no account with a password (or an empty one) in /etc/shadow."""
    code, out = run_in_image(["cat", "/etc/shadow"], entrypoint=[], user="root")
    assert code == 0, out
    rows = [line.split(":") for line in out.splitlines() if line.count(":") >= 8]
    assert any(r[0] == "dev" for r in rows), f"no dev entry, the probe is broken:\n{out}"
    usable = [r[0] for r in rows if not (r[1].startswith(("!", "*")))]
    assert not usable, f"accounts with a usable or empty password: {usable}"


def _pem_blocks(text):
    return set(re.findall(r"-----BEGIN CERTIFICATE-----\n(.*?)-----END CERTIFICATE-----", text, re.DOTALL))


def test_build_ca_bundle_is_in_no_layer_or_history(docker_client, image, image_ref, run_in_image):
    """Image should keep no trace of the build's CA bundle: not in any layer, not in history."""
    bundle = os.environ.get("CA_BUNDLE")
    if not bundle:
        pytest.skip("CA_BUNDLE was not given to this build (no proxy CA to look for)")
    host = _pem_blocks(pathlib.Path(bundle).read_text())
    code, out = run_in_image(["bash", "-c", "cat /etc/ssl/certs/ca-certificates.crt $(python -c 'import certifi; print(certifi.where())')"])
    assert code == 0, out
    # Certificates only the build's bundle has (e.g. a TLS-inspecting proxy's CA): their text
    # must appear nowhere in the image. Public roots the image ships anyway are excluded.
    extra = host - _pem_blocks(out)
    if not extra:
        pytest.skip(f"{bundle} holds no certificate that the image lacks: nothing distinctive to look for")
    markers = {b.splitlines()[1].encode() for b in extra}
    history = subprocess.run(["docker", "history", "--no-trunc", image_ref], capture_output=True, text=True, check=True).stdout
    assert "BEGIN CERTIFICATE" not in history and not any(m.decode() in history for m in markers)
    found = _scan_layers(docker_client, image, markers)
    assert not found, f"the build's CA certificate is stored in the image: {found}"


def _scan_layers(client, image, markers):
    """Stream `docker save` and search every file of every layer (deleted ones too)."""
    found = []
    stream = io.BufferedReader(_IterStream(image.save(chunk_size=1 << 20)), 1 << 20)
    with tarfile.open(fileobj=stream, mode="r|") as outer:
        for member in outer:
            if not member.isfile():
                continue
            f = outer.extractfile(member)
            if member.name.endswith("layer.tar") or member.name.startswith("blobs/"):
                try:
                    with tarfile.open(fileobj=f, mode="r|") as layer:
                        for entry in layer:
                            if entry.isfile() and _contains(layer.extractfile(entry), markers):
                                found.append(f"{member.name}:{entry.name}")
                except tarfile.ReadError:
                    pass  # not a layer (e.g. a config blob)
            elif _contains(f, markers):
                found.append(member.name)
    return found


def _contains(f, markers, overlap=128):
    tail = b""
    while chunk := f.read(1 << 20):
        buf = tail + chunk
        if any(m in buf for m in markers):
            return True
        tail = buf[-overlap:]
    return False


class _IterStream(io.RawIOBase):
    def __init__(self, it):
        self.it, self.left = iter(it), b""

    def readable(self):
        return True

    def readinto(self, b):
        while not self.left:
            try:
                self.left = next(self.it)
            except StopIteration:
                return 0
        n = min(len(b), len(self.left))
        b[:n], self.left = self.left[:n], self.left[n:]
        return n


def test_torch_compile_trains_a_tiny_model_on_cpu(run_in_image):
    """Container should compile (Inductor, gcc) and train a tiny model on the CPU."""
    script = (
        "import torch\n"
        "m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "cm = torch.compile(m)\n"
        "x, y = torch.randn(64, 16), torch.randn(64, 1)\n"
        "for _ in range(3):\n"
        "    loss = torch.nn.functional.mse_loss(cm(x), y); opt.zero_grad(); loss.backward(); opt.step()\n"
        "assert torch.allclose(cm(x), m(x), atol=1e-5)\n"
        "print('compiled-ok', float(loss))\n"
    )
    code, out = run_in_image(["python", "-c", script], timeout=600)
    assert code == 0 and "compiled-ok" in out, out


def test_build_fails_when_contents_differ_from_the_tag(tmp_path):
    """The build should fail, naming the mismatch, when a version arg disagrees with the contents."""
    base = os.environ.get("BASE_IMAGE") or ROW["base_image"]
    cmd = ["/usr/bin/docker", "build", "-f", str(ROOT / "docker/Dockerfile"), "--target", "runtime",
           "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"PYTHON_VERSION={os.environ.get('PYTHON_VERSION', ROW['python'])}",
           "--build-arg", "CUDNN=8.9", str(ROOT)]
    if os.environ.get("CA_BUNDLE"):
        cmd[2:2] = ["--secret", f"id=ca_bundle,src={os.environ['CA_BUNDLE']}"]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=1800)
    assert r.returncode != 0, "the build accepted CUDNN=8.9 for an image holding cuDNN 9"
    assert "cudnn is 9.1" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
