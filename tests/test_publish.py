"""Publishing: `make push` against a real local registry (Debian's docker-registry on 127.0.0.1),
the tag scheme from versions.json, and `make manifest`.

Pushing the ~6 GB image on every run would take minutes, so the push tests publish a tiny image
(FROM scratch, one small file) with the same label keys; the script cannot tell the difference,
and the tests do not depend on which base built the image under test.
"""
import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import tarfile
import uuid

import build_info  # the one place tags, the git sha and build args come from
import pytest
import requests
import versions
import yaml
from conftest import require_tool, version_row

import docker

ROOT = pathlib.Path(__file__).resolve().parent.parent
NAME = "team-dl-pushtest"
# The tiny test image: no base image at all, so no test here needs the stand-in or nvidia/cuda.
TINY_DOCKERFILE = "FROM scratch\nCOPY payload /payload\n"
ACCEPT = ("application/vnd.docker.distribution.manifest.v2+json, "
          "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json")
# What `make test` passes down (its command line travels in MAKEFLAGS, some variables are
# exported) would leak into the nested make runs.
LEAKY = ("BASE_IMAGE", "PYTHON_VERSION", "IMAGE", "TAG", "REGISTRY", "FORCE", "ROW", "MOVING_TAGS",
         "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def make(*args):
    env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    env["DOCKER"] = "/usr/bin/docker"
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True,
                          text=True, env=env, check=False, timeout=600)


def git(repo, *args):
    return subprocess.run([require_tool("git", "git"), "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def worktree(tmp_path):
    """A clean git work tree with one commit, standing in for the checkout the image came from."""
    repo = tmp_path / "src"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "Dockerfile").write_text(TINY_DOCKERFILE)
    git(repo, "add", "Dockerfile")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "x")
    return repo


@pytest.fixture
def tiny_image(docker_client):
    """Factory: tiny_image(tag, revision) builds NAME:tag labelled like a real build.
    Each call makes a distinct image (a nonce label); all are removed afterwards."""
    made = []

    def build(tag, revision):
        labels = {
            "org.opencontainers.image.version": tag,
            "org.opencontainers.image.revision": revision,
            "org.opencontainers.image.title": "team-dl",
            "team.torch.version": "2.6.0",
            "team.test.nonce": uuid.uuid4().hex,
        }
        image, _ = docker_client.images.build(
            fileobj=tiny_context(), custom_context=True, labels=labels,
            tag=f"{NAME}:{tag}", rm=True, pull=False)
        made.append(image.id)
        return image

    yield build
    for image_id in made:
        try:
            docker_client.images.remove(image_id, force=True)
        except docker.errors.ImageNotFound:
            pass


