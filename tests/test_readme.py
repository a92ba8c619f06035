"""README.zh-CN.md should say what README.md says, and each docs/zh-CN/PAGE.md what docs/PAGE.md
says: section by section, the same code-block lines, inline code, make targets, UPPER_CASE names,
ports, figures and links (a link is compared by the file and heading it reaches, so `docs/x.md`
in README.md and `docs/zh-CN/x.md` in README.zh-CN.md agree). Every relative link in README and
docs, both languages, and in benchmarks/results/ reaches a file, and a heading when it names one.
Host-side and fast: no image, no Docker (these tests use no fixture, so IMAGE_REF need not be set).

Sections are paired by anchor: each heading of the translation has `<a id="KEY"></a>` on the line
above it, KEY being GitHub's anchor for the English heading, so links into either README agree and
a failure names the section to fix. One-line HTML comments are not rendered and are skipped, so
README.md's GENERATED markers need no counterpart; the translation's copies of the generated
blocks are translated by hand like any other text. What these tests cannot see: a prose sentence
holding none of those items; when an English page changes, read its diff too. benchmarks/results/
is English only (results are written once) and has no translation."""
import pathlib
import re
from dataclasses import dataclass, field

import pytest

# Files, scripts and fakes only: .ci/run runs this file beside the container tests.
pytestmark = pytest.mark.host

ROOT = pathlib.Path(__file__).resolve().parent.parent
EN = ROOT / "README.md"
ZH = ROOT / "README.zh-CN.md"
DOCS = ROOT / "docs"
ZH_DOCS = DOCS / "zh-CN"
RESULTS = ROOT / "benchmarks" / "results"
# (English, Chinese) pairs: the README and every docs page.
PAIRS = [(EN, ZH)] + [(p, ZH_DOCS / p.name) for p in sorted(DOCS.glob("*.md"))]
PAIR_IDS = [en.relative_to(ROOT).as_posix() for en, _ in PAIRS]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*$")
ANCHOR = re.compile(r'^<a id="([^"]+)"></a>\s*$')
# A line that is one HTML comment is not rendered: README.md's `<!-- BEGIN name: GENERATED ... -->`
# markers (scripts/generate.py) and notes to translators. Skipped on both sides.
HTML_COMMENT = re.compile(r"^\s*<!--.*-->\s*$")
# ASCII classes throughout: in Python's Unicode mode a CJK character counts as \w, so `\b` and
# `\w` lookarounds would miss a name or a number written right next to Chinese text.
A = re.ASCII
# A placeholder may be translated (`<tag>`, `<the reference it prints>`): compared as `<...>`.
PLACEHOLDER = re.compile(r"<(?=[^<>\n]*[^\W\d_])[^<>\n]{1,60}>")
COMMENT = re.compile(r"(?:^|\s)#(?:\s.*)?$")  # shell comments are prose: may be translated
MAKE = re.compile(r"\bmake\s+(?:[A-Z_]+=\S*\s+)*([a-z][\w-]*)", A)
UPPER_ANYWHERE = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", A)
UPPER_IN_CODE = re.compile(r"\b[A-Z][A-Z0-9_]+\b", A)
PORTS = [re.compile(p, A | re.IGNORECASE) for p in (
    r"-p\s+(?:\d+\.\d+\.\d+\.\d+:)?(\d{2,5})\b(?!\.)(?::(\d{2,5})\b)?",  # docker -p, ssh -p
    r"(?:\d+\.\d+\.\d+\.\d+|\[?[A-Za-z][\w.-]*\]?):(\d{2,5})(?![\w.:])",  # host:port
    r"(?:^|[\s(`])(?:on\s+)?:(\d{2,5})(?![\w.:])",  # ":8888"
    r"\b(?:port|ports|on):?\s+`?(\d{2,5})\b(?![.,]\d)",
    r"(?:端口|端口号)[:：]?\s*`?(\d{2,5})\b",
    r"\b(\d{2,5})`?\s*端口",
    r"\b(\d{2,5})/tcp\b",
    r"\bPORT\w*=(\d{2,5})\b",
)]
FIGURE = re.compile(r"(?<![A-Za-z0-9_.])\d+(?:[.,]\d+)*", A)
INLINE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, ...


