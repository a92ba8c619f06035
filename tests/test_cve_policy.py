"""The CVE policy (security/cve-policy.json, scripts/cve_gate.py) on recorded Grype reports: which
findings fail a release, which entries have expired or gone stale, and the counts it publishes."""
import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.host

ROOT = pathlib.Path(__file__).resolve().parent.parent
GATE = [sys.executable, str(ROOT / "scripts" / "cve_gate.py")]
REPORTS = ROOT / "tests" / "data" / "grype"
ROW = "2.6.0-cuda12.4"
TODAY = "2026-12-07"


def policy(tmp_path, *entries, **top):
    path = tmp_path / "cve-policy.json"
    path.write_text(json.dumps({"fail_on": ["Critical", "High"], "max_review_days": 180, **top,
                                "allow": list(entries)}))
    return path


def entry(vid, package, review_by="2027-03-01", **more):
    return {"id": vid, "package": package, "reason": "recorded for the test", "review_by": review_by, **more}


def gate(policy_path, report="report-mixed.json", *extra):
    return subprocess.run([*GATE, "gate", str(REPORTS / report), "--row", ROW, "--policy", str(policy_path),
                           "--today", TODAY, *extra], check=False, capture_output=True, text=True, timeout=30)


def lines(stderr, level):
    return [line for line in stderr.splitlines() if line.startswith(level)]


@pytest.fixture
def mixed_policy(tmp_path):
    return policy(tmp_path,
                  entry("CVE-2026-10003", "jupyter-server"),                    # valid
                  entry("CVE-2026-10004", "urllib3", review_by="2026-12-06"),   # expired yesterday
                  entry("CVE-2025-3000", "torch", row=ROW),                     # matches the GHSA by alias
                  entry("CVE-2026-99999", "openssl"),                           # matches nothing: stale
                  entry("CVE-2026-10001", "libssl3", row="2.15.0-cuda13.2"))    # another row's


def test_gate_fails_on_the_unlisted_fixable_critical_and_the_expired_entry_only(mixed_policy):
    """Fixable CRITICAL/HIGH unlisted, or listed with an expired entry, fail; nothing else does."""
    r = gate(mixed_policy)
    errors = lines(r.stderr, "ERROR")
    assert r.returncode == 1, r.stderr
    assert any("CRITICAL CVE-2026-10001 in libssl3" in e and "fixed in 3.0.2-0ubuntu1.21" in e for e in errors), r.stderr
    assert any("HIGH CVE-2026-10004 in urllib3" in e and "expired on 2026-12-06" in e for e in errors), r.stderr
    # the two failures and the verdict line; unfixed CRITICAL/HIGH, MEDIUM and LOW do not fail
    assert len(errors) == 3 and "2 finding(s) fail the policy" in errors[-1], r.stderr
    for passing in ("CVE-2026-10002", "CVE-2026-10003", "CVE-2026-10005", "GHSA-rrmf-rvhw-rf47",
                    "CVE-2026-10006", "CVE-2026-10007", "CVE-2026-10008"):
        assert passing not in "\n".join(errors), f"{passing} should not fail: {r.stderr}"


def test_an_entry_that_matches_nothing_is_reported_stale_and_another_rows_entry_is_not_applied(mixed_policy):
    """An entry matching no finding is named as stale; an entry for another row neither applies nor is stale."""
    r = gate(mixed_policy)
    warns = lines(r.stderr, "WARN")
    assert len(warns) == 1 and "stale entry CVE-2026-99999 (openssl)" in warns[0], r.stderr
    assert "CRITICAL CVE-2026-10001" in r.stderr  # the 2.15 row's entry did not excuse it on 2.6


def test_counts_by_severity_are_written_with_each_finding_counted_once(mixed_policy, tmp_path):
    """--counts writes all/fixable/allowlisted per severity; a match Grype repeats per location counts once."""
    out = tmp_path / "counts.json"
    gate(mixed_policy, "report-mixed.json", "--counts", str(out), "--platform", "linux/amd64")
    c = json.loads(out.read_text())
    assert (c["row"], c["platform"], c["verdict"]) == (ROW, "linux/amd64", "fail")
    assert c["scanner"] == "grype 0.87.0" and c["db_built"] == "2026-12-06T01:30:00Z", c
    assert c["counts"]["critical"] == {"all": 2, "fixable": 1, "allowlisted": 0}, c
    assert c["counts"]["high"] == {"all": 4, "fixable": 3, "allowlisted": 2}, c
    assert c["counts"]["medium"] == {"all": 2, "fixable": 1, "allowlisted": 0}, c
    assert c["counts"]["low"] == {"all": 1, "fixable": 0, "allowlisted": 0}, c


def test_a_report_without_failing_findings_passes(mixed_policy):
    """Unfixable CRITICAL/HIGH and fixable MEDIUM findings alone pass the gate."""
    r = gate(mixed_policy, "report-clean.json")
    assert r.returncode == 0 and not lines(r.stderr, "ERROR"), r.stderr
    assert "no finding fails the policy" in r.stderr


def test_report_only_prints_the_same_failures_and_exits_zero(mixed_policy):
    """--report-only (a promoted tag's recount) names what would fail without failing."""
    r = gate(mixed_policy, "report-mixed.json", "--report-only")
    assert r.returncode == 0, r.stderr
    assert "CRITICAL CVE-2026-10001" in r.stderr and "2 finding(s) fail the policy" in r.stderr


