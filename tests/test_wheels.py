"""scripts/check_wheels.py (make lint): every versions.json row's torch/torchvision/torchaudio pins
must install from wheels on its base's Python. These tests run it offline: a fake pip answers as
pip did (a recorded --report, pip's own error text) and a local HTTP server stands in for the
index, so what is tested is the script's logic, not PyPI. No image, no Docker, no network."""
import json
import os
import socket
import subprocess
import sys
import zipfile

import check_wheels  # scripts/check_wheels.py (conftest puts scripts/ on sys.path)
import pytest
import versions
from conftest import ROOT, http_status_server

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

DATA = ROOT / "tests" / "data"
REPORT = DATA / "pip-report-torch-2.15.0-cp312-x86_64.json"
BLACKWELL = "2.15.0-cuda13.2"
DEFAULT = "2.6.0-cuda12.4"

# Answers as pip gave them (pip 26.3, 2026-12-05): torch 2.15.0 asked for on Python 3.10, and
# an index that stopped answering after the script's probe.
NO_WHEEL = """ERROR: Could not find a version that satisfies the requirement torch==2.15.0 (from versions: 2.13.0, 2.14.0, 2.14.1)
ERROR: No matching distribution found for torch==2.15.0
"""
OFFLINE = """WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError("HTTPSConnection(host='pypi.org', port=443): Failed to establish a new connection: [Errno 111] Connection refused")': /simple/torch/
ERROR: Could not find a version that satisfies the requirement torch==2.15.0 (from versions: none)
ERROR: No matching distribution found for torch==2.15.0
"""

FAKE_PIP = r"""
import json, os, pathlib, sys
machine, args = sys.argv[1], sys.argv[2:]
log = pathlib.Path(os.environ["FAKE_PIP_LOG"])
with log.open("a") as f:
    f.write(json.dumps({"machine": machine, "argv": args, "config": os.environ.get("PIP_CONFIG_FILE"),
                        "constraint": os.environ.get("PIP_CONSTRAINT"),
                        "marker_python": os.environ.get("MARKER_PYTHON")}) + "\n")
mode = os.environ["FAKE_PIP_MODE"]
if args[0] == "wheel":  # build the sdist named last: a wheel of the tag FAKE_PIP_WHEEL_TAG
    name, version = args[-1].split("==")
    out = pathlib.Path(args[args.index("--wheel-dir") + 1])
    (out / f"{name}-{version}-{os.environ['FAKE_PIP_WHEEL_TAG']}.whl").write_text("")
    sys.exit(0)
if mode == "sdist" and "--find-links" not in args and "--requirement" in args:
    sys.stderr.write("ERROR: Could not find a version that satisfies the requirement gpustat==1.1.1 (from versions: none)\n"
                     "ERROR: No matching distribution found for gpustat==1.1.1\n")
    sys.exit(1)
if mode in ("ok", "sdist"):
    report = args[args.index("--report") + 1]
    recorded = os.environ.get("FAKE_PIP_REPORT_" + machine) or os.environ["FAKE_PIP_REPORT"]
    pathlib.Path(report).write_text(pathlib.Path(recorded).read_text())
    print("Would install torch-2.15.0 ...")
    sys.exit(0)
sys.stderr.write(os.environ["FAKE_PIP_OUTPUT"])
sys.exit(1)
"""


@pytest.fixture(scope="module")
def index():
    """A local 'index' that answers every request with 404: reachable, as the probe needs."""
    with http_status_server(404) as port:
        yield f"http://127.0.0.1:{port}/simple"


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"  # nothing listens there now