def tiny_context():
    """A build context (tar) with TINY_DOCKERFILE and its one file: an image of a few bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("Dockerfile", TINY_DOCKERFILE.encode()), ("payload", b"team-dl push test\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def registry_digest(registry, tag):
    """The digest the registry itself serves for NAME:tag (None when the tag is absent)."""
    r = requests.head(f"http://{registry}/v2/{NAME}/manifests/{tag}",
                      headers={"Accept": ACCEPT}, timeout=10)
    return r.headers.get("Docker-Content-Digest") if r.status_code == 200 else None


def registry_tags(registry):
    r = requests.get(f"http://{registry}/v2/{NAME}/tags/list", timeout=10)
    return set(r.json().get("tags") or []) if r.status_code == 200 else set()


def push(registry, worktree, tag, tmp_path, *extra):
    return make("push", f"REGISTRY={registry}", f"IMAGE={NAME}", f"TAG={tag}",
                "MOVING_TAGS=2.6 latest", f"PUSH_WORKTREE={worktree}",
                f"PUBLISH_DIR={tmp_path / 'publish'}", *extra)


def new_tag():
    return f"2.6.0-cuda12.4-cudnn9-py3.11-runtime-t{uuid.uuid4().hex[:8]}"


def test_push_publishes_every_tag_and_verifies_by_digest(local_registry, worktree, tiny_image,
                                                         tmp_path):
    """make push should publish TAG, sha-<sha>, 2.6 and latest at one digest and record it."""
    tag, sha = new_tag(), git(worktree, "rev-parse", "--short=12", "HEAD")
    image = tiny_image(tag, sha)
    result = push(local_registry, worktree, tag, tmp_path)
    assert result.returncode == 0, f"make push failed:\n{result.stdout}\n{result.stderr}"
    match = re.search(rf"^{re.escape(local_registry)}/{NAME}@(sha256:[0-9a-f]{{64}})$",
                      result.stdout, re.MULTILINE)
    assert match, f"make push printed no repo@digest line:\n{result.stdout}"
    digest = match.group(1)
    tags = {tag, f"sha-{sha}", "2.6", "latest"}
    assert registry_tags(local_registry) == tags, f"registry holds {registry_tags(local_registry)}"
    for t in tags:
        assert registry_digest(local_registry, t) == digest, f"{t} is not at {digest}"
    assert "verified" in result.stderr, f"no verification logged:\n{result.stderr}"
    record = json.loads((tmp_path / "publish" / f"{tag}.json").read_text())
    assert record["digest"] == digest, f"record names {record['digest']}, pushed {digest}"
    assert record["image_id"] == image.id, f"record names {record['image_id']}, built {image.id}"
    assert record["labels"]["team.torch.version"] == "2.6.0", f"labels missing: {record['labels']}"


def test_push_of_another_row_gives_its_sha_tag_the_row_name(local_registry, worktree, tiny_image,
                                                             tmp_path):
    """make push ROW=<not the default> should push sha-<sha>-<row>, never the default row's sha-<sha>:
    every row is built from one commit, and one row's push must not take another's tag."""
    other = next(r for r in VERSIONS["matrix"] if r["name"] != VERSIONS["default"])
    tag, sha = new_tag(), git(worktree, "rev-parse", "--short=12", "HEAD")
    tiny_image(tag, sha)
    result = push(local_registry, worktree, tag, tmp_path, f"ROW={other['name']}")
    assert result.returncode == 0, f"make push ROW={other['name']} failed:\n{result.stderr}"
    assert registry_tags(local_registry) == {tag, f"sha-{sha}-{other['name']}", "2.6", "latest"}, (
        f"registry holds {registry_tags(local_registry)}")


VERSIONS = json.loads((ROOT / "versions.json").read_text())
EVENTS = [("push", "refs/tags/v1.2.0"), ("push", "refs/heads/main"), ("schedule", "refs/heads/main")]


@pytest.mark.parametrize(("event", "ref"), EVENTS, ids=["release", "main", "weekly"])
def test_every_row_publishes_its_own_tags_naming_its_torch_and_cuda(event, ref):
    """The release workflow publishes every versions.json row (a matrix entry each): no tag may
    be pushed by two rows, and each row's descriptive tag names that row's torch and CUDA."""
    seen = {}
    for r in VERSIONS["matrix"]:
        out = subprocess.run(
            ["python3", "scripts/build_info.py", "ci-tags", "--row", r["name"], "--event", event, "--ref", ref,
             "--sha", "abc", "--date", "20261207"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
        got = dict(line.split("=", 1) for line in out.splitlines())
        for t in got["immutable"].split() + got["moving"].split():
            assert t not in seen, f"{event} {ref}: rows {seen[t]} and {r['name']} both push {t!r}"
            seen[t] = r["name"]
        descriptive = build_info.tag(r)
        assert descriptive.startswith(f"{r['torch']}-cuda{r['cuda']}-"), f"{r['name']}: tag {descriptive}"
    matrix = json.loads(subprocess.run(["python3", "scripts/versions.py", "matrix"], cwd=ROOT, check=True,
                                       capture_output=True, text=True).stdout)
    assert matrix["row"] == [r["name"] for r in VERSIONS["matrix"]], f"the CI matrix misses rows: {matrix}"


def test_release_promotes_and_smoke_tests_each_rows_own_images():
    """The promote job should look up the digest main pushed for *its* row (build_info.py sha-tag),
    and every publishing job should run once per row (the versions.py matrix)."""
    wf = load_workflow(ROOT / ".github" / "workflows" / "release.yml")
    for job in ("publish", "promote", "gpu-smoke"):
        assert "needs.setup.outputs.matrix" in str(wf["jobs"][job]["strategy"]["matrix"]), f"{job}: not per row"
    runs = "\n".join(s.get("run", "") for s in wf["jobs"]["promote"]["steps"])
    assert "build_info.py sha-tag --row" in runs and ":sha-$SHA\"" not in runs, (
        "promote must find the row's own sha tag, not the default row's sha-<sha>")


def test_push_refuses_a_dirty_work_tree(local_registry, worktree, tiny_image, tmp_path):
    """make push should refuse, pushing nothing, when the work tree has uncommitted files."""
    tag = new_tag()
    tiny_image(tag, git(worktree, "rev-parse", "--short=12", "HEAD"))
    (worktree / "uncommitted.txt").write_text("not in the commit\n")
    result = push(local_registry, worktree, tag, tmp_path)
    assert result.returncode != 0, f"make push accepted a dirty tree:\n{result.stderr}"
    assert "dirty" in result.stderr and "uncommitted.txt" in result.stderr, \
        f"refusal does not name the problem:\n{result.stderr}"
    assert registry_tags(local_registry) == set(), "something was pushed despite the refusal"


def test_push_refuses_an_image_built_from_another_commit(local_registry, worktree, tiny_image,
                                                         tmp_path):
    """make push should refuse an image whose revision label is not the work tree's HEAD."""
    tag = new_tag()
    tiny_image(tag, "0123456789ab")
    result = push(local_registry, worktree, tag, tmp_path)
    assert result.returncode != 0, f"make push accepted a stale image:\n{result.stderr}"
    assert "rebuild" in result.stderr, f"refusal gives no fix:\n{result.stderr}"
    assert registry_tags(local_registry) == set(), "something was pushed despite the refusal"