def rel(path):
    return path.resolve().relative_to(ROOT).as_posix()


def english(relpath):
    """The English file a translated one stands for: README.zh-CN.md -> README.md, docs/zh-CN/x -> docs/x."""
    if relpath == "README.zh-CN.md":
        return "README.md"
    return re.sub(r"^docs/zh-CN/", "docs/", relpath)


def resolve(path, target):
    """(repository path, anchor) a relative link in `path` reaches; None for an external link."""
    if EXTERNAL.match(target):
        return None
    file, _, anchor = target.partition("#")
    dest = (path.parent / file).resolve() if file else path.resolve()
    try:
        return dest.relative_to(ROOT).as_posix(), anchor
    except ValueError:
        return f"(outside the repository) {file}", anchor


def canonical_link(path, target):
    """A link as the two languages should agree on it: the English file it reaches, and its anchor."""
    r = resolve(path, target)
    if r is None:
        return target
    file, anchor = r
    return english(file) + (f"#{anchor}" if anchor else "")


def make_targets():
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-zA-Z][\w-]*)\s*:(?!=)", text, re.MULTILINE))


def github_slug(title):
    """GitHub's heading anchor: markup dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "").replace("**", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


@dataclass
class Section:
    key: str
    title: str
    line: int
    path: pathlib.Path = None
    end: int = 0
    lines: list = field(default_factory=list)  # (line number, text, in a code block: True/False/None=fence)

    def text(self, code=None):
        """The section's code (True), prose (False) or all of it as one string; left-out lines are
        blank, so an offset still maps to its line."""
        return "\n".join(t if code in (None, c) else "" for _, t, c in self.lines)

    def line_at(self, text, offset):
        return self.lines[0][0] + text.count("\n", 0, offset) if self.lines else self.line


def sections(path):
    """Split a README at its headings (not at '#' lines inside code blocks). A section's key is the
    `<a id>` on the line above its heading, else GitHub's anchor for the heading."""
    result, seen, anchor, in_code = [Section("", "(before the first heading)", 1, path)], {}, None, False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            result[-1].lines.append((n, "", None))  # neither code nor prose, kept for numbering
            continue
        if not in_code and HTML_COMMENT.match(line):
            continue
        if not in_code and ANCHOR.match(line):
            anchor = ANCHOR.match(line).group(1)
            continue
        heading = None if in_code else HEADING.match(line)
        if heading:
            key = anchor or github_slug(heading.group(2))
            if not anchor and key in seen:  # GitHub numbers repeated anchors: x, x-1, x-2
                seen[key] += 1
                key = f"{key}-{seen[key]}"
            seen.setdefault(key, 0)
            result[-1].end = n - 1
            result.append(Section(key, heading.group(2), n, path))
            anchor = None
            continue
        if line.strip():
            anchor = None
        result[-1].lines.append((n, line, in_code))
    result[-1].end = n
    return [s for s in result if s.key or s.lines and any(t.strip() for _, t, _ in s.lines)]


def normalise(s):
    return " ".join(PLACEHOLDER.sub("<...>", s).split())


