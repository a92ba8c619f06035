#!/usr/bin/env python3
"""The CVE policy (security/cve-policy.json) applied to a Grype scan report (`grype -o json`, what
the release workflow's anchore/scan-action writes), and the policy's own review dates.

Usage: cve_gate.py lint [--policy FILE] [--today YYYY-MM-DD]
           fail on an entry past its review_by (or malformed, or reviewed too far ahead), naming it
       cve_gate.py gate REPORT --row ROW [--platform P] [--policy FILE] [--today D]
                    [--counts FILE] [--report-only]
           fail on each CRITICAL/HIGH finding (policy fail_on) that has a fix and no valid entry,
           and on each finding whose entry has expired; report entries that match nothing as
           stale; --counts writes the findings by severity (all, fixable, allowlisted) as JSON;
           --report-only prints and counts the same, but exits 0
Exit status: 0 passed; 1 failed (each reason printed on its own ERROR line); 2 unreadable input.
"""
import argparse
import datetime
import json
import pathlib
import re
import sys

import logline
import versions

ROOT = pathlib.Path(__file__).resolve().parent.parent
POLICY = ROOT / "security" / "cve-policy.json"
# Grype's severities, most severe first (its JSON spells them so).
SEVERITIES = ("Critical", "High", "Medium", "Low", "Negligible", "Unknown")
ID_RE = re.compile(r"^(CVE-\d{4}-\d{4,}|GHSA(-[23456789cfghjmpqrvwx]{4}){3}|(?!CVE-)[A-Z]+-\d{4}-\d+)$")


def log(level, message):
    logline.log(level, message, who="cve_gate")


def bad_input(message):
    log("ERROR", message)
    sys.exit(2)