def test_push_refuses_to_move_an_immutable_tag(local_registry, worktree, tiny_image, tmp_path):
    """make push should refuse to point an existing immutable tag at a different image."""
    tag, sha = new_tag(), git(worktree, "rev-parse", "--short=12", "HEAD")
    tiny_image(tag, sha)
    first = push(local_registry, worktree, tag, tmp_path)
    assert first.returncode == 0, f"first push failed:\n{first.stderr}"
    before = {t: registry_digest(local_registry, t) for t in (tag, f"sha-{sha}", "latest")}
    tiny_image(tag, sha)  # same tag and commit, different image
    second = push(local_registry, worktree, tag, tmp_path)
    assert second.returncode != 0, f"an immutable tag was overwritten:\n{second.stderr}"
    assert "immutable" in second.stderr and "FORCE=1" in second.stderr, \
        f"refusal does not explain itself:\n{second.stderr}"
    after = {t: registry_digest(local_registry, t) for t in before}
    assert after == before, f"tags moved despite the refusal: {before} -> {after}"


def test_push_with_force_replaces_an_immutable_tag(local_registry, worktree, tiny_image, tmp_path):
    """make push FORCE=1 should replace an immutable tag and say so."""
    tag, sha = new_tag(), git(worktree, "rev-parse", "--short=12", "HEAD")
    tiny_image(tag, sha)
    assert push(local_registry, worktree, tag, tmp_path).returncode == 0, "first push failed"
    old = registry_digest(local_registry, tag)
    tiny_image(tag, sha)
    forced = push(local_registry, worktree, tag, tmp_path, "FORCE=1")
    assert forced.returncode == 0, f"forced push failed:\n{forced.stderr}"
    assert "WARN" in forced.stderr and "FORCE" in forced.stderr, \
        f"the override was not logged:\n{forced.stderr}"
    new = registry_digest(local_registry, tag)
    assert new and new != old, f"{tag} still at {old} after FORCE=1"


def test_push_of_the_same_image_again_is_allowed(local_registry, worktree, tiny_image, tmp_path):
    """make push should accept re-publishing the very same image (the tags do not move)."""
    tag = new_tag()
    tiny_image(tag, git(worktree, "rev-parse", "--short=12", "HEAD"))
    assert push(local_registry, worktree, tag, tmp_path).returncode == 0, "first push failed"
    old = registry_digest(local_registry, tag)
    again = push(local_registry, worktree, tag, tmp_path)
    assert again.returncode == 0, f"re-pushing the same image was refused:\n{again.stderr}"
    assert registry_digest(local_registry, tag) == old, "the digest changed on a re-push"


