"""eStargz tags without a node (docs/distributing.md#lazy-pulls-estargz): a layer's table of contents
(TOC) is checked against the layer as the stargz snapshotter checks it before mounting lazily, and
make push ESGZ=1 reads each pushed layer's TOC back the same way (scripts/lazy/toc.py). The layer
here is a tiny eStargz blob made by ctr-remote from three files of ours (tests/data/esgz/README.md).
The lazy pulls themselves, on a real node, are in test_lazy_pull.py (make test-slow).
"""
import copy
import gzip
import hashlib
import io
import json
import pathlib
import re
import shlex
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "lazy"))
import toc

pytestmark = pytest.mark.host
DATA = ROOT / "tests" / "data" / "esgz"


@pytest.fixture
def layer():
    """(blob bytes, the manifest's layer descriptor) of the fixture."""
    return (DATA / "layer.tar.gz").read_bytes(), json.loads((DATA / "layer.json").read_text())


def split(blob):
    """-> (body, TOC JSON as a dict, footer) of an eStargz blob."""
    offset = toc.toc_offset(blob[-toc.FOOTER_SIZE:])
    return blob[:offset], json.loads(toc.toc_json(blob[offset:-toc.FOOTER_SIZE])), blob[-toc.FOOTER_SIZE:]


def rebuild(body, toc_dict, footer):
    """A blob with toc_dict as its TOC, at the same offset (the footer stays valid). -> (blob, its TOC digest)."""
    data = json.dumps(toc_dict).encode()
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w") as tar:
        info = tarfile.TarInfo(toc.TOC_NAME)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return body + gzip.compress(tar_buf.getvalue()) + footer, "sha256:" + hashlib.sha256(data).hexdigest()


def test_esgz_layer_whose_toc_matches_its_layer_is_accepted(layer):
    """A layer as ctr-remote wrote it should pass: its TOC digest and every chunk's digest match."""
    blob, descriptor = layer
    read = toc.verify_blob(blob, descriptor["annotations"][toc.ANNOTATION])
    names = {e["name"] for e in read["entries"]}
    assert {"opt/fixture/hello.txt", "opt/fixture/data.bin"} <= names, names
    assert sum(e["type"] == "chunk" for e in read["entries"]) >= 2, "the fixture should hold a file in several chunks"


def test_esgz_layer_whose_toc_was_edited_is_refused(layer):
    """A TOC changed after the manifest was written (here: a file's size) should be refused, naming both digests."""
    blob, descriptor = layer
    body, contents, footer = split(blob)
    edited = copy.deepcopy(contents)
    next(e for e in edited["entries"] if e["name"] == "opt/fixture/hello.txt")["size"] += 1
    tampered, _ = rebuild(body, edited, footer)
    with pytest.raises(toc.TOCError, match=r"the TOC's digest is sha256:\w+, but the manifest says .*refused"):
        toc.verify_blob(tampered, descriptor["annotations"][toc.ANNOTATION])


def test_esgz_layer_whose_bytes_differ_from_its_toc_is_refused(layer):
    """A TOC that names other bytes than the layer holds, even with a manifest rewritten to match it,
    should be refused at the first chunk whose bytes differ."""
    blob, _ = layer
    body, contents, footer = split(blob)
    edited = copy.deepcopy(contents)
    chunk = next(e for e in edited["entries"] if e["name"] == "opt/fixture/data.bin" and e["type"] == "chunk")
    chunk["chunkDigest"] = "sha256:" + hashlib.sha256(b"other bytes").hexdigest()
    tampered, digest = rebuild(body, edited, footer)
    with pytest.raises(toc.TOCError, match=r"opt/fixture/data.bin: its bytes do not match the TOC's chunk digest"):
        toc.verify_blob(tampered, digest)


def test_plain_gzip_layer_is_not_taken_for_esgz(layer):
    """An ordinary gzip layer (no eStargz footer) should be refused as not eStargz, not misread."""
    plain = gzip.compress(b"not an estargz layer" * 100)
    with pytest.raises(toc.TOCError, match="not an eStargz layer"):
        toc.verify_blob(plain, layer[1]["annotations"][toc.ANNOTATION])


