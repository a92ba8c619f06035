"""What the image is: metadata, exact versions, one copy of cuDNN/NCCL, pip cannot replace
torch, no secrets in any layer, torch.compile works. Each test uses fresh containers."""
import io
import json
import os
import pathlib
import re
import subprocess
import tarfile
import uuid
import zipfile

import pytest
from conftest import ROOT, hook_mount, remove_image, version_row

# The row the image under test was built from ($ROW, e.g. the Blackwell row in .ci/run).
THIS = version_row()


def test_image_runs_commands_as_non_root_dev_user_in_workspace(run_in_image):
    """Container should run `docker run IMAGE cmd` as uid 1000 (dev) in a /workspace it owns."""
    code, out = run_in_image(["bash", "-c", "id -u; id -un; pwd; stat -c %U /workspace"])
    assert code == 0, out
    assert out.split()[-4:] == ["1000", "dev", "/workspace", "dev"], f"unexpected identity/workdir:\n{out}"


def test_image_metadata_exposes_ports_and_uses_tini(image):
    """Image should expose 8888 and 22, run tini -g as PID 1 and set WORKDIR /workspace."""
    cfg = image.attrs["Config"]
    assert {"8888/tcp", "22/tcp"} <= set(cfg["ExposedPorts"]), cfg["ExposedPorts"]
    assert cfg["Entrypoint"][:4] == ["/usr/bin/tini", "-g", "-s", "--"], cfg["Entrypoint"]
    assert cfg["WorkingDir"] == "/workspace", cfg["WorkingDir"]


def test_image_labels_state_the_versions_from_versions_json(image):
    """Image labels should carry OCI metadata and the versions declared in versions.json."""
    labels = image.labels
    for key in ("source", "revision", "version", "created"):
        value = labels.get(f"org.opencontainers.image.{key}", "")
        assert value and value != "unknown", f"OCI label {key} is {value!r}"
    for key in ("torch", "torchvision", "torchaudio", "cuda", "cudnn", "nccl"):
        assert labels.get(f"team.{key}.version") == THIS[key], f"label team.{key}.version={labels.get(f'team.{key}.version')!r}, versions.json says {THIS[key]!r}"
    assert labels["team.python.version"] == os.environ.get("PYTHON_VERSION", THIS["python"])
    # The tag people pull names the row's torch and CUDA (a Blackwell user reads it off the tag).
    assert labels["org.opencontainers.image.version"].startswith(f"{THIS['torch']}-cuda{THIS['cuda']}-"), labels


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
    assert out.strip().splitlines()[-1].startswith(THIS["torch"]), out


@pytest.mark.parametrize("requirement", ["torch==2.5.1", "needs-old-torch"])
def test_uv_pip_cannot_replace_torch(run_in_image, tmp_path, requirement):
    """Container should refuse `uv pip install` of anything that would replace torch, as pip does
    (uv reads UV_CONSTRAINT, not pip.conf)."""
    _wheel(tmp_path, "torch", "2.5.1")
    _wheel(tmp_path, "needs-old-torch", "1.0", requires=["torch==2.5.1"])
    os.chmod(tmp_path, 0o755)
    uv = f"uv pip install --dry-run --offline --no-index --find-links /wheels {requirement}"
    script = (f"{uv}; echo rc=$?; env -u UV_CONSTRAINT {uv} >/dev/null 2>&1; echo unconstrained_rc=$?;"
              " python -c 'import torch; print(torch.__version__)'")
    code, out = run_in_image(["bash", "-c", script], volumes={str(tmp_path): {"bind": "/wheels", "mode": "ro"}})
    assert code == 0, out
    # The control proves the fake wheel would install if the constraint were lifted.
    assert "unconstrained_rc=0" in out, f"control install failed, the test proves nothing:\n{out}"
    assert re.search(r"rc=[1-9]", out), f"uv accepted {requirement}:\n{out}"
    assert "unsatisfiable" in out, f"no conflict message:\n{out}"
    assert out.strip().splitlines()[-1].startswith(THIS["torch"]), out


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


