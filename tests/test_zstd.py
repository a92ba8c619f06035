"""zstd tags: `make push ZSTD=1` publishes every tag also as <tag>-zstd (skopeo, zstd layers) to a
real registry on 127.0.0.1, and the result is read back: its layers are zstd, a client that reads
zstd (podman; Docker >= 23) pulls and runs it, and this host's Docker 20.10, which cannot unpack
zstd, is told so in one line by make pull instead of failing after the download.
"""
import json
import re
import subprocess
import uuid

import pytest
import requests
from conftest import require_tool
from test_publish import git, worktree  # noqa: F401 - worktree is a fixture used here
from test_pull import NAME, make, tiny_context

import docker

MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"


@pytest.fixture
def labelled_image(docker_client, worktree):  # noqa: F811 - the fixture imported above
    """The runnable tiny image, labelled as make push requires (built from worktree's HEAD)."""
    tag, sha = f"t{uuid.uuid4().hex[:10]}", git(worktree, "rev-parse", "--short=12", "HEAD")
    labels = {"org.opencontainers.image.version": tag, "org.opencontainers.image.revision": sha}
    image, _ = docker_client.images.build(fileobj=tiny_context(), custom_context=True, labels=labels,
                                          tag=f"{NAME}:{tag}", rm=True, pull=False)
    yield tag, sha
    try:
        docker_client.images.remove(image.id, force=True)
    except docker.errors.ImageNotFound:
        pass


def push_zstd(registry, worktree, tag, tmp_path, env=None):  # noqa: F811 - the fixture's value
    return make("push", f"REGISTRY={registry}", f"IMAGE={NAME}", f"TAG={tag}", "MOVING_TAGS=latest", "ZSTD=1",
                f"PUSH_WORKTREE={worktree}", f"PUBLISH_DIR={tmp_path / 'publish'}", env=env, timeout=600)