def test_push_refuses_without_a_registry(worktree):
    """make push with no REGISTRY should refuse and say how to set it."""
    result = make("push", "REGISTRY=", f"PUSH_WORKTREE={worktree}")
    assert result.returncode != 0, f"make push without REGISTRY did not fail:\n{result.stderr}"
    assert "set REGISTRY" in result.stderr, f"no hint about REGISTRY:\n{result.stderr}"


@pytest.mark.parametrize(("row", "python", "tag"), [
    ({"torch": "2.6.0", "cuda": "12.4", "cudnn": "9.1", "python": "3.10"}, None,
     "2.6.0-cuda12.4-cudnn9-py3.10-runtime"),
    ({"torch": "2.7.1", "cuda": "12.8", "cudnn": "9.7.1", "python": "3.10"}, "3.11",
     "2.7.1-cuda12.8-cudnn9-py3.11-runtime"),
])
def test_descriptive_tag_names_torch_cuda_cudnn_major_and_python(row, python, tag):
    """build_info.tag should spell <torch>-cuda<cuda>-cudnn<major>-py<python>-runtime."""
    assert build_info.tag(row, python) == tag, f"tag of {row} (python {python}) should be {tag}"


def test_git_sha_is_twelve_hex_digits_and_says_dirty(worktree):
    """build_info.git_sha should be HEAD's 12-digit sha, with -dirty once a tracked file changes."""
    head = git(worktree, "rev-parse", "HEAD")
    assert build_info.git_sha(worktree) == head[:12], f"clean tree: not {head[:12]}"
    (worktree / "untracked.txt").write_text("git does not track this\n")
    assert build_info.git_sha(worktree) == head[:12], "an untracked file should not make it dirty"
    (worktree / "Dockerfile").write_text(TINY_DOCKERFILE + "# edited\n")
    assert build_info.git_sha(worktree) == head[:12] + "-dirty", "an edited tracked file should"


def test_make_build_platform_builds_one_the_row_publishes_and_refuses_others():
    """make build PLATFORM=linux/arm64 should hand docker build --platform for a row that publishes
    arm64 (the Blackwell row), and refuse before building for one that does not (the default row,
    whose torch has no CUDA wheels for aarch64), naming the fix."""
    blackwell = next(r["name"] for r in VERSIONS["matrix"] if "linux/arm64" in r["platforms"])
    dry = make("-n", "build", f"ROW={blackwell}", "PLATFORM=linux/arm64", "PREFLIGHT=0")
    assert dry.returncode == 0, dry.stderr
    words = shlex.split(dry.stdout.replace("\\\n", " "))  # as the shell reads it (values are quoted)
    assert ["--platform", "linux/arm64"] in [words[i:i + 2] for i in range(len(words))], \
        f"no --platform in make build:\n{dry.stdout}"
    refused = make("build", "PLATFORM=linux/arm64", "PREFLIGHT=0", "IMAGE=never-built")
    assert refused.returncode != 0, f"make build PLATFORM=linux/arm64 ran for the default row:\n{refused.stdout}"
    assert f"row {VERSIONS['default']} publishes linux/amd64, not linux/arm64" in refused.stderr, refused.stderr
    assert "docker build" not in refused.stdout and "Fix: PLATFORM=linux/amd64" in refused.stderr, refused.stderr


def test_make_build_and_tags_pass_what_build_info_computes():
    """make build should pass build_info's build args, with make's overrides; make tags its tags."""
    result = make("-n", "build", "PYTHON_VERSION=3.11", "BASE_IMAGE=example/base:1", "TAG=t1")
    assert result.returncode == 0, f"make -n build failed:\n{result.stderr}"
    # Read the command as the shell does: values may be quoted (NVIDIA_REQUIRE_CUDA has '>').
    words = shlex.split(result.stdout.replace("\\\n", " "))
    from_make = dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--build-arg")
    expected = build_info.build_args(versions.row(), "3.11", "example/base:1", "t1")
    assert from_make == expected, f"make build passes {from_make}, build_info says {expected}"
    tags = make("tags", "PYTHON_VERSION=3.10")
    assert tags.returncode == 0, f"make tags failed:\n{tags.stderr}"
    row = versions.row()  # make runs here without $ROW: the default row
    want = [build_info.tag(row, "3.10"), f"sha-{build_info.git_sha()}", *row["moving_tags"]]
    assert tags.stdout.split() == want, f"make tags printed {tags.stdout.split()}, not {want}"