def test_pip_upgrade_of_a_pinned_package_says_the_pin_held_it(run_in_image, tmp_path):
    """`pip install --upgrade torchvision` (also `python -m pip ... -U`) should say that the
    image's pin kept it, not only "Requirement already satisfied"; other upgrades say nothing."""
    _wheel(tmp_path, "torchvision", "99.0")
    _wheel(tmp_path, "harmless-pkg", "1.0")
    os.chmod(tmp_path, 0o755)
    pip = "--no-index --find-links /wheels"
    script = (f"pip install --upgrade {pip} torchvision 2>&1; echo UPGRADE rc=$?;"
              f" python -m pip install -qU {pip} 'torchvision>=0.1' 2>&1; echo MODULE rc=$?;"
              f" pip install --upgrade {pip} harmless-pkg 2>&1; echo OTHER rc=$?")
    code, out = run_in_image(["bash", "-c", script], volumes={str(tmp_path): {"bind": "/wheels", "mode": "ro"}})
    assert code == 0, out
    upgrade, module, other = re.split(r"^(?:UPGRADE|MODULE|OTHER) rc=.*$", out, flags=re.MULTILINE)[:3]
    note = rf"torchvision {re.escape(THIS['torchvision'])}: held at the image's pinned version"
    for what, text in (("pip install --upgrade", upgrade), ("python -m pip install -qU", module)):
        assert re.search(note, text) and "PIP_CONFIG_FILE=/dev/null" in text, (
            f"{what} torchvision should say the pin held it, with the override:\n{text}")
    assert "pinned" not in other, f"an upgrade of an unpinned package got the note:\n{other}"
    assert "UPGRADE rc=0" in out and "OTHER rc=0" in out, f"pip should succeed:\n{out}"


@pytest.mark.parametrize("tool", ["pip", "uv"])
def test_upgrade_cannot_swap_torch_for_another_build_of_its_version(run_in_image, tmp_path, tool):
    """`pip install -U torch` and `uv pip install -U torch` from an index that holds torch's CPU
    build of the pinned version (2.6.0+cpu, as download.pytorch.org/whl/cpu does) should keep the
    installed build: the pins name the exact build, local label and all."""
    _wheel(tmp_path, "torch", f"{THIS['torch']}+cpu")
    os.chmod(tmp_path, 0o755)
    install = {"pip": "pip install --dry-run -U --no-index --find-links /wheels torch",
               "uv": "uv pip install --dry-run -U --offline --no-index --find-links /wheels torch"}[tool]
    unpinned = {"pip": "PIP_CONFIG_FILE=/dev/null", "uv": "env -u UV_CONSTRAINT"}[tool]
    script = (f"{install} 2>&1; echo PINNED rc=$?; {unpinned} {install} 2>&1; echo UNPINNED rc=$?;"
              " grep '^torch=' /opt/venv/etc/constraints.txt")
    code, out = run_in_image(["bash", "-c", script], volumes={str(tmp_path): {"bind": "/wheels", "mode": "ro"}})
    assert code == 0, out
    pinned, unpinned_out = re.split(r"^(?:PINNED|UNPINNED) rc=.*$", out, flags=re.MULTILINE)[:2]
    swap = re.compile(rf"(Would install torch-|\+ torch==){re.escape(THIS['torch'])}\+cpu")
    # The control: without the pins the fake CPU build is taken, so the index does offer it.
    assert swap.search(unpinned_out), f"control: unpinned, {tool} should take the +cpu build:\n{out}"
    assert not swap.search(pinned), f"{tool} -U would replace the installed torch with a +cpu build:\n{out}"


def test_pip_guard_says_so_when_a_pinned_package_was_replaced(run_in_image, tmp_path):
    """When the pins are bypassed (dev's own pip.conf sets `constraint = /dev/null`, which
    overrides /etc/pip.conf's) and `pip install -U torchvision` replaces it, the guard should say
    it was replaced, never that the pin held it."""
    _wheel(tmp_path, "torchvision", "99.0")
    os.chmod(tmp_path, 0o755)
    script = ("mkdir -p ~/.config/pip && printf '[global]\\nconstraint = /dev/null\\n' > ~/.config/pip/pip.conf"
              " && pip install -U --no-index --find-links /wheels torchvision 2>&1; echo rc=$?;"
              " pip show torchvision 2>/dev/null | grep ^Version:")
    code, out = run_in_image(["bash", "-c", script], volumes={str(tmp_path): {"bind": "/wheels", "mode": "ro"}})
    assert code == 0 and "Version: 99.0" in out, f"control: the bypass should have installed 99.0:\n{out}"
    assert "left it as it was" not in out, f"the guard said the pin held a package pip replaced:\n{out}"
    assert re.search(rf"WARNING: torchvision {re.escape(THIS['torchvision'])} -> 99\.0: the image's pin", out), (
        f"the guard should say torchvision was replaced:\n{out}")