def run_check(tmp_path, index_url, mode="ok", report=None, output="", extra_env=None, row=BLACKWELL,
              platforms=None):
    """check_wheels.py --row ROW with the fake pip; returns (result, the fake pip's calls).
    platforms: the row declares these instead (a copy of scripts/ and versions.json in tmp_path)."""
    script = ROOT / "scripts" / "check_wheels.py"
    if platforms:
        data = json.loads((ROOT / "versions.json").read_text())
        for r in data["matrix"]:
            r["platforms"] = platforms if r["name"] == row else r["platforms"]
        (tmp_path / "versions.json").write_text(json.dumps(data))
        (tmp_path / "scripts").mkdir()
        for name in ("check_wheels.py", "versions.py", "pip_for_machine.py"):
            (tmp_path / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
        script = tmp_path / "scripts" / "check_wheels.py"
    fake = tmp_path / "fake_pip.py"
    fake.write_text(FAKE_PIP)
    log = tmp_path / "pip-calls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_INDEX_URL=index_url, CHECK_WHEELS_PIP=f"{sys.executable} {fake}",
               FAKE_PIP_LOG=str(log), FAKE_PIP_MODE=mode, FAKE_PIP_REPORT=str(report or REPORT),
               FAKE_PIP_OUTPUT=output, **(extra_env or {}))
    result = subprocess.run([sys.executable, str(script), "--row", row],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def test_manylinux_tags_cover_every_glibc_up_to_the_bases():
    """The --platform list should hold every manylinux tag the base's glibc accepts (pip takes the
    list literally: NVIDIA's cuDNN wheel is manylinux_2_27), and none it does not."""
    x86 = check_wheels.manylinux_tags("x86_64", "2.39")
    for tag in ("manylinux_2_39_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                "manylinux_2_17_x86_64", "manylinux_2_5_x86_64", "manylinux2014_x86_64",
                "manylinux2010_x86_64", "manylinux1_x86_64"):
        assert tag in x86, f"{tag} missing from {x86}"
    assert "manylinux_2_40_x86_64" not in x86, "a tag newer than the base's glibc"
    arm = check_wheels.manylinux_tags("aarch64", "2.39")
    assert "manylinux_2_39_aarch64" in arm and "manylinux2014_aarch64" in arm, arm
    assert not [t for t in arm if t.startswith(("manylinux2010", "manylinux1_", "manylinux_2_16"))], \
        f"aarch64 has no manylinux tags below 2_17: {arm}"


def test_every_row_publishes_platforms_the_check_knows():
    """Every versions.json row should name its glibc (data, not code) and publish platforms
    (linux/amd64 when it names none), each one the check has a wheel architecture for."""
    assert check_wheels.WHEEL_ARCH["linux/arm64"] == "aarch64"
    for row in check_wheels.versions.DATA["matrix"]:
        assert row.get("platforms") and row.get("glibc"), f"row {row['name']} lacks platforms/glibc"
        unknown = [p for p in row["platforms"] if p not in check_wheels.WHEEL_ARCH]
        assert not unknown, f"row {row['name']}: no wheel architecture for {unknown}"


def test_a_row_whose_pins_resolve_passes_on_its_base_and_the_stand_in(tmp_path, index):
    """A row pip resolves should pass, naming the CUDA libraries it pulls in, after asking pip for
    a metadata-only dry run on the row's Python and glibc, and again on the stand-in's, from the
    index the build uses (PIP_INDEX_URL) with no pip config file and no inherited constraint."""
    result, calls = run_check(tmp_path, index, extra_env={"PIP_CONSTRAINT": "/etc/xdg/pip/constraints.txt"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"OK {BLACKWELL} linux/amd64 on its base (Python 3.12, glibc 2.39)" in result.stdout, result.stdout
    assert "on its stand-in (Python 3.11, glibc 2.36)" in result.stdout, result.stdout
    assert "nvidia-cudnn-cu13 9.26.0.51" in result.stdout, result.stdout
    base = next(c["argv"] for c in calls if "3.12" in c["argv"] and c["machine"] == "x86_64")
    for arg in ("install", "--dry-run", "--only-binary=:all:", "--use-feature=fast-deps", "--ignore-installed",
                "--target", "--report", "torch==2.15.0", "torchvision==0.29.2", "torchaudio==2.11.1"):
        assert arg in base, f"pip was not asked with {arg}: {base}"
    assert base[base.index("--index-url") + 1] == index, f"not the build's index: {base}"
    assert base[base.index("--implementation") + 1] == "cp"
    platforms = [base[i + 1] for i, a in enumerate(base) if a == "--platform"]
    assert platforms[0] == "manylinux_2_39_x86_64" and "manylinux_2_27_x86_64" in platforms, platforms
    assert all(c["config"] == os.devnull and c["constraint"] is None for c in calls), calls
    for c in calls:
        tags = {c["argv"][i + 1] for i, a in enumerate(c["argv"]) if a == "--platform"}
        assert all(t.endswith("_" + c["machine"]) for t in tags), f"pip run as on {c['machine']} for {tags}"


def test_requirements_are_asked_for_on_the_bases_python_and_only_the_pins_on_the_stand_in(tmp_path, index):
    """The base's check should ask for what the build installs (the pins, pip, requirements.txt)
    with markers answering for the base's Python; the stand-in's only for the pins (CI's build
    there installs the rest itself, and a full resolution costs a minute)."""
    result, calls = run_check(tmp_path, index)
    assert result.returncode == 0, result.stdout + result.stderr
    base = next(c for c in calls if "3.12" in c["argv"])
    standin = next(c for c in calls if "3.11" in c["argv"])
    assert base["argv"][-3:] == ["pip", "--requirement", str(check_wheels.REQUIREMENTS)], base["argv"]
    assert "--requirement" not in standin["argv"], standin["argv"]
    assert base["marker_python"] == "3.12" and standin["marker_python"] == "3.11", calls
    assert "2.11.1 and requirements.txt: " in result.stdout, result.stdout


@pytest.mark.parametrize("tag, ok", [("py3-none-any", True), ("cp312-cp312-linux_x86_64", False)],
                         ids=["pure", "compiled"])
def test_an_sdist_only_release_is_built_here_then_pip_is_asked_again(tmp_path, index, tag, ok):
    """A pin published as an sdist alone (gpustat 1.1.1; pip answers 'from versions: none' for
    another Python) should be built into a wheel here and pip asked again with it; a wheel that
    is not pure Python cannot stand in for another Python's, and the row fails saying so."""
    result, calls = run_check(tmp_path, index, mode="sdist", extra_env={"FAKE_PIP_WHEEL_TAG": tag})
    built = [c["argv"] for c in calls if c["argv"][0] == "wheel"]
    platforms = versions.row(BLACKWELL)["platforms"]  # one base check each; the stand-in's asks no sdist
    assert len(built) == len(platforms) and all(b[-1] == "gpustat==1.1.1" for b in built), calls
    assert built[0][built[0].index("--no-binary") + 1] == "gpustat", built[0]
    if ok:
        assert result.returncode == 0, result.stdout + result.stderr
        again = [c["argv"] for c in calls if "--find-links" in c["argv"]]
        assert again, f"pip was not asked again with the built wheel: {calls}"
        assert "built here from sdists: gpustat==1.1.1" in result.stdout, result.stdout
    else:
        assert result.returncode == 1, result.stdout + result.stderr
        assert "gpustat==1.1.1 is published as an sdist only and is not pure Python" in result.stdout, result.stdout


@pytest.mark.parametrize("python, version", [("3.10", "1.0"), ("3.11", "2.0"), ("3.12.1", "2.0")])
def test_pip_for_machine_evaluates_python_version_markers_for_the_target_python(tmp_path, python, version):
    """With MARKER_PYTHON, a requirements.txt marker should answer for that Python, not for the one
    pip runs on (pip's --python-version does not change markers): the default row's Python 3.10
    base takes the line marked < 3.11. Real pip, local wheels."""
    wheel(tmp_path, "fakedash", version="1.0")
    wheel(tmp_path, "fakedash", version="2.0")
    reqs = tmp_path / "requirements.txt"
    reqs.write_text('fakedash==2.0; python_version >= "3.11"\nfakedash==1.0; python_version < "3.11"\n')
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "pip_for_machine.py"), "x86_64", "install", "--dry-run",
         "--ignore-installed", "--no-index", "--find-links", str(tmp_path), "--target", str(tmp_path / "t"),
         "--report", str(report), "--requirement", str(reqs)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull,
             "MARKER_PYTHON": python})
    assert result.returncode == 0, result.stdout + result.stderr
    got = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert got == {"fakedash": version}, f"as on Python {python}, pip would install {got}"


