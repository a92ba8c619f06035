#!/usr/bin/env python3
"""Write the package manifest of a built image (versions, pip freeze, dpkg list, labels, digest)
as Markdown and JSON, beside the publish record (`make manifest` runs this).

The build already writes /usr/share/team-image/{versions.json,pip-freeze.txt,dpkg.txt};
this copies them out of a created (never started) container, so nothing in the image runs.
Usage: manifest.py --image REF [--out DIR] [--tag TAG] [--scan COUNTS]
  -> DIR/<tag>.manifest.md and DIR/<tag>.manifest.json; COUNTS (scripts/cve_gate.py gate --counts)
  adds the release scan's findings by severity (all, fixable, allowlisted), so two tags compare
  without a scanner.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from logline import log

DOCKER = os.environ.get("DOCKER", "docker")
FILES = ("versions.json", "pip-freeze.txt", "dpkg.txt")


def docker(*args):
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        log("ERROR", f"docker {' '.join(args)} failed: {proc.stderr.strip()}")
        sys.exit(1)
    return proc.stdout


def extract(image):
    """Copy the build's manifest files out of a created container, then remove it."""
    cid = docker("create", image).strip()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            docker("cp", f"{cid}:/usr/share/team-image/.", tmp)
            missing = [f for f in FILES if not (pathlib.Path(tmp) / f).is_file()]
            if missing:
                log("ERROR", f"{image} has no /usr/share/team-image/{missing}: an older build?")
                sys.exit(1)
            return {f: (pathlib.Path(tmp) / f).read_text() for f in FILES}
    finally:
        docker("rm", "-v", cid)


def vulnerabilities(scan):
    """The manifest's section on a scan's counts (scripts/cve_gate.py gate --counts), a table by severity."""
    if not scan:
        return ""
    rows = "\n".join(f"| {sev.capitalize()} | {c['all']} | {c['fixable']} | {c['allowlisted']} |"
                     for sev, c in scan["counts"].items() if c["all"])
    return f"""
## Vulnerabilities ({scan["scanner"]}, database of {scan.get("db_built") or "?"})

Policy (security/cve-policy.json): {", ".join(scan["policy_fail_on"])} findings with a fix fail the
release unless allowlisted with a reason and a review date. Verdict: **{scan["verdict"]}**.

| Severity | Found | Fixable | Allowlisted |
|---|---|---|---|
{rows or "| (none) | 0 | 0 | 0 |"}
"""


def markdown(m):
    labels = "\n".join(f"| `{k}` | `{v}` |" for k, v in sorted(m["labels"].items()))
    versions = "\n".join(f"| {k} | `{v}` |" for k, v in sorted(m["versions"].items()))
    digests = "\n".join(f"- `{d}`" for d in m["repo_digests"]) or "- (not pushed yet)"
    return f"""# {m["image"]}

- Image id: `{m["image_id"]}`
- Created: {m["created"]}
- Platform: `{m["platform"]}`
- Size: {m["size_bytes"] / 1e9:.2f} GB
- Registry digests:
{digests}

## Versions (checked at build time)

| Component | Version |
|---|---|
{versions}
{vulnerabilities(m.get("vulnerabilities"))}
## Labels

| Label | Value |
|---|---|
{labels}

## Python packages (`pip freeze --all`, {len(m["pip"])} packages)

```
{chr(10).join(m["pip"])}
```

## Debian packages (`dpkg-query`, {len(m["dpkg"])} packages)

```
{chr(10).join(m["dpkg"])}
```
"""


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True)
    ap.add_argument("--out", default="artifacts/publish")
    ap.add_argument("--tag", help="names the output files (default: the tag in --image)")
    ap.add_argument("--scan", help="a scan's counts by severity (scripts/cve_gate.py gate --counts)")
    args = ap.parse_args(argv)

    scan = None
    if args.scan:
        try:
            scan = json.loads(pathlib.Path(args.scan).read_text())
        except (OSError, ValueError) as e:
            log("ERROR", f"--scan {args.scan}: cannot read it as JSON: {e}")
            sys.exit(1)
        if not isinstance(scan, dict) or not isinstance(scan.get("counts"), dict):
            log("ERROR", f"--scan {args.scan} has no counts: write it with scripts/cve_gate.py gate --counts")
            sys.exit(1)
    attrs = json.loads(docker("image", "inspect", args.image))[0]
    files = extract(args.image)
    last = args.image.rsplit("/", 1)[-1]
    tag = args.tag or (last.rsplit(":", 1)[-1] if ":" in last and "@" not in last else "image")
    out = pathlib.Path(args.out)
    digests = set(attrs.get("RepoDigests") or [])
    # make push leaves no registry reference behind locally; its record names the digest.
    record = out / f"{tag}.json"
    if record.is_file():
        published = json.loads(record.read_text())
        if published.get("image_id") in (None, attrs["Id"]):
            digests.add(f"{published['repository']}@{published['digest']}")
    manifest = {
        "image": args.image,
        "image_id": attrs["Id"],
        "repo_digests": sorted(digests),
        "created": attrs.get("Created"),
        # One platform's image: a multi-platform tag has one manifest per platform (make manifest
        # PLATFORM=... after pulling that one).
        "platform": f"{attrs.get('Os', 'linux')}/{attrs.get('Architecture', 'unknown')}",
        "size_bytes": attrs.get("Size", 0),
        "labels": attrs["Config"].get("Labels") or {},
        "versions": json.loads(files["versions.json"]),
        "pip": files["pip-freeze.txt"].split(),
        "dpkg": files["dpkg.txt"].split(),
        "vulnerabilities": scan,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{tag}.manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    (out / f"{tag}.manifest.md").write_text(markdown(manifest))
    log("INFO", f"wrote {out}/{tag}.manifest.md and .json ({len(manifest['pip'])} pip, "
                f"{len(manifest['dpkg'])} dpkg packages)")


if __name__ == "__main__":
    main(sys.argv[1:])