# As dev: the owner and mode of each pip-guard file, then whether an append to it succeeds.
GUARD_PROBE = ("for f in /opt/venv/etc/constraints.txt /etc/pip.conf; do"
               " echo \"GUARD $f $(stat -c '%U:%G %a' $f) $( (echo '# x' >> $f) 2>/dev/null"
               " && echo writable || echo read-only)\"; done")


def _pip_guard(run_in_image, tmp_path, hook=None):
    """{path: 'owner:group mode writable|read-only'} for the pip guard's files, as dev sees them;
    `hook` is a root shell line run at start (a start-up hook), to break the image on purpose."""
    code, out = run_in_image(["bash", "-c", GUARD_PROBE], **(hook_mount(tmp_path, hook) if hook else {}))
    assert code == 0, f"the probe failed:\n{out}"
    return dict(re.findall(r"^GUARD (\S+) (.*)$", out, re.MULTILINE))


def test_user_cannot_edit_the_pip_guard(run_in_image, tmp_path):
    """Container should keep pip.conf and the torch constraints root's and read-only for dev."""
    seen = _pip_guard(run_in_image, tmp_path)
    assert seen == {"/opt/venv/etc/constraints.txt": "root:users 644 read-only",
                    "/etc/pip.conf": "root:root 644 read-only"}, (
        f"dev could change the guard that keeps pip from replacing torch: {seen}")


def test_pip_guard_check_notices_a_group_writable_constraints_file(run_in_image, tmp_path):
    """The pip-guard check should report a constraints file that dev's group can write."""
    seen = _pip_guard(run_in_image, tmp_path, hook="chmod g+w /opt/venv/etc/constraints.txt")
    assert seen["/opt/venv/etc/constraints.txt"] == "root:users 664 writable", (
        f"the probe did not see dev write a group-writable constraints file: {seen}")


# As dev, from /tmp: where trainamp imports from, how many of its files are not root's or are
# group/other-writable, whether dev can add a module to it, how many of its modules have no
# byte-compiled copy, and whether train_amp.py (on PATH) runs with it.
TRAINAMP_PROBE = r"""
cd /tmp
pkg=$(python3 -c 'import os, trainamp; print(os.path.dirname(trainamp.__file__))') || exit 3
echo "PKG $pkg"
echo "NOT_ROOTS $(find "$pkg" \( ! -user root -o -perm /022 \) | wc -l)"
if touch "$pkg/extra.py" 2>/dev/null; then echo "ADD writable"; else echo "ADD read-only"; fi
for f in $(find "$pkg" -name '*.py'); do
    ls "$(dirname "$f")/__pycache__/$(basename "$f" .py)".*.pyc >/dev/null 2>&1 || echo "UNCOMPILED $f"
done
train_amp.py --help >/dev/null && echo "HELP ok"
"""


def test_train_amp_package_is_roots_compiled_and_importable_anywhere(run_in_image, tmp_path):
    """Container should hold train_amp.py's package trainamp in the venv: importable from any
    folder, byte-compiled (a read-only root cannot cache it), root's and read-only for dev."""
    code, out = run_in_image(["bash", "-c", TRAINAMP_PROBE])
    assert code == 0, f"the probe failed (no trainamp to import?):\n{out}"
    seen = dict(re.findall(r"^(PKG|NOT_ROOTS|ADD|HELP) (.*)$", out, re.MULTILINE))
    assert seen.get("PKG", "").startswith("/opt/venv/lib/python3") and seen["PKG"].endswith(
        "/site-packages/trainamp"), f"trainamp should import from the venv: {seen}\n{out}"
    assert seen.get("NOT_ROOTS") == "0" and seen.get("ADD") == "read-only", (
        f"trainamp should be root's and read-only for dev: {seen}\n{out}")
    assert not re.search(r"^UNCOMPILED ", out, re.MULTILINE), (
        f"modules without a byte-compiled copy:\n{out}")
    assert seen.get("HELP") == "ok", f"train_amp.py --help failed:\n{out}"