def test_make_help_has_no_colour_codes_when_not_on_a_terminal():
    """make help piped into a file or another program should print plain text (colour only on a tty)."""
    result = make("help")
    assert result.returncode == 0 and "build" in result.stdout, f"make help failed:\n{result.stderr}"
    assert "\033[" not in result.stdout, f"escape codes in piped output: {result.stdout[:200]!r}"


def test_manifest_lists_packages_versions_labels_and_digest(image_ref, image, tmp_path):
    """make manifest should write the image's pip freeze, dpkg list, versions, labels, digest."""
    tag = image_ref.rsplit(":", 1)[1]
    # A publish record as make push leaves it: the manifest should name the pushed digest.
    pushed = f"127.0.0.1:5000/team-dl@sha256:{'a' * 64}"
    (tmp_path / f"{tag}.json").write_text(json.dumps(
        {"repository": pushed.split("@")[0], "digest": pushed.split("@")[1], "image_id": image.id}))
    result = make("manifest", f"REF={image_ref}", f"TAG={tag}", f"PUBLISH_DIR={tmp_path}")
    assert result.returncode == 0, f"make manifest failed:\n{result.stderr}"
    data = json.loads((tmp_path / f"{tag}.manifest.json").read_text())
    torch_version = version_row()["torch"]  # versions.json, not spelled out here
    assert any(p.startswith(f"torch=={torch_version}") for p in data["pip"]), "torch missing from pip list"
    assert any(p.startswith("openssh-server=") for p in data["dpkg"]), "sshd missing from dpkg"
    assert data["versions"]["torch"] == torch_version, f"versions.json says {data['versions']}"
    assert data["labels"] == image.labels, "manifest labels differ from the image's"
    assert pushed in data["repo_digests"], f"pushed digest missing: {data['repo_digests']}"
    arch = image.attrs["Architecture"]  # one platform's image: the manifest and the record name it
    assert data["platform"] == data["versions"]["platform"] == f"linux/{arch}", \
        f"the manifest names platform {data.get('platform')}, the record {data['versions'].get('platform')}, the image is {arch}"
    md = (tmp_path / f"{tag}.manifest.md").read_text()
    assert f"torch=={torch_version}" in md and image.id in md, "markdown manifest lacks torch or the id"


@pytest.mark.parametrize(("event", "ref", "immutable", "moving"), [
    ("push", "refs/tags/v1.2.0", ["{tag}"], ["2.6", "latest"]),
    ("push", "refs/heads/main", ["sha-abc"], ["main"]),
    ("schedule", "refs/heads/main", ["{tag}-20261207"], ["2.6", "latest"]),
])
def test_release_workflow_tags_follow_the_event(event, ref, immutable, moving):
    """A release promotes main's build to the descriptive tag; main pushes sha-; weekly a dated tag."""
    tag = build_info.tag(version_row())
    out = subprocess.run(
        ["python3", "scripts/build_info.py", "ci-tags", "--event", event, "--ref", ref,
         "--sha", "abc", "--date", "20261207"], cwd=ROOT, check=True, capture_output=True,
        text=True).stdout
    got = dict(line.split("=", 1) for line in out.splitlines())
    assert got["immutable"].split() == [t.format(tag=tag) for t in immutable], f"{event} {ref}: {got}"
    assert got["moving"].split() == moving, f"{event} {ref}: {got}"