def test_make_push_esgz_converts_at_the_makefiles_level_and_only_when_asked():
    """make -n push ESGZ=1 should pass --esgz-level ESGZ_LEVEL to push.py; without ESGZ, nothing eStargz."""
    def dry(*args):
        proc = subprocess.run(["make", "-n", "-s", "-C", str(ROOT), "push", "REGISTRY=127.0.0.1:5999", *args],
                              capture_output=True, text=True, check=False, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return " ".join(shlex.split(proc.stdout.replace("\\\n", " ")))  # as the shell reads it (values are quoted)
    level = re.search(r"^ESGZ_LEVEL\s*\?=\s*(\d+)", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1)
    assert f"--esgz-level {level}" in dry("ESGZ=1"), dry("ESGZ=1")
    assert "--esgz-level 9" in dry("ESGZ=1", "ESGZ_LEVEL=9")
    assert "esgz" not in dry(), dry()


def test_first_work_record_lists_a_jupyter_start_and_none_of_torchs_libraries():
    """scripts/lazy/first-work.jsonl (optimize's record of a start: the entrypoint, sshd, Jupyter)
    should list those, each once, and nothing from torch's or the CUDA wheels' packages. What it
    lists goes before each layer's prefetch landmark, which a node with the stargz snapshotter's
    stock config fetches at mount and waits for before the container starts: with torch's
    libraries in it (0.95 GB), Jupyter answered after 70 s (results/start_2core_2026-12-07.md)."""
    paths = [json.loads(line)["path"] for line in (ROOT / "scripts" / "lazy" / "first-work.jsonl").read_text().splitlines()]
    assert len(paths) == len(set(paths)), "a path is listed twice"
    for wanted in (r"^usr/local/bin/entrypoint\.sh$", r"^usr/sbin/sshd$", r"/jupyter_server/"):
        assert any(re.search(wanted, p) for p in paths), f"nothing matches {wanted} in {len(paths)} paths"
    heavy = [p for p in paths if re.search(r"site-packages/(torch|nvidia|triton)/", p)]
    assert not heavy, f"{len(heavy)} paths of torch or the CUDA wheels would be prefetched at mount: {heavy[:3]}"


def test_release_publishes_every_tag_also_as_esgz_signed_and_tagged():
    """release.yml should build each platform again with BuildKit's eStargz output, join, sign and
    verify that index too, and hand it to publish-digest.sh, which tags it <tag>-esgz (publish and promote)."""
    from test_publish import load_workflow
    wf = load_workflow(ROOT / ".github" / "workflows" / "release.yml")
    builds = [s for s in wf["jobs"]["build"]["steps"] if "build-push-action" in s.get("uses", "")]
    esgz = [s for s in builds if "compression=estargz" in s["with"]["outputs"]]
    assert len(esgz) == 1, f"want one eStargz build: {[b['with']['outputs'] for b in builds]}"
    assert {"oci-mediatypes=true", "force-compression=true"} <= set(esgz[0]["with"]["outputs"].split(",")), esgz
    for job in ("publish", "promote"):
        steps = wf["jobs"][job]["steps"]
        runs = "\n".join(s.get("run", "") for s in steps)
        tag = next(s for s in steps if "publish-digest.sh" in s.get("run", ""))
        assert tag["run"].rstrip().endswith('"$ESGZ_DIGEST"') and "ESGZ_DIGEST" in tag["env"], f"{job}: {tag}"
        assert re.search(r'for d in "\$DIGEST" .*"\$ESGZ_DIGEST"; do\n\s+cosign (sign|verify)', runs), \
            f"{job}: the eStargz digest's signature is not checked"
    script = (ROOT / "scripts" / "publish-digest.sh").read_text()
    assert 'publish "$esgz_digest" -esgz' in script, "publish-digest.sh does not tag the eStargz digest <tag>-esgz"