# Python rewrites a .pyc whose recorded source mtime or size differs from the source's: the
# layers' fixed mtimes (docker/build/layer-trees.py normalize) must keep every shipped one valid.
PYC_PROBE = """
touch /tmp/before-imports && sleep 1
python -c 'import torch, torchvision, jupyterlab, matplotlib.pyplot, sklearn, tqdm, trainamp.main, team_pip_guard' || exit 3
find /opt/venv /usr/local/lib/team -name '*.pyc' -newer /tmp/before-imports | sed 's/^/REWRITTEN /' | head -20
"""


def test_shipped_pyc_files_are_valid_so_imports_write_none(run_in_image):
    """Container should import torch, Jupyter and trainamp from their shipped .pyc: none rewritten."""
    # As root, who may write anywhere in the venv: a stale .pyc would be replaced, and seen.
    code, out = run_in_image(["bash", "-c", PYC_PROBE], user="root", entrypoint=[], timeout=300)
    assert code == 0, f"the imports failed:\n{out[-3000:]}"
    assert "REWRITTEN" not in out, f"imports rewrote these .pyc files (stale in the image):\n{out[-3000:]}"


def _cublas_copies(run_in_image, before=""):
    code, out = run_in_image(
        ["bash", "-c", f"{before} find / -xdev \\( -name 'libcublas.so*' -o -name 'libcublasLt.so*' \\) -type f"],
        entrypoint=[], user="root")
    assert code == 0, out
    files = [line for line in out.splitlines() if line.startswith("/")]
    return {lib: [f for f in files if os.path.basename(f).startswith(lib + ".so")]
            for lib in ("libcublas", "libcublasLt")}


def test_image_has_exactly_one_cublas(run_in_image):
    """Image should carry one libcublas and one libcublasLt (the wheels'), not a second CUDA copy."""
    copies = _cublas_copies(run_in_image)
    for lib, found in copies.items():
        # nvidia/cublas/lib (CUDA 12 wheels) or nvidia/cu13/lib (CUDA 13's cuda-toolkit wheels).
        assert len(found) == 1 and "/site-packages/nvidia/" in found[0], (
            f"expected one {lib}, the wheel's, found {found}")
    # The same probe on a planted second copy (an empty file is enough for find) must see two.
    planted = _cublas_copies(run_in_image, "touch /usr/local/lib/libcublas.so.12 &&")
    assert len(planted["libcublas"]) == 2, f"the probe missed a planted second libcublas: {planted}"


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
    return set(_pem_list(text))


def _pem_list(text):
    """The certificates of a PEM text, in order (duplicates kept): their base64 bodies."""
    return re.findall(r"-----BEGIN CERTIFICATE-----\n(.*?)-----END CERTIFICATE-----", text, re.DOTALL)


# What an image's trust stores hold, and what its packages shipped, for _trust_store().
TRUST_PROBE = r"""
echo "== verify"; dpkg --verify ca-certificates && echo ok
echo "== local"; find /usr/local/share/ca-certificates -type f
echo "== shipped"; find /usr/share/ca-certificates -name '*.crt' -type f -exec cat {} +
echo "== store"; cat /etc/ssl/certs/ca-certificates.crt
echo "== certifi"; python - <<'EOF'
import base64, hashlib, importlib.metadata as md
f = next(f for f in md.distribution("certifi").files if f.name == "cacert.pem")
digest = base64.urlsafe_b64encode(hashlib.sha256(f.locate().read_bytes()).digest()).rstrip(b"=")
print("ok" if digest.decode() == f.hash.value else f"{f.locate()} differs from its wheel's RECORD")
EOF
"""