def push_script(*args, env=None):
    return subprocess.run(["python3", str(ROOT / "scripts" / "push.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=300,
                          env=dict(os.environ, DOCKER="/usr/bin/docker", **(env or {})))


def test_verify_checks_every_tag_the_digest_and_the_expected_labels(local_registry, worktree,
                                                                    tiny_image, tmp_path):
    """push.py verify (the release workflow's check) should pass only for the true digest and labels."""
    tag, sha = new_tag(), git(worktree, "rev-parse", "--short=12", "HEAD")
    tiny_image(tag, sha)
    assert push(local_registry, worktree, tag, tmp_path).returncode == 0, "push failed"
    digest = registry_digest(local_registry, tag)
    common = ["verify", "--repository", f"{local_registry}/{NAME}", "--tag", tag,
              "--moving", "2.6 latest", "--worktree", str(worktree), "--record", str(tmp_path)]
    good = push_script(*common, "--digest", digest,
                       "--label", f"org.opencontainers.image.version={tag}")
    assert good.returncode == 0, f"verify rejected a correct publish:\n{good.stderr}"
    bad_label = push_script(*common, "--digest", digest, "--label", "team.torch.version=2.5.1")
    assert bad_label.returncode != 0 and "labels differ" in bad_label.stderr, \
        f"verify accepted a wrong label:\n{bad_label.stderr}"
    moved = push_script(*common, "--digest", "sha256:" + "0" * 64)
    assert moved.returncode != 0, f"verify accepted a digest the registry never had:\n{moved.stderr}"


def test_verify_checks_each_platforms_image_of_a_multi_platform_index(local_registry, worktree, docker_client,
                                                                     tmp_path):
    """push.py verify on an index (the release workflow's joined amd64+arm64 image) should pull and
    check every platform's image, and refuse, naming the platform, when one has wrong labels."""
    sha, repo = git(worktree, "rev-parse", "--short=12", "HEAD"), f"{local_registry}/{NAME}"
    tag, made = new_tag(), []

    def index(arm_version):
        """repo:<name> an index of an amd64 and an arm64 image (FROM scratch: builds for any CPU)."""
        name = new_tag()
        refs = []
        for platform, version in (("linux/amd64", tag), ("linux/arm64", arm_version)):
            ref = f"{repo}:{name}-{platform.split('/')[1]}"
            labels = {"org.opencontainers.image.version": version, "org.opencontainers.image.revision": sha,
                      "team.test.nonce": uuid.uuid4().hex}
            # --no-cache: the classic builder's cache would hand the arm64 build the amd64 layer's image.
            label_args = [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]
            subprocess.run(["/usr/bin/docker", "build", "-q", "--no-cache", "--platform", platform, *label_args,
                            "-t", ref, "-"],
                           input=tiny_context().read(), check=True, capture_output=True,
                           env=dict(os.environ, DOCKER_BUILDKIT="0"))
            made.append(ref)
            docker_client.images.push(ref)
            # Gone locally once pushed: without buildx, push.py reads a tag's digest from the
            # RepoDigests of its pull, which would also list this image's own push digest.
            docker_client.images.remove(ref, force=True)
            refs.append(ref)
        docker = ["/usr/bin/docker", "manifest"]
        subprocess.run([*docker, "create", "--insecure", f"{repo}:{name}", *refs], check=True, capture_output=True)
        out = subprocess.run([*docker, "push", "--insecure", "--purge", f"{repo}:{name}"], check=True,
                             capture_output=True, text=True).stdout
        return name, re.search(r"sha256:[0-9a-f]{64}", out).group(0)

    def verify(name, digest):
        return push_script("verify", "--repository", repo, "--tag", name, "--no-sha-tag", "--digest", digest,
                           "--worktree", str(worktree), "--record", str(tmp_path),
                           "--label", f"org.opencontainers.image.version={tag}")
    try:
        good = verify(*index(tag))
        assert good.returncode == 0, f"verify rejected a correct two-platform index:\n{good.stderr}"
        assert "for linux/arm64" in good.stderr and "for linux/amd64" in good.stderr, good.stderr
        bad = verify(*index("0.0.0-wrong"))
        assert bad.returncode != 0 and "linux/arm64 labels differ" in bad.stderr, \
            f"verify accepted an index whose arm64 image is labelled wrong:\n{bad.stderr}"
    finally:
        for ref in made:
            try:
                docker_client.images.remove(ref, force=True)
            except docker.errors.ImageNotFound:
                pass


def test_preflight_refuses_an_existing_immutable_tag_before_any_build(local_registry, worktree,
                                                                       tiny_image, tmp_path):
    """push.py preflight (no local image) should refuse an existing immutable tag unless it
    already names the digest to be tagged, or FORCE=1."""
    tag = new_tag()
    tiny_image(tag, git(worktree, "rev-parse", "--short=12", "HEAD"))
    assert push(local_registry, worktree, tag, tmp_path).returncode == 0, "push failed"
    common = ["preflight", "--repository", f"{local_registry}/{NAME}", "--no-sha-tag",
              "--worktree", str(worktree)]
    taken = push_script(*common, "--tag", tag)
    assert taken.returncode != 0 and "already exists" in taken.stderr, \
        f"preflight let a rebuild replace {tag}:\n{taken.stderr}"
    forced = push_script(*common, "--tag", tag, env={"FORCE": "1"})
    assert forced.returncode == 0, f"preflight ignored FORCE=1:\n{forced.stderr}"
    fresh = push_script(*common, "--tag", new_tag())
    assert fresh.returncode == 0, f"preflight refused a new tag:\n{fresh.stderr}"
    same = push_script(*common, "--tag", tag, "--digest", registry_digest(local_registry, tag))
    assert same.returncode == 0, f"preflight refused re-tagging the same digest:\n{same.stderr}"
    other = push_script(*common, "--tag", tag, "--digest", "sha256:" + "1" * 64)
    assert other.returncode != 0, f"preflight let {tag} move to another digest:\n{other.stderr}"


WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def load_workflow(path):
    # YAML 1.1 reads the bare key `on` as True.
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))
    return data


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_actions_are_pinned_by_commit_sha_with_version(path):
    """Every third-party action should be pinned to a full commit SHA with `# vX.Y.Z` after it."""
    uses = re.findall(r"^\s*(?:-\s*)?uses:\s*(\S+)(.*)$", path.read_text(), re.MULTILINE)
    assert uses, f"{path.name} uses no actions?"
    for ref, rest in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{path.name}: {ref} not SHA-pinned"
        assert re.match(r"\s+# v\d+\.\d+\.\d+", rest), f"{path.name}: {ref} has no version comment"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflows_grant_nothing_by_default_and_cancel_superseded_runs(path):
    """Workflows should start from `permissions: {}`, grant per job, and set concurrency."""
    wf = load_workflow(path)
    assert wf.get("permissions") == {}, f"{path.name}: top-level permissions {wf.get('permissions')}"
    for name, job in wf["jobs"].items():
        assert "permissions" in job, f"{path.name}: job {name} has no explicit permissions"
        assert "write-all" not in str(job["permissions"]), f"{path.name}: {name} grants write-all"
    assert "cancel-in-progress" in wf.get("concurrency", {}), f"{path.name}: no concurrency"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflows_copy_no_versions_by_hand(path):
    """Workflows should read versions from versions.json, never spell torch/CUDA versions."""
    text = path.read_text()
    data = json.loads((ROOT / "versions.json").read_text())
    for row in data["matrix"]:
        for key in ("torch", "cuda_full", "base_image"):
            assert row[key] not in text, f"{path.name} spells {key}={row[key]} by hand"
    assert any(reader in text for reader in ("scripts/versions.py", "scripts/build_info.py", "make base-bump")), \
        f"{path.name} does not read versions.json"  # make base-bump: scripts/base_bump.py reads it


