"""Image references checked against Docker's grammar (github.com/distribution/reference,
regexp.go) before anything is asked of a registry, so a bad REGISTRY, IMAGE or TAG gets one line
that says what is wrong with it, instead of "not published (404)" or an HTTP library's error.

Used by scripts/pull.py, scripts/push.py and scripts/doctor.py's pre-flight. Standard library only.
Under make, the variables a user typed (REGISTRY, IMAGE, TAG) are in the environment (make
exports command-line variables to recipes), and the message names the variable that is wrong.
"""
import os
import re

# Docker's grammar: a path component is lowercase alphanumerics joined by one separator
# (. _ __ or a run of -); a domain component may hold uppercase; a tag is 1-128 of [\w.-], not
# starting with . or -; a whole name is at most 255 characters.
PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
DOMAIN_COMPONENT = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?")
IPV6 = re.compile(r"\[[a-fA-F0-9:]+\]")
TAG = re.compile(r"[\w][\w.-]{0,127}")
DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
NAME_MAX = 255
NOT_SPACE, TAG_CHAR = r"\S", r"[A-Za-z0-9_.-]"
TAG_RULE = "a tag is 1 to 128 letters, digits, _ . - and starts with a letter, digit or _"


def _first_bad(text, allowed):
    """'X' at position N: the first character of text not matched by the class `allowed`."""
    for i, ch in enumerate(text):
        if not re.fullmatch(allowed, ch):
            return f"{ch!r} at position {i + 1}"
    return None


def _path_problem(component):
    """Why one repository path component breaks the grammar; None when it does not."""
    if not component:
        return "has an empty path component ('//', or a '/' at an end)"
    if component != component.lower() and PATH_COMPONENT.fullmatch(component.lower()):
        return f"has uppercase letters in {component!r}, which Docker refuses in a repository name: use {component.lower()!r}"
    if PATH_COMPONENT.fullmatch(component):
        return None
    bad = _first_bad(component, r"[a-z0-9._-]")
    if bad:
        return f"has {bad} of {component!r}: a repository name holds only lowercase letters, digits and . _ - (and / between parts)"
    return (f"has {component!r}, which starts or ends with a separator or has two in a row: each part of a "
            "repository name starts and ends with a letter or digit")


def _host_problem(host):
    """Why a registry host[:port] breaks the grammar; None when it does not."""
    name, _, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if not name:  # no ':'
        name, port = host, None
    if port is not None and not re.fullmatch(r"[0-9]+", port):
        return f"has port {port!r} in {host!r}: a port is digits only"
    if IPV6.fullmatch(name) or all(DOMAIN_COMPONENT.fullmatch(c) for c in name.split(".")):
        return None
    bad = _first_bad(name, r"[a-zA-Z0-9.-]")
    return (f"has {bad} in the host {host!r}" if bad else f"has a host {host!r} with an empty or -edged part") + \
        ": a registry host is letters, digits, - and dots, with an optional :port"


def registry_problem(text):
    """Why REGISTRY (host[:port][/path...]) is not what Docker accepts; None when it is."""
    scheme = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*)://", text)
    if scheme:
        rest = text[scheme.end():].rstrip("/")
        return (f"starts with {scheme.group(0)}: Docker names a registry without a scheme, use {rest!r} (Docker "
                "speaks HTTPS to it, or plain HTTP where its daemon.json lists it in insecure-registries)")
    if re.search(r"\s", text):
        return f"holds whitespace ({_first_bad(text, NOT_SPACE)}): a registry name has none"
    if text.endswith("/"):
        return f"ends with '/': make puts the '/' before IMAGE itself, use {text.rstrip('/')!r}"
    if text.startswith("/"):
        return "starts with '/': a registry starts with its host, e.g. ghcr.io/acme"
    host, _, path = text.partition("/")
    return _host_problem(host) or next(
        (p for p in (_path_problem(c) for c in path.split("/")) if p), None) if path else _host_problem(host)


