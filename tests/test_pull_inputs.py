"""make pull/run/push with what users type wrong and what registries do differently: references
checked against Docker's grammar before any request, one line instead of a traceback (a login
that is not base64, a credential helper that prints no JSON, Ctrl-C), the protocol Docker would
speak (HTTPS first; plain HTTP only where Docker's daemon lists the registry as insecure), and
an image whose labels contradict its tag.

Host tests: a fake registry (tests/registry_fakes.py: HTTP, or HTTPS with a self-signed
certificate) and a fake docker; no container, no daemon. Most run make once: its start (the
Makefile asks versions.json through python3) is most of their 2-4 s on a loaded 2-core host.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import build_info
import pytest
import reference
import registry_fakes
import tag_labels
import versions
from test_publish import LEAKY, ROOT

pytestmark = pytest.mark.host

DIGEST = "sha256:" + "b" * 64


def make(*args, docker=None, env=None, timeout=60, **popen):
    run_env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    run_env.update({"DOCKER": str(docker.path) if docker else "/nonexistent/docker", **(env or {})})
    cmd = [*(AS_A_TERMINALS_JOB if popen.pop("sigint_default", False) else []), "make", "-s", "-C", str(ROOT), *args]
    if popen:
        return subprocess.Popen(cmd, env=run_env, text=True, **popen)
    return subprocess.run(cmd, capture_output=True, text=True, env=run_env, check=False, timeout=timeout)


def errors(result):
    return [line for line in result.stderr.splitlines() if line.startswith("ERROR")]


def one_error(result, says):
    """The result failed with exactly one ERROR line, holding `says`, and no traceback."""
    lines = errors(result)
    assert result.returncode != 0, f"it did not fail:\n{result.stderr}"
    assert "Traceback" not in result.stderr and "usage:" not in result.stderr, result.stderr
    assert len(lines) == 1 and says in lines[0], f"want one ERROR line with {says!r}:\n{result.stderr}"


@pytest.fixture
def fake_registry():
    servers = []

    def start(**kw):
        servers.append(registry_fakes.Registry(**kw).start())
        return servers[-1]

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture
def docker(tmp_path):
    return registry_fakes.Docker(tmp_path)


# ---------------------------------------------------------------- references (Docker's grammar)

BAD_REFERENCES = [
    ({"REGISTRY": "{reg}/"}, "ends with '/': make puts the '/' before IMAGE itself, use '{reg}'"),
    ({"REGISTRY": "http://{reg}"}, "starts with http://: Docker names a registry without a scheme, use '{reg}'"),
    ({"REGISTRY": "{reg}/Acme"}, "REGISTRY='{reg}/Acme' has uppercase letters in 'Acme'"),
    ({"IMAGE": "Team-DL"}, "IMAGE='Team-DL' has uppercase letters in 'Team-DL', which Docker refuses"),
    ({"TAG": DIGEST}, f"TAG='{DIGEST}' is a digest, not a tag: keep TAG the tag and pin the digest with DIGEST="),
    ({"TAG": "Bad Tag"}, "TAG='Bad Tag' has ' ' at position 4: a tag is 1 to 128 letters"),
    ({"TAG": "-x"}, "TAG='-x' starts with '-'"),
]
IDS = ["registry-trailing-slash", "registry-with-scheme", "registry-uppercase", "image-uppercase",
       "digest-as-tag", "tag-with-space", "tag-starting-with-dash"]


def typed(given, reg):
    values = {"REGISTRY": reg, "IMAGE": "team-dl", "TAG": "t1", **given}
    return [f"{k}={v.format(reg=reg)}" for k, v in values.items()]


@pytest.mark.parametrize(("given", "says"), BAD_REFERENCES, ids=IDS)
def test_make_pull_names_what_is_wrong_with_a_reference_before_asking_the_registry(fake_registry, docker,
                                                                                    given, says):
    """make pull with a reference Docker's grammar refuses: one ERROR line naming the variable and
    what is wrong with it; the registry is never asked and nothing is pulled."""
    reg = fake_registry()
    result = make("pull", *typed(given, reg.address), docker=docker)
    one_error(result, says.format(reg=reg.address))
    assert reg.requests == [] and not docker.calls(), (reg.requests, docker.calls())


@pytest.mark.parametrize(("given", "says"), [BAD_REFERENCES[3]], ids=IDS[3:4])
def test_make_run_with_a_bad_reference_neither_pulls_nor_builds(fake_registry, docker, given, says):
    """make run with REGISTRY and an uppercase IMAGE or a digest as TAG: the same one line, and no
    build that Docker would refuse anyway (pull.py ensure's exit is not "not published")."""
    reg = fake_registry()
    result = make("run", "PREFLIGHT=0", *typed(given, reg.address), docker=docker)
    one_error(result, says.format(reg=reg.address))
    assert not [c for c in docker.calls() if c[0] in ("build", "run", "pull")], docker.calls()


@pytest.mark.parametrize(("given", "says"), [BAD_REFERENCES[0], *BAD_REFERENCES[5:]],
                         ids=[IDS[0], *IDS[5:]])
def test_make_push_names_what_is_wrong_with_a_reference(docker, given, says):
    """make push 'TAG=Bad Tag', TAG=-x or a REGISTRY ending in '/': the one line, not argparse's
    usage error; docker is never called."""
    result = make("push", *typed(given, "registry.example.com"), docker=docker)
    one_error(result, says.format(reg="registry.example.com"))
    assert not docker.calls(), docker.calls()


# ---------------------------------------------------------------- one line, not a traceback


def test_a_login_that_is_not_base64_gets_one_line(fake_registry, docker, tmp_path):
    """~/.docker/config.json whose auth for the registry is not base64: one line naming the file
    and `docker login`, no binascii traceback."""
    reg = fake_registry(status=401)
    (tmp_path / "config.json").write_text(json.dumps({"auths": {reg.address: {"auth": "not base64!"}}}))
    result = make("pull", *typed({}, reg.address), docker=docker, env={"DOCKER_CONFIG": str(tmp_path)})
    one_error(result, f"the login stored for {reg.address} in {tmp_path / 'config.json'} is not base64")
    assert f"docker login {reg.address}" in errors(result)[0], result.stderr


def test_a_credential_helper_that_prints_no_json_gets_one_line(fake_registry, docker, tmp_path):
    """A credential helper (credsStore) that prints something other than JSON: one line naming the
    helper, no JSONDecodeError traceback."""
    reg = fake_registry(status=401)
    (tmp_path / "config.json").write_text(json.dumps({"credsStore": "broken"}))
    helper = tmp_path / "bin" / "docker-credential-broken"
    helper.parent.mkdir()
    helper.write_text("#!/bin/sh\necho 'secret-service: no D-Bus session'\n")
    helper.chmod(0o755)
    result = make("pull", *typed({}, reg.address), docker=docker,
                  env={"DOCKER_CONFIG": str(tmp_path), "PATH": f"{helper.parent}:{os.environ['PATH']}"})
    one_error(result, "docker-credential-broken get printed no JSON (secret-service: no D-Bus session)")


# A command run as a terminal's foreground job runs it, SIGINT at its default: a test runner started
# in the background (.ci/run's host tests: bash's `&`) has SIGINT ignored, its children inherit
# that, and Python then never raises KeyboardInterrupt. (Not preexec_fn: the fake registry's
# thread makes a fork that runs Python code unsafe.)
AS_A_TERMINALS_JOB = [sys.executable, "-c", ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                                             "os.execvp(sys.argv[1], sys.argv[1:])")]


