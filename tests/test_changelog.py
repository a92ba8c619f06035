"""CHANGELOG.md and the release notes made from it (scripts/changelog.py): a v* tag's GitHub
release carries its own hand-written section and each row's package manifest, and a tag with
no section stops the release before any image tag moves. Host-side and fast: no Docker."""
import pathlib
import subprocess
import sys

import pytest
from test_publish import load_workflow

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "changelog.py"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"

LOG = """# Changelog

## Unreleased

### Added
- something new

## v1.1.0 - 2026-12-07

### Fixed
- a fix

## v1.0.0
"""


def notes(tag, tmp_path, text=LOG):
    path = tmp_path / "CHANGELOG.md"
    path.write_text(text)
    return subprocess.run([sys.executable, str(SCRIPT), "notes", tag, "--file", str(path)],
                          capture_output=True, text=True, check=False)


def test_release_notes_are_exactly_the_tags_own_section(tmp_path):
    out = notes("v1.1.0", tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "### Fixed\n- a fix\n", out.stdout


@pytest.mark.parametrize("tag, says", [
    ("v2.0.0", "no '## v2.0.0' section (sections: Unreleased, v1.1.0, v1.0.0): rename '## Unreleased'"),
    ("v1.0.0", "'## v1.0.0' section is empty"),
    ("1.1.0", "is not a release tag"),
])
def test_a_tag_without_written_notes_is_refused_with_the_fix(tag, says, tmp_path):
    out = notes(tag, tmp_path)
    assert out.returncode != 0 and says in out.stderr, (out.returncode, out.stdout, out.stderr)
    assert not out.stdout


def test_the_repositorys_changelog_has_an_unreleased_section_to_write_into():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "\n## Unreleased\n" in text, "CHANGELOG.md: keep a '## Unreleased' section for the next release"


def test_release_checks_the_notes_before_promoting_and_publishes_them_with_the_manifests():
    wf = load_workflow(WORKFLOW)
    setup = "\n".join(s.get("run", "") for s in wf["jobs"]["setup"]["steps"])
    assert 'changelog.py notes "$TAG"' in setup, "setup (before promote) must refuse a tag without notes"
    job = wf["jobs"]["release-notes"]
    assert job["needs"] == "promote" and job["permissions"] == {"contents": "write"}, job
    run = "\n".join(s.get("run", "") for s in job["steps"])
    assert "gh release create" in run and "--notes-file notes.md" in run, run
    assert "*.manifest.md" in run and "*.manifest.json" in run, "the release must attach each row's manifest"
    download = [s for s in job["steps"] if "download-artifact" in s.get("uses", "")]
    assert download and download[0]["with"]["pattern"] == "release-*", "promote's artifacts hold the manifests"
