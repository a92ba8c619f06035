"""One row, two platforms: the arm64 image (IMAGE_REF, built under QEMU by `make arm64-emulated`)
beside the same row built for amd64 (IMAGE_REF_AMD64), published as one index.

Without IMAGE_REF_AMD64, or with an IMAGE_REF that is not arm64, these tests skip saying how to
get them: the default `make test` builds one platform.
"""
import io
import json
import os
import re
import shutil
import subprocess
import tarfile

import push  # scripts/ (conftest.py puts it on sys.path)
import pytest

RECORD = "/usr/share/team-image/versions.json"
# What may differ between a row's platforms: the platform itself and what its wheels hold.
PER_PLATFORM = {"platform", "cuda_arch_list"}
SAME_LABELS = ["org.opencontainers.image.version", "org.opencontainers.image.revision",
               *(f"team.{p}.version" for p in ("torch", "torchvision", "torchaudio", "cuda", "cudnn", "nccl", "python"))]


@pytest.fixture(scope="module")
def pair(docker_client, image_ref):
    """{"linux/amd64": image, "linux/arm64": image} of one row."""
    other = os.environ.get("IMAGE_REF_AMD64")
    arm = docker_client.images.get(image_ref)
    if not other or arm.attrs["Architecture"] != "arm64":
        pytest.skip("needs IMAGE_REF (an arm64 image) and IMAGE_REF_AMD64 (its row for amd64): "
                    "make arm64-emulated sets both")
    return {"linux/amd64": docker_client.images.get(other), "linux/arm64": arm}


def record(docker_client, image):
    """The image's /usr/share/team-image/versions.json, read without running anything (so no
    emulation is involved in reading it)."""
    container = docker_client.containers.create(image.id, command=["true"])
    try:
        stream, _ = container.get_archive(RECORD)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            return json.load(tar.extractfile(tar.getmembers()[0]))
    finally:
        container.remove(force=True)


def test_a_rows_platforms_pin_the_same_versions_and_each_names_its_own(docker_client, pair):
    """Both platforms of a row should hold the same torch, CUDA, cuDNN, NCCL and Python pins and the
    same labels, and each should record and be the platform it says."""
    records = {p: record(docker_client, image) for p, image in pair.items()}
    for platform, image in pair.items():
        assert records[platform]["platform"] == platform, records[platform]
        assert f"{image.attrs['Os']}/{image.attrs['Architecture']}" == platform
    same = {p: {k: v for k, v in r.items() if k not in PER_PLATFORM} for p, r in records.items()}
    assert same["linux/arm64"] == same["linux/amd64"], \
        f"the platforms' records differ beyond {sorted(PER_PLATFORM)}: {same}"
    labels = {p: {k: (i.labels or {}).get(k) for k in SAME_LABELS} for p, i in pair.items()}
    assert labels["linux/arm64"] == labels["linux/amd64"], "one commit and row, one set of labels"


def test_both_platforms_push_as_one_index_and_each_pulls_back_as_the_image_built(
        docker_client, pair, local_registry, tmp_path):
    """Pushed to a registry and joined into one index (as release.yml joins its native builds), each
    platform's entry should be the very image built (its config digest is the image id) and pull
    back, by the index digest, as that platform with the row's labels (push.py verify)."""
    try:
        push_join_and_verify(docker_client, pair, f"{local_registry}/team-dl")
    finally:
        # Two pushed images are about 7 GB of registry storage: not kept among pytest's last runs.
        shutil.rmtree(tmp_path / "registry-data", ignore_errors=True)


def push_join_and_verify(docker_client, pair, repo):
    """Push each platform's image to repo, join them into repo:multiarch, check the index."""
    refs = {}
    for platform, image in pair.items():
        refs[platform] = f"{repo}:multiarch-{platform.split('/')[1]}"
        image.tag(refs[platform])
        for line in docker_client.images.push(refs[platform], stream=True, decode=True):
            assert "error" not in line, f"push of {refs[platform]}: {line}"
        # Gone locally once pushed: push.py reads a pulled image's digest from its RepoDigests.
        docker_client.images.remove(refs[platform])
    manifest = ["/usr/bin/docker", "manifest"]
    subprocess.run([*manifest, "create", "--insecure", f"{repo}:multiarch", *refs.values()],
                   check=True, capture_output=True)
    pushed = subprocess.run([*manifest, "push", "--insecure", "--purge", f"{repo}:multiarch"],
                            check=True, capture_output=True, text=True).stdout
    digest = re.search(r"sha256:[0-9a-f]{64}", pushed).group(0)

    entries, is_index = push.ask_registry(f"{repo}@{digest}", insecure=True)
    assert is_index, f"{repo}@{digest} is no index"
    assert push.platforms(f"{repo}@{digest}", insecure=True) == sorted(pair)
    for entry in entries:
        p = entry["Descriptor"]["platform"]
        platform = f"{p['os']}/{p['architecture']}"
        config = entry["SchemaV2Manifest"]["config"]["digest"]
        assert config == pair[platform].id, f"the index's {platform} image is {config}, built {pair[platform].id}"

    amd = pair["linux/amd64"].labels
    expected = {k: amd[k] for k in (push.LABEL_VERSION, push.LABEL_REVISION)}
    labels = push.verify(repo, ["multiarch"], digest, None, expected, insecure=True)
    assert labels[push.LABEL_VERSION] == expected[push.LABEL_VERSION]