def test_release_workflow_signs_scans_attests_and_rebuilds_weekly():
    """release.yml should push with SBOM/provenance, scan, sign and verify, and run weekly."""
    wf = load_workflow(ROOT / ".github" / "workflows" / "release.yml")
    assert "schedule" in wf["on"] and "tags" in wf["on"]["push"], f"triggers: {wf['on']}"
    steps = wf["jobs"]["build"]["steps"]
    build = next(s for s in steps if "build-push-action" in s.get("uses", ""))
    assert build["with"]["sbom"] is True and "mode=max" in build["with"]["provenance"], \
        f"no SBOM/provenance: {build['with']}"
    assert "type=registry" in build["with"]["cache-from"], "no registry cache"
    # The scanner writes its JSON report; the CVE policy's gate (scripts/cve_gate.py, SECURITY.md)
    # fails the build on fixable CRITICAL/HIGH findings not allowlisted, so the action does not.
    at = next(i for i, s in enumerate(steps) if "scan-action" in s.get("uses", ""))
    scan = steps[at]
    assert scan["with"].get("output-format") == "json" and scan["with"].get("output-file") == "scan.json", \
        f"the scan writes no JSON report for the gate: {scan['with']}"
    gate = next((s.get("run", "") for s in steps[at + 1:] if "scripts/cve_gate.py gate scan.json" in s.get("run", "")), "")
    assert gate and "--report-only" not in gate, f"the scan does not gate the build:\n{gate}"
    runs = "\n".join(s.get("run", "") for s in wf["jobs"]["publish"]["steps"])
    assert "cosign sign" in runs and "cosign verify" in runs, "no keyless sign + verify"
    assert wf["jobs"]["publish"]["permissions"].get("id-token") == "write", "keyless needs id-token"
    promote = wf["jobs"]["promote"]["steps"]
    assert not any("build-push-action" in st.get("uses", "") for st in promote), \
        "a release must promote main's digest, not rebuild"
    assert "cosign verify" in "\n".join(st.get("run", "") for st in promote), \
        "promotion does not check main's signature"
    for job in ("publish", "promote"):
        runs = [st.get("run", "") for st in wf["jobs"][job]["steps"]]
        assert sum("scripts/publish-digest.sh" in r for r in runs) == 1, \
            f"{job} should tag and verify its digest with the one script, publish-digest.sh"