def _trust_store(run_in_image, image_ref):
    """(shipped certificates, [problems]) of an image's trust stores: every certificate in
    /etc/ssl/certs/ca-certificates.crt must be one the ca-certificates package shipped (itself
    unmodified), once; no local CA is added; certifi's bundle is the one in its wheel."""
    code, out = run_in_image(["bash", "-c", TRUST_PROBE], image=image_ref, entrypoint=[], user="root")
    assert code == 0, f"the trust-store probe failed:\n{out[-3000:]}"
    sections = dict(re.findall(r"^== (\w+)\n(.*?)(?=^== |\Z)", out, re.MULTILINE | re.DOTALL))
    shipped = _pem_blocks(sections["shipped"])
    assert len(shipped) > 50, f"the probe found {len(shipped)} shipped certificates: it is broken"
    store = _pem_list(sections["store"])
    problems = []
    if sections["verify"].strip() != "ok":
        problems.append(f"dpkg --verify ca-certificates: {sections['verify'].strip()}")
    if sections["local"].strip():
        problems.append(f"local CAs added: {sections['local'].split()}")
    unknown = [b.splitlines()[0] for b in store if b not in shipped]
    if unknown:
        problems.append(f"{len(unknown)} certificate(s) in the trust store that no package ships: {unknown}")
    if len(store) != len(set(store)):
        problems.append(f"the trust store repeats {len(store) - len(set(store))} certificate(s)")
    if sections["certifi"].strip() != "ok":
        problems.append(f"certifi: {sections['certifi'].strip()}")
    return shipped, problems


def _fake_ca_pem():
    """A throwaway self-signed CA certificate (PEM), as a TLS-inspecting proxy's CA looks."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.x509.oid import NameOID

    key = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "team-dl test proxy CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, None))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture
def image_with_leaked_ca(docker_client, image_ref, tmp_path):
    """The image under test plus two layers that leak a fake CA the way a careless build would:
    appended to the trust store, and a copy that the later layer deletes. Yields (tag, PEM,
    number of layers added); the image is removed afterwards."""
    pem = _fake_ca_pem()
    (tmp_path / "proxy-ca.pem").write_text(pem)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {image_ref}\n"
        "COPY proxy-ca.pem /tmp/proxy-ca.pem\n"
        "RUN cat /tmp/proxy-ca.pem >> /etc/ssl/certs/ca-certificates.crt && rm /tmp/proxy-ca.pem\n")
    tag = f"team-dl-test-leaked-ca:{uuid.uuid4().hex[:10]}"
    docker_client.images.build(path=str(tmp_path), tag=tag, rm=True, forcerm=True)
    try:
        yield tag, pem, 2
    finally:
        docker_client.images.remove(tag, force=True)


def test_build_ca_bundle_is_in_no_layer_or_history(docker_client, image, image_ref, run_in_image,
                                                   image_with_leaked_ca):
    """Image should keep no trace of the build's CA bundle: not in the trust store, any layer, or history."""
    # 1. The trust store holds only what its package ships: an appended proxy CA (whatever its
    # name) fails here, with or without CA_BUNDLE. The leaky image proves the check can fail.
    shipped, problems = _trust_store(run_in_image, image_ref)
    assert not problems, f"the image's trust store holds more than its packages ship: {problems}"
    leaked_tag, fake_pem, added = image_with_leaked_ca
    _, leaked_problems = _trust_store(run_in_image, leaked_tag)
    fake = _pem_list(fake_pem)[0]
    assert any(fake.splitlines()[0] in p for p in leaked_problems), (
        f"the check missed a fake CA appended to the trust store: {leaked_problems}")

    # 2. No layer holds a certificate only the build's bundle has (a public root the image ships
    # anyway says nothing). One scan of the leaky image covers every layer of the image under
    # test too; it must find the fake CA in exactly the layers that added it, and a shipped
    # root somewhere (so the scanner really reads the files inside layers).
    bundle = os.environ.get("CA_BUNDLE")
    extra = (_pem_blocks(pathlib.Path(bundle).read_text()) - shipped) if bundle else set()
    leaks = {b.splitlines()[1].encode() for b in extra}
    fake_marker, control = fake.splitlines()[1].encode(), min(shipped).splitlines()[1].encode()
    history = subprocess.run(["/usr/bin/docker", "history", "--no-trunc", image_ref], capture_output=True,
                             text=True, check=True).stdout
    assert "BEGIN CERTIFICATE" not in history and not any(m.decode() in history for m in leaks), (
        "a certificate is in the image's history")
    leaky = docker_client.images.get(leaked_tag)
    want_layers = len(image.attrs["RootFS"]["Layers"]) + added
    found, layers = _scan_layers(leaky, leaks | {fake_marker, control})
    assert len(layers) == len(leaky.attrs["RootFS"]["Layers"]) == want_layers, (
        f"scanned {len(layers)} layers; the image has {len(leaky.attrs['RootFS']['Layers'])}, expected {want_layers}")
    leaked = {m: where for m, where in found.items() if m in leaks}
    assert not leaked, f"the build's CA certificate is stored in the image: {leaked}"
    fake_layers = {i for i, _ in found.get(fake_marker, [])}
    assert fake_layers == set(range(want_layers - added, want_layers)), (
        f"the scanner should find the fake CA in exactly the {added} added layers: {found.get(fake_marker)}")
    assert found.get(control), "the scanner found no shipped root certificate in any layer: it reads nothing"