def extract(section, targets):
    """{category: {item: first line number}} for one section."""
    found = {}

    def add(category, item, line):
        if item:
            found.setdefault(category, {}).setdefault(item, line)

    code, prose = section.text(True), section.text(False)
    # Code-block lines: backslash continuations joined, comments dropped, spacing normalised.
    logical, start = "", None
    for n, t, in_code in section.lines:
        if not in_code:
            if logical:  # a block ended on a backslash
                add("code-block line", normalise(COMMENT.sub("", logical)), start)
            logical, start = "", None
            continue
        start = start or n
        logical += " " + t.rstrip()
        if logical.endswith("\\"):
            logical = logical[:-1]
            continue
        add("code-block line", normalise(COMMENT.sub("", logical)), start)
        logical, start = "", None
    inline = [(m.group(1), section.line_at(prose, m.start())) for m in INLINE.finditer(prose)]
    for span, line in inline:
        add("inline code", normalise(span), line)
    everything = section.text()
    for m in MAKE.finditer(everything):
        if m.group(1) in targets:
            add("make target", f"make {m.group(1)}", section.line_at(everything, m.start()))
    for m in UPPER_ANYWHERE.finditer(everything):
        add("UPPER_CASE name", m.group(0), section.line_at(everything, m.start()))
    for m in UPPER_IN_CODE.finditer(code):
        add("UPPER_CASE name", m.group(0), section.line_at(code, m.start()))
    for span, line in inline:
        for name in UPPER_IN_CODE.findall(span):
            add("UPPER_CASE name", name, line)
    for rx in PORTS:
        for m in rx.finditer(everything):
            for port in filter(None, m.groups()):
                add("port", port, section.line_at(everything, m.start()))
    bare = INLINE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose)  # figures outside code
    for m in FIGURE.finditer(bare):
        add("figure", m.group(0), section.line_at(bare, m.start()))
    for m in LINK.finditer(prose):
        add("link", canonical_link(section.path, m.group(1)), section.line_at(prose, m.start()))
    return found


@pytest.mark.parametrize("en_path,zh_path", PAIRS, ids=PAIR_IDS)
def test_translation_has_every_section_in_the_same_order(en_path, zh_path):
    """The translation should have one section per English heading, in order, and no other."""
    assert zh_path.exists(), (f"{rel(en_path)} has no translation: write {zh_path.relative_to(ROOT)} "
                              f"(the same sections, each with <a id=\"KEY\"></a> above its heading)")
    en, zh = sections(en_path), sections(zh_path)
    EN_NAME, ZH_NAME = rel(en_path), rel(zh_path)
    en_keys, zh_keys = [s.key for s in en], [s.key for s in zh]
    problems = []
    for s in en:
        if s.key not in zh_keys:
            problems.append(f'  untranslated: "{s.title}" ({EN_NAME}:{s.line}-{s.end}): translate it and put '
                            f'<a id="{s.key}"></a> on the line above its heading in {ZH_NAME}')
    untranslated = [k for k in en_keys if k not in zh_keys]
    for s in zh:
        if s.key not in en_keys:
            problems.append(f'  {ZH_NAME}:{s.line} "{s.title}" has anchor "{s.key}", which is no heading of '
                            f"{EN_NAME} (renamed or removed? untranslated there: {untranslated})")
    common_en = [k for k in en_keys if k in zh_keys]
    common_zh = [k for k in zh_keys if k in en_keys]
    if common_en != common_zh:
        i = next(i for i, (a, b) in enumerate(zip(common_en, common_zh)) if a != b)
        problems.append(f"  order differs: after #{common_en[i - 1]}, {EN_NAME} has #{common_en[i]}, "
                        f"{ZH_NAME} has #{common_zh[i]}")
    assert not problems, f"{ZH_NAME} sections do not match {EN_NAME}'s:\n" + "\n".join(problems)


def test_every_translated_page_has_an_english_page():
    """docs/zh-CN/ should hold only translations of docs/ pages (a page renamed in one language only
    would otherwise go unchecked)."""
    orphans = [rel(p) for p in sorted(ZH_DOCS.glob("*.md")) if not (DOCS / p.name).exists()]
    assert not orphans, f"translations without an English page in docs/: {orphans}"


