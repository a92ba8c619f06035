"""The base image's own updates (scripts/base_bump.py, make base-bump, the monthly base-bump
workflow): a row's base tag that names another digest upstream than versions.json pins is
reported and, with --write, moved; a row with no pin gets one (trust on first use). Against a
local registry standing in for Docker Hub, holding small multi-platform indexes pushed here."""
import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import requests
from conftest import ROOT

SCRIPTS = ("base_bump.py", "registry.py", "registry_tls.py", "versions.py")


def push_index(address, repository, tag, salt):
    """Push a one-platform index (as nvidia/cuda's tags are) whose bytes depend on salt; -> its digest."""
    v2 = f"http://{address}/v2/{repository}"

    def blob(data):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        start = requests.post(f"{v2}/blobs/uploads/", timeout=10)
        assert start.status_code == 202, start.text
        sep = "&" if "?" in start.headers["Location"] else "?"
        put = requests.put(f"{start.headers['Location']}{sep}digest={digest}", data=data, timeout=10,
                           headers={"Content-Type": "application/octet-stream"})
        assert put.status_code == 201, put.text
        return {"digest": digest, "size": len(data)}

    def manifest(reference, body, media_type):
        data = json.dumps(body).encode()
        put = requests.put(f"{v2}/manifests/{reference}", data=data, headers={"Content-Type": media_type}, timeout=10)
        assert put.status_code == 201, put.text
        return {"digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}

    config = blob(json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                              "config": {"Labels": {"salt": salt}}}).encode())
    layer = blob(f"layer {salt}".encode())
    image_type = "application/vnd.docker.distribution.manifest.v2+json"
    image = manifest(f"image-{salt}", {"schemaVersion": 2, "mediaType": image_type,
                                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
                                       "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", **layer}]},
                     image_type)
    index_type = "application/vnd.docker.distribution.manifest.list.v2+json"
    return manifest(tag, {"schemaVersion": 2, "mediaType": index_type,
                          "manifests": [{"mediaType": image_type, **image,
                                         "platform": {"architecture": "amd64", "os": "linux"}}]}, index_type)["digest"]