def test_ctrl_c_during_make_pull_says_stopped_and_exits_130(fake_registry, docker):
    """Ctrl-C (SIGINT to the foreground process group) while make pull waits for the registry:
    the "stopped" line docs/distributing.md promises, exit 130, no KeyboardInterrupt traceback,
    nothing tagged."""
    reg = fake_registry(delay=30)
    proc = make("pull", *typed({}, reg.address), docker=docker, start_new_session=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, sigint_default=True)
    deadline = time.monotonic() + 20
    while not reg.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reg.requests, "make pull never asked the registry"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert re.search(r"^ERROR .*stopped \(Ctrl-C\): nothing was tagged", err, re.MULTILINE), err
    # make re-raises the SIGINT it got itself: a shell shows that as 130 too.
    assert proc.returncode in (130, -signal.SIGINT), f"exit {proc.returncode}:\n{err}"
    assert docker.tagged() is None


def test_pull_py_stopped_by_ctrl_c_exits_130(fake_registry, docker):
    """scripts/pull.py itself (what make runs) exits 130 on SIGINT, as the docs say."""
    reg = fake_registry(delay=30)
    proc = subprocess.Popen([*AS_A_TERMINALS_JOB, sys.executable, str(ROOT / "scripts" / "pull.py"), "pull", "--docker",
                             str(docker.path), "--ref", f"{reg.address}/team-dl:t1"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not reg.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "Traceback" not in err, f"exit {proc.returncode}:\n{err}"


# ---------------------------------------------------------------- the protocol Docker would speak


def test_a_loopback_registry_with_tls_is_pulled_over_https(fake_registry, docker, tmp_path):
    """A registry on 127.0.0.1 that speaks only TLS (an ssh -L tunnel to a remote registry):
    HTTPS first, as Docker does (loopback is insecure by default: an untrusted certificate is
    accepted), so make pull works where `docker pull` does."""
    reg = fake_registry(cert=registry_fakes.self_signed(tmp_path))
    result = make("pull", *typed({}, reg.address), docker=docker)
    assert result.returncode == 0, result.stderr
    assert f"pulled and verified {reg.address}/team-dl:t1 ({reg.digest})" in result.stderr, result.stderr
    assert {scheme for scheme, _ in reg.requests} == {"https"}, reg.requests


def test_a_plain_http_registry_on_loopback_still_works(fake_registry, docker):
    """The usual local registry (plain HTTP on 127.0.0.1): HTTPS fails, HTTP follows (Docker's
    fallback for an insecure registry)."""
    reg = fake_registry()
    result = make("pull", *typed({}, reg.address), docker=docker)
    assert result.returncode == 0, result.stderr
    assert docker.tagged() == f"{reg.address}/team-dl:t1"


def lan_address():
    """This host's address on its default route (no packet is sent); skip where there is none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))
        except OSError:
            pytest.skip("no non-loopback IPv4 address on this host")
        address = s.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("no non-loopback IPv4 address on this host")
    return address


@pytest.mark.parametrize("listed", ["hostname", "cidr"])
def test_an_http_registry_on_a_lan_address_listed_insecure_is_pulled_over_http(fake_registry, tmp_path, listed):
    """An HTTP-only registry on a LAN address that daemon.json lists in insecure-registries (by
    host:port, or by a CIDR holding its address): make pull speaks HTTP to it, as Docker does."""
    reg = fake_registry(host=lan_address())
    config = ({"InsecureRegistryCIDRs": ["127.0.0.0/8"], "IndexConfigs": {reg.address: {"Secure": False}}}
              if listed == "hostname" else {"InsecureRegistryCIDRs": ["127.0.0.0/8", f"{reg.server_address[0]}/32"],
                                            "IndexConfigs": {}})
    docker = registry_fakes.Docker(tmp_path, registry_config=config)
    result = make("pull", *typed({}, reg.address), docker=docker)
    assert result.returncode == 0, result.stderr
    assert docker.tagged() == f"{reg.address}/team-dl:t1", result.stderr


def test_an_http_registry_on_a_lan_address_not_listed_insecure_says_what_docker_needs(fake_registry, docker):
    """The same registry not listed insecure: Docker would refuse plain HTTP, and so does make
    pull, in one line naming insecure-registries, instead of an SSL error."""
    reg = fake_registry(host=lan_address())
    result = make("pull", *typed({}, reg.address), docker=docker)
    one_error(result, f"{reg.address} answers plain HTTP, not HTTPS")
    assert "insecure-registries" in errors(result)[0], result.stderr
    assert {scheme for scheme, _ in reg.requests} <= {"http"} and docker.tagged() is None


def test_a_lan_registry_with_an_untrusted_certificate_names_where_docker_trusts_one(fake_registry, docker,
                                                                                      tmp_path):
    """A self-signed registry on the LAN that Docker does not count as insecure: Docker refuses
    the certificate, and so does make pull, naming /etc/docker/certs.d/HOST/ca.crt."""
    address = lan_address()
    reg = fake_registry(host=address, cert=registry_fakes.self_signed(tmp_path, address))
    result = make("pull", *typed({}, reg.address), docker=docker)
    one_error(result, f"the registry {reg.address}'s certificate is not trusted")
    assert f"/etc/docker/certs.d/{reg.address}/ca.crt" in errors(result)[0], result.stderr


# ---------------------------------------------------------------- labels against the tag

GOOD_TAG = "2.6.0-cuda12.4-cudnn9-py3.11-runtime"
LABELS = {"org.opencontainers.image.version": GOOD_TAG, "team.torch.version": "2.6.0",
          "team.cuda.version": "12.4.1", "team.cudnn.version": "9.1.0.70", "team.python.version": "3.11"}


@pytest.mark.parametrize(("label", "value", "ok"), [(None, None, True), ("team.python.version", "3.10", False)],
                         ids=["labels-agree", "python-contradicts"])
def test_make_pull_refuses_an_image_whose_labels_contradict_its_tag(fake_registry, tmp_path, label, value, ok):
    """A descriptive tag says torch, CUDA, cuDNN and Python: an image whose labels say otherwise
    is not "verified" and not tagged."""
    reg = fake_registry()
    docker = registry_fakes.Docker(tmp_path, labels={**LABELS, **({label: value} if label else {})})
    result = make("pull", *typed({"TAG": GOOD_TAG}, reg.address), docker=docker)
    if ok:
        assert result.returncode == 0 and "pulled and verified" in result.stderr, result.stderr
        return
    one_error(result, f"{label}={value!r}, but the tag {GOOD_TAG} says")
    assert docker.tagged() is None, "an image whose labels contradict its tag was tagged"


@pytest.mark.parametrize(("tag", "label", "value", "says"), [
    (GOOD_TAG, "team.torch.version", "2.5.1", "says torch 2.6.0"),
    (GOOD_TAG, "team.cuda.version", "12.1", "says cuda 12.4"),
    (GOOD_TAG + "-zstd", "org.opencontainers.image.version", "2.6.0-cuda12.4-cudnn9-py3.10-runtime", "says 2.6.0"),
    (GOOD_TAG, "team.torch.version", "2.6.0+cu124", None),  # a local version: the same torch
    ("latest", "team.python.version", "3.10", None),         # a moving tag says no versions
])
def test_each_label_a_descriptive_tag_names_is_checked(tag, label, value, says):
    """tag_labels: torch, CUDA, cuDNN, Python and the version label against the tag (no make run:
    the make path is the test above)."""
    found = tag_labels.contradiction(tag, {**LABELS, label: value})
    assert (found is None) if says is None else (found and says in found and label in found), found


def every_published_tag():
    """Each tag make push publishes, for every row (descriptive, sha-<sha>[-row], moving, -zstd)."""
    tags = []
    for row in versions.DATA["matrix"]:
        base = [build_info.tag(row), build_info.sha_tag(row, "0123456789ab"), *(row.get("moving_tags") or [])]
        tags += base + [t + "-zstd" for t in base]
    return tags


def test_every_tag_the_project_publishes_passes_the_reference_check():
    """The grammar check must never refuse what make push itself publishes, or a registry's
    usual names (host:port, nested paths, digests)."""
    refs = [f"ghcr.io/acme/team-dl:{t}" for t in every_published_tag()] + [
        "127.0.0.1:5000/team-dl:x", "localhost:5000/a/b_c/d__e/f-g:x", "registry.example.com/ml/team-dl@" + DIGEST,
        "team-dl:2.6", "[::1]:5000/team-dl:x", "REGISTRY.example.com/acme/team-dl:x"]
    assert {r: reference.ref_problem(r) for r in refs if reference.ref_problem(r)} == {}
    env = {"MAKELEVEL": "1", "REGISTRY": "ghcr.io/acme", "IMAGE": "team-dl"}
    assert [t for t in every_published_tag() if reference.make_vars_problem({**env, "TAG": t})] == []