@pytest.mark.parametrize("en_path,zh_path", PAIRS, ids=PAIR_IDS)
def test_translation_matches_english_section_by_section(en_path, zh_path):
    """Each translated section should hold the same code lines, inline code, make targets, names,
    ports, figures and links as its English section: none missing on either side."""
    if not zh_path.exists():
        pytest.fail(f"{rel(en_path)} has no translation {rel(zh_path)} (see the section test)")
    EN_NAME, ZH_NAME = rel(en_path), rel(zh_path)
    targets = make_targets()
    zh = {s.key: s for s in sections(zh_path)}
    report = []
    for s in sections(en_path):
        if s.key not in zh:
            continue  # reported by the section test
        en_items, zh_items = extract(s, targets), extract(zh[s.key], targets)
        lines = []
        for side, have, other, where in (("missing from", en_items, zh_items, EN_NAME),
                                         ("only in", zh_items, en_items, ZH_NAME)):
            missing = {c: {i: n for i, n in have[c].items() if i not in other.get(c, {})} for c in have}
            code = [i for c in ("inline code", "code-block line") for i in missing.get(c, {})]
            by_line = {}
            for category in sorted(missing):
                for item, line in missing[category].items():
                    # A name, target or port inside missing code says nothing new.
                    if category in ("UPPER_CASE name", "make target", "port") and \
                            any(item.removeprefix("make ") in c for c in code):
                        continue
                    by_line.setdefault(line, {}).setdefault(category, []).append(repr(item))
            for line in sorted(by_line):
                items = "; ".join(f"{c} {', '.join(i)}" for c, i in by_line[line].items())
                lines.append(f"    {side} {ZH_NAME}, {where}:{line}: {items}")
        if lines:
            report.append(f'  section "{s.title}" (#{s.key}; {EN_NAME}:{s.line}, {ZH_NAME}:{zh[s.key].line}):')
            report.extend(lines)
    assert not report, (
        f"{ZH_NAME} does not say what {EN_NAME} says. Each item is quoted as it must appear in the "
        "other file (code comments and <placeholders> may be translated; links are compared by the "
        "English file and heading they reach; everything else is kept verbatim):\n" + "\n".join(report))


@pytest.mark.parametrize("en_path,zh_path", PAIRS, ids=PAIR_IDS)
def test_pages_link_each_other_at_the_top(en_path, zh_path):
    """An English page should link its translation, and the translation the English page, in their
    first lines."""
    for path, other in ((en_path, zh_path), (zh_path, en_path)):
        if not path.exists():
            pytest.fail(f"{rel(path)} is missing (see the section test)")
        head = path.read_text(encoding="utf-8").splitlines()[:5]
        want = other.relative_to(path.parent) if other.parent == path.parent or \
            other.parent.is_relative_to(path.parent) else pathlib.Path("..") / other.name
        assert any(f"]({want.as_posix()})" in line for line in head), \
            f"{rel(path)} has no link ]({want.as_posix()}) in its first 5 lines: {head}"


def anchors(path):
    secs = sections(path)
    return {s.key for s in secs} | {github_slug(s.title) for s in secs}


def prose_links(path):
    """(line number, target) of every [text](target) outside code blocks."""
    in_code = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            for m in LINK.finditer(INLINE.sub("", line)):
                yield n, m.group(1)


LINKED_FILES = [EN, ZH] + sorted(DOCS.glob("*.md")) + sorted(ZH_DOCS.glob("*.md")) + sorted(RESULTS.glob("*.md"))


@pytest.mark.parametrize("path", LINKED_FILES, ids=[rel(p) for p in LINKED_FILES])
def test_relative_links_reach_a_file_and_heading(path):
    """Every relative link (and every #anchor) in README, docs and results should reach an existing
    file, and a heading of it when it names one."""
    broken = []
    for n, target in prose_links(path):
        r = resolve(path, target)
        if r is None:
            continue
        file, anchor = r
        dest = ROOT / file
        if file.startswith("(outside") or not dest.exists():
            broken.append(f"{rel(path)}:{n} ({target}): no file {file}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{rel(path)}:{n} ({target}): {file} has no heading #{anchor}")
    assert not broken, "links that reach nothing:\n  " + "\n  ".join(broken)