def layer_types(registry, tag):
    r = requests.get(f"http://{registry}/v2/{NAME}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES}, timeout=10)
    assert r.status_code == 200, f"{tag}: {r.status_code}"
    return {layer["mediaType"] for layer in r.json()["layers"]}


def test_push_zstd_publishes_every_tag_also_with_zstd_layers(local_registry, worktree, labelled_image,  # noqa: F811
                                                            tmp_path):
    """make push ZSTD=1 should push TAG, sha-<sha> and latest as before (gzip), and each again as
    <tag>-zstd whose layers are all zstd, at one digest recorded in the publish record."""
    tag, sha = labelled_image
    result = push_zstd(local_registry, worktree, tag, tmp_path)
    assert result.returncode == 0, f"make push ZSTD=1 failed:\n{result.stderr}"
    plain = [tag, f"sha-{sha}", "latest"]
    tags = requests.get(f"http://{local_registry}/v2/{NAME}/tags/list", timeout=10).json()["tags"]
    assert set(tags) == {*plain, *(t + "-zstd" for t in plain)}, f"registry holds {tags}"
    for t in plain:
        assert all(m.endswith("tar.gzip") for m in layer_types(local_registry, t)), layer_types(local_registry, t)
        assert layer_types(local_registry, t + "-zstd") == {"application/vnd.oci.image.layer.v1.tar+zstd"}, t
    record = json.loads((tmp_path / "publish" / f"{tag}.json").read_text())
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", record["zstd"]["digest"]) and record["zstd"]["level"] == 7, record


def test_zstd_tag_runs_under_podman_and_this_docker_is_told_in_one_line(local_registry, worktree,  # noqa: F811
                                                                        labelled_image, docker_client, tmp_path):
    """The -zstd tag should pull and run under podman; Docker before 23 (this host's 20.10 cannot
    unpack zstd) should be told by make pull to take the gzip tag, with nothing tagged."""
    tag, _ = labelled_image
    assert push_zstd(local_registry, worktree, tag, tmp_path).returncode == 0, "make push ZSTD=1 failed"
    ref = f"{local_registry}/{NAME}:{tag}-zstd"
    podman = [require_tool("podman", "podman"), "--runtime", "runc"]
    try:
        subprocess.run([*podman, "pull", "-q", "--tls-verify=false", ref], check=True, capture_output=True)
        # tests/test_podman.py says why the limits: podman's defaults exceed this host's hard limits.
        ran = subprocess.run([*podman, "run", "--rm", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                              ref], capture_output=True, text=True, check=False)
        assert ran.returncode == 0 and "tini version" in ran.stdout, f"podman run {ref}:\n{ran.stderr}"
    finally:
        subprocess.run([*podman, "rmi", "-f", ref], capture_output=True, check=False)
    major = int(docker_client.version()["Version"].split(".")[0])
    pulled = make("pull", f"REGISTRY={local_registry}", f"IMAGE={NAME}", f"TAG={tag}-zstd")
    if major >= 23:
        assert pulled.returncode == 0, f"Docker {major} should read zstd:\n{pulled.stderr}"
        return
    assert pulled.returncode != 0 and "has zstd layers" in pulled.stderr and "gzip tag" in pulled.stderr, \
        pulled.stderr
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(ref)


def test_push_zstd_without_skopeo_refuses_before_pushing_anything(local_registry, worktree,  # noqa: F811
                                                                   labelled_image, tmp_path):
    """make push ZSTD=1 on a host without skopeo should refuse, naming the package, and push nothing."""
    tag, _ = labelled_image
    result = push_zstd(local_registry, worktree, tag, tmp_path, env={"SKOPEO": str(tmp_path / "no-skopeo")})
    assert result.returncode != 0 and "apt-get install skopeo" in result.stderr, result.stderr
    tags = requests.get(f"http://{local_registry}/v2/{NAME}/tags/list", timeout=10)
    assert tags.status_code == 404 or not tags.json().get("tags"), f"pushed anyway: {tags.text}"


def test_release_publishes_every_tag_also_as_zstd_signed_at_the_makefiles_level():
    """release.yml should build each platform again with zstd layers at the Makefile's ZSTD_LEVEL,
    join, sign and verify that index too, and hand it to publish-digest.sh, which tags it <tag>-zstd
    (in the publish job and in a release's promotion)."""
    from test_publish import ROOT, load_workflow
    wf = load_workflow(ROOT / ".github" / "workflows" / "release.yml")
    level = re.search(r"^ZSTD_LEVEL\s*\?=\s*(\d+)", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1)
    assert str(wf["env"]["ZSTD_LEVEL"]) == level, f"release.yml ZSTD_LEVEL {wf['env']['ZSTD_LEVEL']}, Makefile {level}"
    builds = [s for s in wf["jobs"]["build"]["steps"] if "build-push-action" in s.get("uses", "")]
    zstd = [s for s in builds if "compression=zstd" in s["with"]["outputs"]]
    gzip = [s for s in builds if "compression=" not in s["with"]["outputs"]]
    assert len(gzip) == 1 and len(zstd) == 1, f"want one gzip and one zstd build: {[b['with']['outputs'] for b in builds]}"
    assert "compression-level=${{ env.ZSTD_LEVEL }}" in zstd[0]["with"]["outputs"] \
        and "force-compression=true" in zstd[0]["with"]["outputs"], zstd[0]["with"]["outputs"]
    for job in ("publish", "promote"):
        steps = wf["jobs"][job]["steps"]
        runs = "\n".join(s.get("run", "") for s in steps)
        tag = next(s for s in steps if "publish-digest.sh" in s.get("run", ""))
        assert '"$ROW" "$ZSTD_DIGEST"' in tag["run"] and "ZSTD_DIGEST" in tag["env"], f"{job}: {tag}"
        assert re.search(r'for d in "\$DIGEST" "\$ZSTD_DIGEST"[ "$A-Z_]*; do', runs), f"{job}: the zstd digest's signature is not checked"
    script = (ROOT / "scripts" / "publish-digest.sh").read_text()
    assert 'publish "$zstd_digest" -zstd' in script, "publish-digest.sh does not tag the zstd digest <tag>-zstd"