@pytest.mark.parametrize("content, says", [
    ("not json", "is not JSON"),
    ('{"Results": []}', "no 'matches' list"),            # Trivy's shape, not Grype's
    ('{"matches": [{"vulnerability": {}}]}', "a match lacks"),
])
def test_a_report_that_is_not_grype_json_gets_one_line_and_status_2(mixed_policy, tmp_path, content, says):
    """A report in another format is refused with one line, not a traceback."""
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    r = subprocess.run([*GATE, "gate", str(bad), "--row", ROW, "--policy", str(mixed_policy), "--today", TODAY],
                       check=False, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_make_cve_lint_fails_on_an_entry_past_its_review_date_naming_it(tmp_path):
    """make cve-lint (run by make lint) goes red the day after review_by, naming the entry."""
    path = policy(tmp_path, entry("CVE-2026-10004", "urllib3", review_by="2026-01-31"),
                  entry("CVE-2026-10003", "jupyter-server", review_by="2099-01-01"))
    r = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "cve-lint", f"CVE_POLICY={path}"],
                       check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "entry CVE-2026-10004 (urllib3) expired: review_by 2026-01-31 has passed" in r.stderr, r.stderr
    # an entry reviewed too far ahead is refused too: expiry must come round
    assert "CVE-2026-10003 (jupyter-server) review_by 2099-01-01 is more than 180 days ahead" in r.stderr, r.stderr
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "lint", f"CVE_POLICY={path}"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert f"scripts/cve_gate.py lint --policy '{path}'" in dry.stdout, dry.stdout


@pytest.mark.parametrize("bad, says", [
    (entry("CVE-2026-1", "x"), "is not a CVE, GHSA or OSV-style id"),
    ({"id": "CVE-2026-10003", "package": "x", "review_by": "2027-01-01"}, "has no reason"),
    (entry("CVE-2026-10003", "x", row="9.9-cuda99"), "is not a versions.json row"),
    (entry("CVE-2026-10003", "x", review_by="next year"), "is not a date"),
])
def test_lint_refuses_a_malformed_entry_naming_what_is_missing(tmp_path, bad, says):
    """Every entry carries an id, package, reason and a real review date, for an existing row."""
    r = subprocess.run([*GATE, "lint", "--policy", str(policy(tmp_path, bad)), "--today", TODAY],
                       check=False, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and says in r.stderr, r.stderr


def test_the_shipped_policy_lists_the_known_unfixable_torch_findings_with_reasons():
    """security/cve-policy.json pre-lists torch 2.6.0's findings no 2.6.x release will fix, on the 2.6 row only."""
    shipped = json.loads((ROOT / "security" / "cve-policy.json").read_text())
    torch = {e["id"]: e for e in shipped["allow"] if e["package"] == "torch"}
    assert {"CVE-2025-3000", "CVE-2025-3121"} <= set(torch), torch
    assert all(e.get("row") == ROW and len(e["reason"]) > 40 for e in torch.values()), torch


FAKE_DOCKER = r'''#!/usr/bin/env python3
# Stands in for docker in manifest.py's four calls: image inspect, create, cp, rm.
import json, pathlib, sys
a = sys.argv[1:]
if a[:2] == ["image", "inspect"]:
    print(json.dumps([{"Id": "sha256:" + "1" * 64, "RepoDigests": [], "Created": "2026-12-07T00:00:00Z",
                       "Os": "linux", "Architecture": "amd64", "Size": 7.3e9, "Config": {"Labels": {"a": "b"}}}]))
elif a[0] == "create":
    print("cid")
elif a[0] == "cp":
    d = pathlib.Path(a[2])
    (d / "versions.json").write_text('{"torch": "2.6.0"}')
    (d / "pip-freeze.txt").write_text("torch==2.6.0\n")
    (d / "dpkg.txt").write_text("libssl3=3.0.2-0ubuntu1.21\n")
'''


def test_make_manifest_with_scan_counts_puts_them_in_the_published_manifest(mixed_policy, tmp_path):
    """make manifest SCAN=<counts> (the release's publish step) adds the counts by severity to both manifests."""
    counts = tmp_path / "amd64.scan.json"
    gate(mixed_policy, "report-mixed.json", "--counts", str(counts))
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    out = tmp_path / "publish"
    r = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "manifest", "REF=fake/team-dl@sha256:ab",
                        "TAG=t1", f"SCAN={counts}", f"PUBLISH_DIR={out}", f"DOCKER={docker}"],
                       check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    md = (out / "t1.manifest.md").read_text()
    assert "| Critical | 2 | 1 | 0 |" in md and "| High | 4 | 3 | 2 |" in md and "Verdict: **fail**" in md, md
    assert json.loads((out / "t1.manifest.json").read_text())["vulnerabilities"]["counts"]["high"]["allowlisted"] == 2
    bad = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "manifest", "REF=fake/team-dl@sha256:ab",
                          "TAG=t2", f"SCAN={REPORTS / 'report-mixed.json'}", f"PUBLISH_DIR={out}", f"DOCKER={docker}"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "has no counts: write it with scripts/cve_gate.py gate --counts" in bad.stderr, bad.stderr
    assert not (out / "t2.manifest.md").exists()
