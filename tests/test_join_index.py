"""scripts/join_index.py (the release workflow's join of the native per-platform builds into one
index): offline, against a fake `docker` that answers `manifest inspect -v` and `buildx
imagetools` from a table, as a registry holding those manifests would. No Docker, no network."""
import json
import subprocess
import sys

import pytest
from conftest import ROOT

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

REPO = "ghcr.io/acme/team-dl"
ROW = "2.15.0-cuda13.2"  # versions.json: linux/amd64 and linux/arm64
AMD, ARM = "sha256:" + "a" * 64, "sha256:" + "b" * 64              # what each build pushed (an index)
AMD_IMG, ARM_IMG = "sha256:" + "1" * 64, "sha256:" + "2" * 64      # the image in each
JOINED = "sha256:" + "c" * 64

FAKE_DOCKER = r"""
import json, os, pathlib, sys
args = sys.argv[1:]
table = json.loads(os.environ["FAKE_REGISTRY"])
with pathlib.Path(os.environ["FAKE_DOCKER_LOG"]).open("a") as f:
    f.write(json.dumps(args) + "\n")
if args[:3] == ["manifest", "inspect", "-v"]:
    print(json.dumps(table[args[3]]))
elif args[:3] == ["buildx", "imagetools", "create"]:
    pass
elif args[:3] == ["buildx", "imagetools", "inspect"]:
    print(json.dumps({"digest": table["joined-digest"]}))
else:
    sys.exit(f"fake docker: unexpected {args}")
"""


def entry(digest, arch):
    return {"Descriptor": {"digest": digest, "platform": {"os": "linux", "architecture": arch}}}


ATTESTATION = {"Descriptor": {"digest": "sha256:" + "f" * 64, "platform": {"os": "unknown", "architecture": "unknown"}}}


def registry(joined_arm=ARM_IMG):
    return {f"{REPO}@{AMD}": [entry(AMD_IMG, "amd64"), ATTESTATION],
            f"{REPO}@{ARM}": [entry(ARM_IMG, "arm64"), ATTESTATION],
            f"{REPO}@{JOINED}": [entry(AMD_IMG, "amd64"), entry(joined_arm, "arm64"), ATTESTATION, ATTESTATION],
            "joined-digest": JOINED}


def run_join(tmp_path, digests, table):
    folder = tmp_path / "digests"
    folder.mkdir()
    for arch, digest in digests.items():
        (folder / arch).write_text(digest + "\n")
    fake = tmp_path / "docker"
    fake.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    fake.chmod(0o755)
    log = tmp_path / "docker.log"
    env = {"PATH": "/usr/bin:/bin", "DOCKER": str(fake), "FAKE_REGISTRY": json.dumps(table),
           "FAKE_DOCKER_LOG": str(log)}
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "join_index.py"), REPO, ROW, str(folder)],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def test_each_platforms_build_is_joined_into_one_index_and_its_digest_printed(tmp_path):
    """Both native builds should be joined under the staging tag, read back by digest, and the
    index's digest printed for signing, each platform's image being the one its build pushed."""
    result, calls = run_join(tmp_path, {"amd64": AMD, "arm64": ARM}, registry())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == JOINED, result.stdout
    create = next(c for c in calls if c[:3] == ["buildx", "imagetools", "create"])
    assert create[3:] == ["-t", f"{REPO}:staging-{ROW}", f"{REPO}@{AMD}", f"{REPO}@{ARM}"], create
    assert ["manifest", "inspect", "-v", f"{REPO}@{JOINED}"] in calls, f"not read back by digest: {calls}"


def test_a_platform_without_a_build_is_refused_before_anything_is_pushed(tmp_path):
    """A row whose arm64 build left no digest should be refused, naming the platform, with no index
    pushed: a tag must never lose an architecture it had."""
    result, calls = run_join(tmp_path, {"amd64": AMD}, registry())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no build for linux/arm64" in result.stderr, result.stderr
    assert not calls, f"docker was called: {calls}"


def test_an_index_holding_another_image_for_a_platform_is_refused(tmp_path):
    """A joined index whose arm64 image is not the one the arm64 build pushed (another run joined
    under the staging tag meanwhile) should be refused, naming both digests."""
    other = "sha256:" + "9" * 64
    result, _ = run_join(tmp_path, {"amd64": AMD, "arm64": ARM}, registry(joined_arm=other))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"holds {other} for linux/arm64, its build pushed {ARM_IMG}" in result.stderr, result.stderr
    assert not result.stdout.strip(), f"a digest was printed for signing: {result.stdout}"


@pytest.mark.parametrize("bad", ["", "latest", "sha256:"[:-1]])
def test_a_digest_file_without_a_digest_is_refused(tmp_path, bad):
    """A digest file that holds no sha256 digest (an empty upload) counts as no build."""
    result, calls = run_join(tmp_path, {"amd64": AMD, "arm64": bad}, registry())
    assert result.returncode == 1 and "no build for linux/arm64" in result.stderr, result.stderr
    assert not calls, calls


def test_every_platform_a_row_publishes_has_a_native_runner():
    """The release workflow's build matrix should hold one entry per row and platform, each on a
    GitHub runner of that platform's CPU (ubuntu-24.04-arm for arm64), none emulated."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "versions.py"), "builds"],
                         capture_output=True, text=True, check=True).stdout
    include = json.loads(out)["include"]
    rows = json.loads((ROOT / "versions.json").read_text())["matrix"]
    assert len(include) == sum(len(r["platforms"]) for r in rows), include
    runner = {"amd64": "ubuntu-24.04", "arm64": "ubuntu-24.04-arm"}
    for e in include:
        assert e["runner"] == runner[e["arch"]] and e["platform"] == "linux/" + e["arch"], e
    assert {"row": ROW, "platform": "linux/arm64", "arch": "arm64", "runner": "ubuntu-24.04-arm"} in include


def test_a_row_that_names_no_platforms_publishes_amd64_only(tmp_path):
    """A versions.json row without `platforms` should be built and published for linux/amd64 only."""
    data = json.loads((ROOT / "versions.json").read_text())
    for r in data["matrix"]:
        r.pop("platforms", None)
    (tmp_path / "versions.json").write_text(json.dumps(data))
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "versions.py").write_text((ROOT / "scripts" / "versions.py").read_text())
    out = subprocess.run([sys.executable, str(tmp_path / "scripts" / "versions.py"), "builds"],
                         capture_output=True, text=True, check=True).stdout
    assert {e["platform"] for e in json.loads(out)["include"]} == {"linux/amd64"}, out
    assert len(json.loads(out)["include"]) == len(data["matrix"]), out