def _scan_layers(image, markers):
    """Stream `docker save` and search every file of every layer (deleted ones too) for markers.
    Returns ({marker: [(layer index or None, file)]}, [layer paths]), layers bottom-up as in
    RootFS. A layer that cannot be read as a tar fails the test: nothing passes silently."""
    hits, scanned, unreadable, manifest = {}, {}, {}, None
    stream = io.BufferedReader(_IterStream(image.save(chunk_size=1 << 20)), 1 << 20)
    with tarfile.open(fileobj=stream, mode="r|") as outer:
        for member in outer:
            if not member.isfile():
                continue
            f = outer.extractfile(member)
            if member.name == "manifest.json":
                manifest = json.loads(f.read())
                continue
            if not (member.name.endswith("layer.tar") or member.name.startswith("blobs/")):
                for m in _markers_in(f, markers):  # the image config (with its history), ...
                    hits.setdefault(m, []).append((None, member.name))
                continue
            files = 0
            try:
                with tarfile.open(fileobj=f, mode="r|") as layer:
                    for entry in layer:
                        if entry.isfile():
                            files += 1
                            for m in _markers_in(layer.extractfile(entry), markers):
                                hits.setdefault(m, []).append((member.name, entry.name))
            except tarfile.ReadError as e:
                # Only layers count: OCI blobs (Docker >= 25) include the config and manifests.
                # A layer with no files is a valid tar that tarfile calls an "empty file".
                if str(e) != "empty file":
                    unreadable[member.name] = str(e)
                    continue
            scanned[member.name] = files
    assert manifest, "docker save wrote no manifest.json: cannot tell which files are layers"
    order = manifest[0]["Layers"]
    bad = {p: unreadable.get(p, "not in the saved tar") for p in order if p not in scanned}
    assert not bad, f"layers the scanner could not read: {bad}"
    index = {p: i for i, p in enumerate(order)}
    return {m: [(index.get(p), name) for p, name in where] for m, where in hits.items()}, order


def _markers_in(f, markers, overlap=128):
    """Which markers occur in file object f (read in chunks, also across chunk borders)."""
    seen, tail = set(), b""
    while chunk := f.read(1 << 20):
        buf = tail + chunk
        seen.update(m for m in markers if m in buf)
        tail = buf[-overlap:]
    return seen


class _SavedImage:
    """Stands in for a docker SDK image whose `docker save` is the given {name: bytes}."""

    def __init__(self, members):
        self.data = _layer(members)  # a docker save archive is a tar like a layer

    def save(self, chunk_size):
        return (self.data[i:i + chunk_size] for i in range(0, len(self.data), chunk_size))