def test_a_row_without_wheels_for_its_python_fails_with_pips_reason(tmp_path, index):
    """A row pip cannot resolve (torch 2.15.0 on Python 3.10) should fail, naming the row,
    platform and Python, with pip's own reason."""
    result, _ = run_check(tmp_path, index, mode="fail", output=NO_WHEEL)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"FAIL {BLACKWELL} linux/amd64 on its base (Python 3.12" in result.stdout, result.stdout
    assert "No matching distribution found for torch==2.15.0" in result.stdout, result.stdout
    assert "cannot be installed" in result.stderr, result.stderr


@pytest.mark.parametrize("change, says", [
    ({"nvidia-cudnn-cu13": "9.19.0.56"}, "cudnn is nvidia-cudnn-cu13 9.19.0.56, the row says 9.26"),
    ({"nvidia-cudnn-cu13": None, "nvidia-nccl-cu13": None, "nvidia-cuda-runtime": None}, "is not a CUDA build"),
    ({"torch": "2.15.1"}, "torch resolves to 2.15.1, the row pins 2.15.0"),
], ids=["other-cudnn", "cpu-only-torch", "other-torch"])
def test_a_resolution_that_differs_from_the_row_fails(tmp_path, index, change, says):
    """A resolution whose torch, cuDNN, NCCL or CUDA runtime is not the row's (the tag and labels
    would lie), or that has no CUDA libraries at all (a CPU-only wheel), should fail, saying which."""
    report = json.loads(REPORT.read_text())
    kept = []
    for item in report["install"]:
        name = item["metadata"]["name"]
        if name in change and change[name] is None:
            continue
        item["metadata"]["version"] = change.get(name) or item["metadata"]["version"]
        kept.append(item)
    report["install"] = kept
    edited = tmp_path / "report.json"
    edited.write_text(json.dumps(report))
    result, _ = run_check(tmp_path, index, report=edited)
    assert result.returncode == 1 and says in result.stdout, result.stdout + result.stderr