def image_problem(text):
    """Why IMAGE (a repository path without the registry) is not what Docker accepts."""
    if not text:
        return "is empty: name the image, e.g. IMAGE=team-dl"
    if re.search(r"\s", text):
        return f"holds whitespace ({_first_bad(text, NOT_SPACE)}): an image name has none"
    for sep, what in ((":", "a tag (give it as TAG)"), ("@", "a digest (give it as DIGEST)")):
        if sep in text:
            return f"holds {sep!r}, which starts {what}: IMAGE is the name alone"
    return next((p for p in (_path_problem(c) for c in text.split("/")) if p), None)


def tag_problem(text):
    """Why TAG is not a tag Docker accepts (a digest given as a tag included)."""
    if DIGEST.fullmatch(text.lstrip("@")):
        return ("is a digest, not a tag: keep TAG the tag and pin the digest with DIGEST=" + text.lstrip("@") +
                " (make pull then requires the tag to name it)")
    if TAG.fullmatch(text):
        return None
    if not text:
        return f"is empty: {TAG_RULE}"
    if len(text) > 128:
        return f"is {len(text)} characters long: {TAG_RULE}"
    if text[0] in ".-":
        return f"starts with {text[0]!r}: {TAG_RULE}"
    return f"has {_first_bad(text, TAG_CHAR)}: {TAG_RULE}"


def split(ref):
    """(domain or '', path, tag or None, digest or None) the way Docker splits a reference: the
    first part is a registry when it has a '.' or ':', is localhost, or has uppercase letters."""
    name, _, digest = ref.partition("@")
    tag = None
    slash = name.rfind("/")
    if ":" in name[slash + 1:]:
        name, tag = name.rsplit(":", 1)
    first, sep, rest = name.partition("/")
    if sep and (re.search(r"[.:]", first) or first == "localhost" or first != first.lower()):
        return first, rest, tag, digest or None
    return "", name, tag, digest or None


def ref_problem(ref):
    """Why a whole reference (host/path:tag or host/path@digest) breaks Docker's grammar, naming
    the part; None when Docker would accept it."""
    if not ref:
        return "the image reference is empty"
    scheme = re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*://", ref)
    if scheme:
        host = split(ref[scheme.end():])[0]
        return f"{ref!r} is not a valid image reference: the registry part {registry_problem(scheme.group(0) + host)}"
    # name:sha256:... (a digest where the tag goes): the last path part has a second ':'.
    as_tag = re.fullmatch(r"[^:/]+:(" + DIGEST.pattern + ")", ref.partition("@")[0].rsplit("/", 1)[-1])
    if as_tag:
        d = as_tag.group(1)
        return (f"{ref!r} is not a valid image reference: the tag {d[:19]}... is a digest: keep the tag and "
                f"pin DIGEST={d}, or name NAME@{d[:19]}...")
    domain, path, tag, digest = split(ref)
    checks = [("the registry part", domain and _host_problem(domain)),
              ("the repository", image_problem(path) if path else "is empty"),
              ("the tag", tag is not None and tag_problem(tag)),
              ("the digest", digest is not None and not DIGEST.fullmatch(digest)
               and "is not algorithm:hex, e.g. sha256: and 64 hex digits")]
    for what, problem in checks:
        if problem:
            return f"{ref!r} is not a valid image reference: {what} {problem}"
    name = f"{domain}/{path}" if domain else path
    if len(name) > NAME_MAX:
        return f"{ref!r} is not a valid image reference: its name is {len(name)} characters, Docker allows {NAME_MAX}"
    return None


def make_vars_problem(environ=None):
    """Under make: the first of REGISTRY, IMAGE, TAG (as typed, from the environment) that
    breaks the grammar, as 'VAR='value' ...: fix'. None outside make or when all are fine.
    The environment is the only place an unquoted value with a space is still whole: the
    recipe's shell has split it before any script sees its arguments."""
    env = os.environ if environ is None else environ
    if "MAKELEVEL" not in env:
        return None
    for var, check in (("REGISTRY", registry_problem), ("IMAGE", image_problem), ("TAG", tag_problem)):
        value = env.get(var)
        if value is None or (var == "REGISTRY" and value == ""):
            continue
        problem = check(value)
        if problem:
            return f"{var}={value!r} {problem}"
    return None


def problem(ref, environ=None):
    """The one line to print for ref (make's variables first, then the reference), or None."""
    return make_vars_problem(environ) or ref_problem(ref)