def read_json(path, what):
    try:
        return json.loads(pathlib.Path(path).read_text())
    except OSError as e:
        bad_input(f"cannot read {what} {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        bad_input(f"{what} {path} is not JSON (line {e.lineno}: {e.msg})")


def name(entry):
    """How a message names an entry: what a reviewer greps the policy for."""
    return f"{entry.get('id')} ({entry.get('package')}{', row ' + entry['row'] if entry.get('row') else ''})"


def policy_problems(policy, today):
    """[(entry or None, problem)]: everything make lint refuses in the policy, as of today."""
    problems = []
    fail_on = policy.get("fail_on")
    if not isinstance(fail_on, list) or not fail_on or any(s not in SEVERITIES for s in fail_on):
        problems.append((None, f"fail_on must list severities among {list(SEVERITIES)}, not {fail_on!r}"))
    max_days = policy.get("max_review_days")
    if not isinstance(max_days, int) or max_days < 1:
        problems.append((None, f"max_review_days must be a positive whole number, not {max_days!r}"))
        max_days = None
    rows = {r["name"] for r in versions.DATA["matrix"]}
    seen = set()
    for entry in policy.get("allow", []):
        missing = [k for k in ("id", "package", "reason", "review_by") if not str(entry.get(k, "")).strip()]
        if missing:
            problems.append((entry, f"has no {', '.join(missing)}: every entry needs id, package, reason and review_by"))
            continue
        if not ID_RE.match(entry["id"]):
            problems.append((entry, f"id {entry['id']!r} is not a CVE, GHSA or OSV-style id (CVE-2025-3000)"))
        if entry.get("row") and entry["row"] not in rows:
            problems.append((entry, f"row {entry['row']!r} is not a versions.json row ({sorted(rows)})"))
        key = (entry["id"], entry["package"], entry.get("row"))
        if key in seen:
            problems.append((entry, "is listed twice"))
        seen.add(key)
        try:
            due = datetime.date.fromisoformat(entry["review_by"])
        except ValueError:
            problems.append((entry, f"review_by {entry['review_by']!r} is not a date (YYYY-MM-DD)"))
            continue
        if due < today:
            problems.append((entry, (f"expired: review_by {due} has passed; review it (renew review_by "
                                     "with the reason it still holds) or remove it")))
        elif max_days and (due - today).days > max_days:
            problems.append((entry, (f"review_by {due} is more than {max_days} days ahead: "
                                     f"at most {today + datetime.timedelta(days=max_days)}")))
    return problems


def findings(report):
    """Grype's matches as dicts (id, aliases, package, version, severity, fixable, fixed_in), one per
    vulnerability, package and version: Grype repeats a match per location of the package."""
    if not isinstance(report, dict) or not isinstance(report.get("matches"), list):
        bad_input("the report has no 'matches' list: is it Grype's JSON (grype -o json)?")
    out = {}
    for m in report["matches"]:
        try:
            vuln, art = m["vulnerability"], m["artifact"]
            fix = vuln.get("fix") or {}
            f = {"id": vuln["id"], "package": art["name"], "version": art.get("version", ""),
                 "type": art.get("type", ""),
                 "aliases": {vuln["id"]} | {r["id"] for r in m.get("relatedVulnerabilities") or []},
                 "severity": vuln.get("severity") if vuln.get("severity") in SEVERITIES else "Unknown",
                 # Grype's fix states: fixed, not-fixed, wont-fix, unknown (or empty).
                 "fixable": fix.get("state") == "fixed",
                 "fixed_in": ", ".join(fix.get("versions") or [])}
        except (KeyError, TypeError) as e:
            bad_input(f"a match lacks {e}: is the report Grype's JSON (grype -o json)?")
        out.setdefault((f["id"], f["package"], f["version"]), f)
    return list(out.values())


def entry_for(finding, entries):
    for entry in entries:
        if entry["package"] == finding["package"] and entry["id"] in finding["aliases"]:
            return entry
    return None


def gate(report, policy, row, today, where="security/cve-policy.json"):
    """(failures, stale entries, counts by severity) of one scan of one row."""
    fail_on = set(policy["fail_on"])
    entries = [e for e in policy.get("allow", []) if not e.get("row") or e["row"] == row]
    failures, used = [], set()
    counts = {s: {"all": 0, "fixable": 0, "allowlisted": 0} for s in SEVERITIES}
    for f in sorted(findings(report), key=lambda f: (SEVERITIES.index(f["severity"]), f["id"], f["package"])):
        entry = entry_for(f, entries)
        c = counts[f["severity"]]
        c["all"] += 1
        c["fixable"] += f["fixable"]
        what = f"{f['severity'].upper()} {f['id']} in {f['package']} {f['version']}"
        if entry is not None:
            used.add(id(entry))
            if datetime.date.fromisoformat(entry["review_by"]) < today:
                failures.append(f"{what}: its entry {name(entry)} expired on {entry['review_by']}: "
                                f"review it in {where}")
            else:
                c["allowlisted"] += 1
        elif f["severity"] in fail_on and f["fixable"]:
            failures.append(f"{what} is fixed in {f['fixed_in'] or 'a newer version'} and not in "
                            f"{where}: update it, or add "
                            + json.dumps({"id": f["id"], "package": f["package"], "row": row,
                                          "reason": "WHY", "review_by": "YYYY-MM-DD"}))
    stale = [e for e in entries if id(e) not in used]
    return failures, stale, counts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lint = sub.add_parser("lint")
    g = sub.add_parser("gate")
    g.add_argument("report")
    g.add_argument("--row", required=True)
    g.add_argument("--platform", default="linux/amd64")
    g.add_argument("--counts")
    g.add_argument("--report-only", action="store_true")
    for s in (lint, g):
        s.add_argument("--policy", default=str(POLICY))
        s.add_argument("--today", type=datetime.date.fromisoformat,
                       default=datetime.datetime.now(datetime.UTC).date())
    a = p.parse_args(argv)
    policy = read_json(a.policy, "policy")
    problems = policy_problems(policy, a.today)
    if a.cmd == "lint":
        for entry, problem in problems:
            log("ERROR", f"{a.policy}: {'entry ' + name(entry) + ' ' if entry else ''}{problem}")
        if problems:
            return 1
        log("INFO", f"{a.policy}: {len(policy.get('allow', []))} entries, none past its review date")
        return 0
    if any(entry is None or "expired" not in problem for entry, problem in problems):
        for entry, problem in problems:
            log("ERROR", f"{a.policy}: {'entry ' + name(entry) + ' ' if entry else ''}{problem}")
        return 2
    versions.row(a.row)  # an unknown row is a usage error, named
    report = read_json(a.report, "scan report")
    failures, stale, counts = gate(report, policy, a.row, a.today, a.policy)
    for s in SEVERITIES:
        if counts[s]["all"]:
            log("INFO", f"{s.upper():<10} {counts[s]['all']:>4} found, {counts[s]['fixable']:>4} fixable, "
                        f"{counts[s]['allowlisted']:>4} allowlisted")
    for e in stale:
        log("WARN", f"stale entry {name(e)}: matches nothing in this scan of {a.row} ({a.platform}); "
                    "remove it if no other row or platform needs it")
    for f in failures:
        log("ERROR", f)
    if a.counts:
        scanner = report.get("descriptor") or {}
        db = (scanner.get("db") or {}).get("status") or scanner.get("db") or {}
        pathlib.Path(a.counts).write_text(json.dumps({
            "row": a.row, "platform": a.platform,
            "image": ((report.get("source") or {}).get("target") or {}).get("userInput"),
            "scanner": f"{scanner.get('name', '?')} {scanner.get('version', '?')}",
            "scanned": scanner.get("timestamp"),
            "db_built": db.get("built") if isinstance(db, dict) else None,
            "policy_fail_on": policy["fail_on"],
            "verdict": "fail" if failures else "pass",
            "counts": {s.lower(): counts[s] for s in SEVERITIES}}, indent=2) + "\n")
    verdict = f"{len(failures)} finding(s) fail the policy" if failures else "no finding fails the policy"
    log("ERROR" if failures else "INFO", f"{a.row} ({a.platform}): {verdict} "
        f"(fail_on {', '.join(policy['fail_on'])} with a fix, unless listed and not expired)")
    return 1 if failures and not a.report_only else 0


if __name__ == "__main__":
    sys.exit(main())