def _layer(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_layer_scanner_reads_empty_layers_and_fails_on_an_unreadable_one():
    """The layer scanner should find markers, count an empty layer, and fail on a layer it cannot read."""
    manifest = json.dumps([{"Layers": ["a/layer.tar", "b/layer.tar", "c/layer.tar"]}]).encode()
    good = {"manifest.json": manifest, "a/layer.tar": _layer({"etc/x.crt": b"..MARKER.."}),
            "b/layer.tar": _layer({}), "c/layer.tar": _layer({"y": b"nothing"}), "cfg.json": b"{}"}
    found, layers = _scan_layers(_SavedImage(good), {b"MARKER"})
    assert (found, layers) == ({b"MARKER": [(0, "etc/x.crt")]}, ["a/layer.tar", "b/layer.tar", "c/layer.tar"]), (
        f"the scanner should find the marker in layer 0 and read all three layers: {found} {layers}")
    broken = dict(good, **{"c/layer.tar": b"\x1f\x8b not a tar at all" * 40})
    with pytest.raises(AssertionError, match=r"could not read.*c/layer\.tar"):
        _scan_layers(_SavedImage(broken), {b"MARKER"})
    missing = {k: v for k, v in good.items() if k != "b/layer.tar"}
    with pytest.raises(AssertionError, match=r"b/layer\.tar.*not in the saved tar"):
        _scan_layers(_SavedImage(missing), {b"MARKER"})


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


TORCH_COMPILE_SCRIPT = (
    "import torch\n"
    "from torch._dynamo.utils import counters\n"
    "m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))\n"
    "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
    "cm = torch.compile(m)\n"
    "x, y = torch.randn(64, 16), torch.randn(64, 1)\n"
    "for _ in range(3):\n"
    "    loss = torch.nn.functional.mse_loss(cm(x), y); opt.zero_grad(); loss.backward(); opt.step()\n"
    "assert torch.allclose(cm(x), m(x), atol=1e-5)\n"
    # Equal results alone would pass an eager run too (TORCH_COMPILE_DISABLE=1, a fallback).
    "graphs, inductor = counters['stats']['unique_graphs'], dict(counters['inductor'])\n"
    "print('graphs', graphs, 'inductor', inductor)\n"
    "assert graphs > 0 and inductor, 'torch.compile compiled no graph: the model ran eagerly'\n"
    "print('compiled-ok', float(loss))\n"
)


@pytest.mark.parametrize("env, compiles", [({}, True), ({"TORCH_COMPILE_DISABLE": "1"}, False)],
                         ids=["image", "mutation-compile-disabled"])
def test_torch_compile_trains_a_tiny_model_on_cpu(run_in_image, env, compiles):
    """Container should compile (Inductor, gcc) graphs and train a tiny model on the CPU."""
    # The mutation case runs the same check with compiling switched off: it must report it.
    code, out = run_in_image(["python", "-c", TORCH_COMPILE_SCRIPT], environment=env, timeout=600)
    if compiles:
        assert code == 0 and "compiled-ok" in out, f"torch.compile did not compile and train:\n{out}"
        assert re.search(r"^graphs [1-9]", out, re.MULTILINE), f"no compiled graph counted:\n{out}"
    else:
        assert code != 0 and "compiled no graph" in out, (
            f"with TORCH_COMPILE_DISABLE=1 the check should fail naming the eager run:\n{out}")


def test_build_fails_when_contents_differ_from_the_tag():
    """The build should fail, naming the mismatch, when a version arg disagrees with the contents."""
    # `make build` as the image under test was built (its BASE_IMAGE, PYTHON_VERSION, CA_BUNDLE
    # and ROW come from make test), so every stage below the check is the build cache's, and
    # TARGET=records stops at the stage that decides: only the check runs, with the wrong cuDNN.
    # (With build args of its own, no PYPI_AS_OF or OS_UPDATES, it kept a torch install of its own
    # in the cache, rebuilt whenever the cache had lost it.) BUILD_OPTS come after make's build
    # args, and docker takes the last value of an arg given twice.
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "IMAGE", "TAG", "TARGET")}
    try:
        r = subprocess.run(["make", "-C", str(ROOT), "build", "PREFLIGHT=0", "DOCKER=/usr/bin/docker",
                            "IMAGE=team-dl-test-mismatch", "TAG=records", "TARGET=records",
                            "BUILD_OPTS=--build-arg CUDNN=8.9"],
                           env=clean, check=False, capture_output=True, text=True, timeout=1800)
    finally:
        remove_image("team-dl-test-mismatch:records")  # only there if the build wrongly passed
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"the build accepted CUDNN=8.9 for an image holding cuDNN {THIS['cudnn']}:\n{out[-3000:]}"
    assert f"cudnn is {THIS['cudnn']}" in out, out[-3000:]