@pytest.fixture
def tree(tmp_path):
    """The scripts and versions.json in a copy of their own: --write edits that copy."""
    (tmp_path / "scripts").mkdir()
    for name in SCRIPTS:
        shutil.copy2(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    shutil.copy2(ROOT / "versions.json", tmp_path / "versions.json")
    return tmp_path


def bump(tree, *args):
    return subprocess.run([sys.executable, str(tree / "scripts" / "base_bump.py"), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_moved_tag_and_an_unpinned_row_are_pinned_to_what_upstream_names_now(tree, local_registry):
    """The monthly job should move a pin whose tag names a newer digest, pin a row that had none, and change nothing else."""
    data = json.loads((tree / "versions.json").read_text())
    pinned, unpinned = data["matrix"][0], data["matrix"][1]
    assert pinned["base_image_digest"] and not unpinned["base_image_digest"], "the rows this test stands on"
    now = {r["name"]: push_index(local_registry, r["base_image"].split(":")[0], r["base_image"].split(":")[1], r["name"])
           for r in (pinned, unpinned)}
    (tree / "old.json").write_text((tree / "versions.json").read_text())
    body = tree / "pr.md"
    r = bump(tree, "check", "--write", "--markdown", str(body), "--upstream", local_registry)
    assert r.returncode == 0, r.stderr
    assert f"now names {now[pinned['name']]}, pinned {pinned['base_image_digest']}" in r.stderr, r.stderr
    assert f"now names {now[unpinned['name']]}, pinned (none)" in r.stderr, r.stderr
    new = {x["name"]: x["base_image_digest"] for x in json.loads((tree / "versions.json").read_text())["matrix"]}
    assert new == now, new
    assert f"| `{pinned['name']}` | `{pinned['base_image']}` | `{pinned['base_image_digest']}` | `{now[pinned['name']]}` |" \
        in body.read_text(), body.read_text()
    assert bump(tree, "same-but-digests", str(tree / "old.json"), str(tree / "versions.json")).returncode == 0
    again = bump(tree, "check", "--write", "--markdown", str(body), "--upstream", local_registry)
    assert again.returncode == 0 and "now names" not in again.stderr and body.read_text() == "Nothing moves.\n", again.stderr
    resolved = bump(tree, "resolve", "--row", unpinned["name"], "--upstream", local_registry)
    assert resolved.stdout.strip() == now[unpinned["name"]], resolved.stderr


def test_a_change_beyond_the_digests_is_caught_and_an_unreachable_upstream_gets_one_line(tree):
    """The pull request job should refuse a versions.json that changes more than digests; no registry, one line and status 1."""
    old = tree / "old.json"
    old.write_text((tree / "versions.json").read_text())
    data = json.loads(old.read_text())
    data["matrix"][0]["torch"] = "9.9.9"
    (tree / "versions.json").write_text(json.dumps(data))
    r = bump(tree, "same-but-digests", str(old), str(tree / "versions.json"))
    assert r.returncode == 1 and "differs in more than base_image_digest" in r.stderr, r.stderr
    r = bump(tree, "check", "--upstream", "127.0.0.1:9")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "cannot reach the registry 127.0.0.1:9" in r.stderr, r.stderr
    # The release's setup: an unreachable registry leaves the unpinned row without a digest (its
    # build stops) and the pinned rows as they are.
    r = bump(tree, "bases", "--upstream", "127.0.0.1:9")
    out = json.loads(r.stdout)
    pinned, unpinned = data["matrix"][0], data["matrix"][1]
    assert r.returncode == 0 and out["first_use"] == [], r.stderr
    assert out["bases"] == {pinned["name"]: f"{pinned['base_image']}@{pinned['base_image_digest']}",
                            unpinned["name"]: unpinned["base_image"]}, out
    assert f"WARN {unpinned['name']}: no digest to trust on first use" in r.stderr, r.stderr


@pytest.mark.host
def test_make_base_bump_passes_its_variables_and_regenerates_on_write():
    """make base-bump WRITE=1 should run the check with --write and then make generate's script."""
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "base-bump", "WRITE=1", "UPSTREAM_REGISTRY=mirror.example:5000",
                          "BUMP_MARKDOWN=/tmp/b.md"], capture_output=True, text=True, timeout=60, check=False)
    assert "scripts/base_bump.py check --write --markdown '/tmp/b.md'" in dry.stdout, dry.stdout
    assert "--upstream 'mirror.example:5000'" in dry.stdout and "scripts/generate.py" in dry.stdout, dry.stdout


def test_the_release_builds_an_unpinned_row_on_the_digest_its_tag_names_and_pins_exactly_that(tree, local_registry):
    """bases should give pinned rows their pin and an unpinned one tag@digest (first use); pin writes that digest."""
    data = json.loads((tree / "versions.json").read_text())
    pinned, unpinned = data["matrix"][0], data["matrix"][1]
    repo, tag = unpinned["base_image"].split(":")
    digest = push_index(local_registry, repo, tag, "first")
    r = bump(tree, "bases", "--upstream", local_registry)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bases"][pinned["name"]] == f"{pinned['base_image']}@{pinned['base_image_digest']}", out
    assert out["bases"][unpinned["name"]] == f"{unpinned['base_image']}@{digest}", out
    assert out["first_use"] == [{"row": unpinned["name"], "digest": digest}], out
    push_index(local_registry, repo, tag, "moved")   # upstream moves after the build
    old = tree / "old.json"
    old.write_text((tree / "versions.json").read_text())
    assert bump(tree, "pin", "--row", unpinned["name"], "--digest", digest).returncode == 0
    rows = {x["name"]: x for x in json.loads((tree / "versions.json").read_text())["matrix"]}
    assert rows[unpinned["name"]]["base_image_digest"] == digest, "the digest built, not the tag's newer one"
    assert bump(tree, "same-but-digests", str(old), str(tree / "versions.json")).returncode == 0
    bad = bump(tree, "pin", "--row", unpinned["name"], "--digest", "latest")
    assert bad.returncode == 2 and "is not a sha256 digest" in bad.stderr, bad.stderr