def test_an_unreachable_index_fails_and_says_nothing_was_checked(tmp_path):
    """An index that does not answer (download.pytorch.org from here) should fail make lint with
    its own status, naming the index and the way to skip, never a pass; pip is not even asked."""
    url = closed_port_url()
    result, calls = run_check(tmp_path, url)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "UNREACHABLE" in result.stderr and url in result.stderr and "NOT checked" in result.stderr, result.stderr
    assert "CHECK_WHEELS=0" in result.stderr, result.stderr
    assert "OK" not in result.stdout and not calls, f"something was reported as checked: {result.stdout} {calls}"


def test_an_index_lost_midway_is_unreachable_not_a_missing_wheel(tmp_path, index):
    """When pip itself cannot reach the index (it answered the probe, then went away), the check
    should report the index unreachable (status 2), not that the row has no wheels."""
    result, _ = run_check(tmp_path, index, mode="fail", output=OFFLINE)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "UNREACHABLE" in result.stderr and "NewConnectionError" in result.stderr, result.stderr
    assert "FAIL" not in result.stdout, result.stdout


def test_an_arm64_row_is_asked_for_as_on_aarch64_and_passes_with_cuda_wheels(tmp_path, index):
    """A row that publishes linux/arm64 should be checked on each platform, pip run as on that CPU
    with that CPU's manylinux tags, and pass when aarch64's resolution has the row's CUDA wheels."""
    result, calls = run_check(tmp_path, index, platforms=["linux/amd64", "linux/arm64"], extra_env={
        "FAKE_PIP_REPORT_aarch64": str(DATA / "pip-report-torch-2.15.0-cp312-aarch64.json")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"OK {BLACKWELL} linux/arm64 on its base (Python 3.12, glibc 2.39)" in result.stdout, result.stdout
    arm = [c for c in calls if c["machine"] == "aarch64"]
    assert len(arm) == 2 and len(calls) == 4, f"not one call per platform and Python: {calls}"
    tags = {c["argv"][i + 1] for c in arm for i, a in enumerate(c["argv"]) if a == "--platform"}
    assert "manylinux_2_28_aarch64" in tags and not [t for t in tags if "x86_64" in t], tags


def test_a_row_declaring_arm64_with_torch_2_6_fails_as_cpu_only(tmp_path, index):
    """torch 2.6.0's aarch64 wheels on PyPI are CPU-only (their nvidia-* requirements hold only on
    x86_64): a row that declared linux/arm64 with them should fail, naming the platform, not pass."""
    result, calls = run_check(tmp_path, index, row=DEFAULT, platforms=["linux/arm64"],
                              report=DATA / "pip-report-torch-2.6.0-cp310-aarch64.json")
    assert result.returncode == 1, result.stdout + result.stderr
    assert calls and {c["machine"] for c in calls} == {"aarch64"}, calls
    assert f"FAIL {DEFAULT} linux/arm64 on its base (Python 3.10" in result.stdout, result.stdout
    assert "torch 2.6.0 for linux/arm64 is not a CUDA build there" in result.stdout, result.stdout


def wheel(folder, name, requires=(), version="1.0"):
    """A minimal wheel: metadata only, which is all a --dry-run reads."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{dist}/METADATA": meta, f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


@pytest.mark.parametrize("machine, pulled", [("aarch64", False), ("x86_64", True)])
def test_pip_for_machine_evaluates_markers_for_the_target_cpu(tmp_path, machine, pulled):
    """pip_for_machine.py should make environment markers answer for the machine it is given
    (pip's --platform does not: pypa/pip#10050): a requirement marked `platform_machine ==
    "x86_64"` is pulled in as on x86_64 only, whatever this host is. Real pip, local wheels."""
    wheel(tmp_path, "fakecore", ['fakecuda==1.0; platform_machine == "x86_64"'])
    wheel(tmp_path, "fakecuda")
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "pip_for_machine.py"), machine, "install", "--dry-run",
         "--ignore-installed", "--no-index", "--find-links", str(tmp_path), "--target", str(tmp_path / "t"),
         "--report", str(report), "fakecore"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull})
    assert result.returncode == 0, result.stdout + result.stderr
    names = sorted(i["metadata"]["name"] for i in json.loads(report.read_text())["install"])
    assert ("fakecuda" in names) == pulled, f"as on {machine}, pip would install {names}"


def test_pypi_is_asked_as_of_pypi_as_of_like_the_build_and_a_mirror_is_not(tmp_path):
    """On PyPI the check should see what the build sees (pypi_as_of); a mirror gets no cutoff."""
    row = versions.row()
    args = ("linux/amd64", "3.11", "2.36")
    on_pypi = check_wheels.pip_command(row, *args, [check_wheels.PYPI], tmp_path, tmp_path / "r.json")
    at = on_pypi.index("--uploaded-prior-to")
    assert on_pypi[at + 1] == versions.DATA["pypi_as_of"], on_pypi
    on_mirror = check_wheels.pip_command(row, *args, ["https://mirror.example/simple"], tmp_path, tmp_path / "r.json")
    assert "--uploaded-prior-to" not in on_mirror, on_mirror


def test_a_pass_against_pypi_as_of_a_fixed_time_is_remembered_until_an_input_changes(tmp_path, monkeypatch, capsys):
    """A pass on PyPI as of pypi_as_of is remembered (make lint then asks neither pip nor the
    index); a changed requirements.txt, an expired entry, a failure or a mirror ask pip again."""
    asked, probed = [], []
    verdict = {"ok": True}
    monkeypatch.setattr(check_wheels, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(check_wheels, "probe", lambda url, env: probed.append(url))
    monkeypatch.setattr(check_wheels, "check_row", lambda row, platform, python, *a, **k: (
        asked.append((row["name"], platform, python)) or (verdict["ok"], "27 packages in 4.2 s")))
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "CHECK_WHEELS_CACHE", "CHECK_WHEELS_PIP"):
        monkeypatch.delenv(name, raising=False)
    checks = len(check_wheels.targets(versions.row(DEFAULT), versions.DATA["standin"]))

    def lint():
        asked.clear(), probed.clear()
        rc = check_wheels.main(["--row", DEFAULT])
        return rc, capsys.readouterr().out

    rc, out = lint()
    assert (rc, len(asked), len(probed)) == (0, checks, 1) and "cached" not in out, out
    monkeypatch.setattr(sys, "executable", "/another/clone/.venv-test/bin/python")  # CI's next clone
    rc, out = lint()
    assert (rc, asked, probed) == (0, [], []), f"unchanged inputs asked pip again: {asked}\n{out}"
    assert out.count("(cached: these inputs passed 0 h ago") == checks, out

    requirements = tmp_path / "requirements.txt"
    requirements.write_text(check_wheels.REQUIREMENTS.read_text() + "six==1.16.0\n")
    monkeypatch.setattr(check_wheels, "REQUIREMENTS", requirements)
    rc, out = lint()
    assert (rc, len(asked)) == (0, checks), f"a changed requirements.txt was answered from the cache:\n{out}"

    for entry in (tmp_path / "cache").glob("*.json"):  # a week old: past CACHE_DAYS
        entry.write_text(json.dumps({**json.loads(entry.read_text()), "at": 0}))
    verdict["ok"] = False
    rc, out = lint()
    assert (rc, len(asked)) == (1, checks), f"an expired pass was used:\n{out}"
    rc, out = lint()
    assert (rc, len(asked)) == (1, checks), f"a failure was remembered:\n{out}"

    verdict["ok"] = True
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # a mirror: PyPI's cutoff does not apply
    lint()
    rc, out = lint()
    assert (rc, len(asked)) == (0, checks), f"a mirror's answer was remembered:\n{out}"