def test_release_builds_each_platform_natively_and_signs_the_joined_index():
    """release.yml should build every row's platforms each on a runner of its CPU (versions.py
    builds), push each by digest, join a row's digests into one index (join_index.py) and sign,
    verify and tag that index's digest, not one platform's."""
    wf = load_workflow(ROOT / ".github" / "workflows" / "release.yml")
    build = wf["jobs"]["build"]
    assert "needs.setup.outputs.builds" in str(build["strategy"]["matrix"]), build["strategy"]
    assert build["runs-on"] == "${{ matrix.runner }}", f"not native: {build['runs-on']}"
    push = next(s for s in build["steps"] if "build-push-action" in s.get("uses", ""))
    assert push["with"]["platforms"] == "${{ matrix.platform }}", push["with"]
    assert "push-by-digest=true" in push["with"]["outputs"], push["with"]["outputs"]
    assert "matrix.arch" in push["with"]["cache-to"], "platforms would share one cache tag"
    assert not any("setup-qemu-action" in s.get("uses", "") for s in build["steps"]), "emulated"
    steps = wf["jobs"]["publish"]["steps"]
    runs = [s.get("run", "") for s in steps]
    join = next(i for i, r in enumerate(runs) if "scripts/join_index.py" in r)
    sign = next(i for i, r in enumerate(runs) if "cosign sign" in r)
    tag = next(i for i, r in enumerate(runs) if "publish-digest.sh" in r)
    assert join < sign < tag, "the index must be joined, then signed, then tagged"
    for i in (sign, tag):
        assert steps[i]["env"]["DIGEST"] == "${{ steps.join.outputs.digest }}", steps[i]["env"]
    download = next(s for s in steps if "download-artifact" in s.get("uses", ""))
    assert download["with"]["pattern"] == "digest-${{ matrix.row }}-*", download["with"]


def test_dependabot_watches_docker_actions_and_pip():
    """dependabot.yml should update the base image, the pinned actions and pip requirements."""
    config = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    ecosystems = {u["package-ecosystem"] for u in config["updates"]}
    assert {"docker", "github-actions", "pip"} <= ecosystems, f"dependabot covers {ecosystems}"


@pytest.mark.parametrize("row", [r["name"] for r in VERSIONS["matrix"]])
def test_a_row_without_a_pinned_base_is_refused_by_mirror_base_and_the_release(row):
    """A row whose base digest is not known (none was made up) must stop make mirror-base and
    the release workflow's check, naming the base; a pinned row passes that check."""
    r = next(x for x in VERSIONS["matrix"] if x["name"] == row)
    check = subprocess.run(["python3", "scripts/versions.py", "base-image", "--row", row, "--require-digest"],
                           cwd=ROOT, capture_output=True, text=True, check=False)
    if re.fullmatch(r"sha256:[0-9a-f]{64}", r.get("base_image_digest", "")):
        assert check.returncode == 0 and check.stdout.strip() == f"{r['base_image']}@{r['base_image_digest']}"
        return
    assert check.returncode != 0 and r["base_image"] in check.stderr, f"release check passed:\n{check}"
    # DOCKER=false: the refusal must come before anything is pulled or pushed.
    mirror = make("mirror-base", f"ROW={row}", "REGISTRY=127.0.0.1:9", "DOCKER=/bin/false")
    assert mirror.returncode != 0 and f"no valid digest for {r['base_image']}" in mirror.stderr, (
        f"make mirror-base did not refuse the unpinned {r['base_image']}:\n{mirror.stderr}")
