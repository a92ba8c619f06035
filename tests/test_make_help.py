"""`make help` is the front door: it should list every target and every variable that README.md,
README.zh-CN.md and docs/ tell a reader to use, with nothing left unexpanded, and every `make
TARGET` they name should exist. Host-side and fast: `make help` only reads versions.json (no
Docker, no image; IMAGE_REF need not be set).

What counts as named: in code (inline code and code blocks), every `make TARGET`, every
`NAME=value` given to make (`make build ROW=...`, `FORCE=1 make base-standin`), and every
variable in the first column of docs/building.md's variable table. Prose is not read: "make"
is an English verb."""
import os
import re
import subprocess

import pytest
from test_readme import DOCS, EN, FENCE, INLINE, ROOT, ZH, ZH_DOCS, make_targets, rel

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

PAGES = [EN, ZH] + sorted(DOCS.glob("*.md")) + sorted(ZH_DOCS.glob("*.md"))
MAKE_WORD = re.compile(r"(?:^|(?<=[\s;&|(`]))make(?=\s)")
ASSIGN = re.compile(r"^([A-Z][A-Z0-9_]*)=")
VARIABLE_TABLE = re.compile(r"^\|\s*Variable\s*\|\s*Default\s*\|\s*Meaning\s*\|\s*$")


def code_snippets(path):
    """(line, code) for each inline code span and each code-block line (continuations joined,
    shell comments dropped)."""
    in_code, logical, start = False, "", None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            start = start or n
            logical += " " + line.strip()
            if logical.endswith("\\"):
                logical = logical[:-1]
                continue
            yield start, re.sub(r"(?:^|\s)#.*$", "", logical)
            logical, start = "", None
        else:
            for m in INLINE.finditer(line):
                yield n, m.group(1)


def make_commands(code):
    """(assignments, target or None) of each make command in a piece of code."""
    for segment in re.split(r"&&|\|\||[;|]", code):
        m = MAKE_WORD.search(segment)
        if not m:
            continue
        before, after = segment[:m.start()].split(), segment[m.end():].split()
        names = [ASSIGN.match(t).group(1) for t in before + after if ASSIGN.match(t)]
        target = next((t for t in after if not ASSIGN.match(t) and not t.startswith("-")), None)
        yield names, target if target and re.fullmatch(r"[a-z][\w-]*", target) else None


def named():
    """{target: [where]}, {variable: [where]} as the README and docs name them."""
    targets, variables = {}, {}
    for path in PAGES:
        for n, code in code_snippets(path):
            for names, target in make_commands(code):
                if target:
                    targets.setdefault(target, []).append(f"{rel(path)}:{n}")
                for name in names:
                    variables.setdefault(name, []).append(f"{rel(path)}:{n}")
    in_table = False
    for n, line in enumerate((DOCS / "building.md").read_text(encoding="utf-8").splitlines(), 1):
        if VARIABLE_TABLE.match(line):
            in_table = True
        elif in_table and line.startswith("|"):
            first = line.split("|")[1]
            for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", first):
                variables.setdefault(name, []).append(f"docs/building.md:{n}")
        elif in_table:
            break
    return targets, variables


@pytest.fixture(scope="module")
def help_text():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    out = subprocess.run(["make", "--no-print-directory", "help"], check=False, cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, f"make help failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_every_make_target_the_docs_name_exists():
    """Every `make TARGET` in README.md, README.zh-CN.md and docs/ should be a Makefile target."""
    targets, _ = named()
    assert targets, "found no make command in the README or docs: is the parser broken?"
    defined = make_targets()
    missing = {t: where for t, where in targets.items() if t not in defined}
    assert not missing, f"make targets named but not in the Makefile: {missing}"


def test_make_help_lists_every_variable_the_docs_name(help_text):
    """Every make variable the README and docs name should be listed, with a meaning, by make help."""
    _, variables = named()
    assert "ROW" in variables and "IMAGE" in variables, f"parser found too few variables: {sorted(variables)}"
    listed = set(re.findall(r"^\s+([A-Z][A-Z0-9_]*)\s+\S", help_text.split("Variables", 1)[-1], re.MULTILINE))
    missing = {v: where[:3] for v, where in sorted(variables.items()) if v not in listed}
    assert not missing, (f"make help lists no such variable (add `NAME ?= default## meaning` to the "
                         f"Makefile): {missing}\nmake help's variables: {sorted(listed)}")


def test_make_help_lists_every_target_grouped(help_text):
    """make help should list every target the docs name, everyday targets first, and print no
    unexpanded $(VARIABLE)."""
    targets, _ = named()
    assert "$(" not in help_text, "make help prints an unexpanded variable:\n" + \
        "\n".join(line for line in help_text.splitlines() if "$(" in line)
    everyday, _, rest = help_text.partition("Maintainer targets")
    assert "Everyday targets" in everyday and rest, f"make help is not grouped into everyday and maintainer targets:\n{help_text}"
    listed = set(re.findall(r"^\s+([a-z][\w-]*)\s", help_text.split("Variables", 1)[0], re.MULTILINE))
    missing = sorted(t for t in targets if t not in listed)
    assert not missing, f"make help does not list: {missing}"
    for t in ("run", "build", "stop", "logs", "ssh", "doctor"):
        assert re.search(rf"^\s+{t}\s", everyday, re.MULTILINE), f"{t} should be an everyday target:\n{everyday}"


def test_make_help_shows_each_variables_default(help_text):
    """Each variable with a default should show it, evaluated (PORT_JUPYTER's 8888, TAG's tag)."""
    variables = help_text.split("Variables", 1)[-1]
    for name, default in (("PORT_JUPYTER", "8888"), ("STOP_TIMEOUT", "30"), ("IMAGE", "team-dl"),
                          ("DOCKER", "/usr/bin/docker")):
        line = next((ln for ln in variables.splitlines() if ln.split()[:1] == [name]), "")
        assert line.rstrip().endswith(f"[{default}]"), f"{name}'s default {default} not shown: {line!r}"
    tag = next(ln for ln in variables.splitlines() if ln.split()[:1] == ["TAG"])
    assert re.search(r"\[\d+\.\d+\.\d+-cuda", tag), f"TAG's default should be the evaluated tag: {tag!r}"
