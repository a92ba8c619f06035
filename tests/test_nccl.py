"""NCCL in the image, without a GPU: the NCCL library in the venv finds rdma-core's verbs (else it
silently uses TCP over InfiniBand/RoCE), reads /etc/nccl.conf as defaults that the environment
overrides, and picks a usable socket interface in a container. ncclGetUniqueId() is the part of
NCCL that runs without a GPU: it reads the config file and picks the bootstrap interface."""
import re

import pytest
from conftest import ROOT

CONF = ROOT / "docker" / "rootfs" / "etc" / "nccl.conf"

# Loads the venv's libnccl.so.2 (the one torch uses) and calls ncclGetUniqueId; prints its result
# and, through libc's getenv (NCCL sets variables in the C environment), what NCCL ended up with.
NCCL_PROBE = r"""
import ctypes, glob, sys
lib = glob.glob("/opt/venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2")
assert len(lib) == 1, lib
nccl = ctypes.CDLL(lib[0])
result = nccl.ncclGetUniqueId(ctypes.create_string_buffer(128))
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
print("RESULT", result, flush=True)
for name in sys.argv[1:]:
    value = libc.getenv(name.encode())
    print("ENV", name, value.decode() if value is not None else "<unset>", flush=True)
"""


def nccl_probe(run_in_image, env=None, names=(), **kwargs):
    """Run NCCL_PROBE in a fresh container: (ncclGetUniqueId's result, {name: value}, output)."""
    code, out = run_in_image(["python", "-c", NCCL_PROBE, *names], entrypoint="",
                             environment=env or {}, timeout=120, **kwargs)
    m = re.search(r"^RESULT (\d+)$", out, re.MULTILINE)
    assert code == 0 and m, f"the NCCL probe did not run ({code}):\n{out}"
    return int(m.group(1)), dict(re.findall(r"^ENV (\S+) (.*)$", out, re.MULTILINE)), out


def conf_settings():
    """/etc/nccl.conf's NAME=VALUE lines as NCCL parses them (comments and blanks skipped)."""
    lines = [ln.strip() for ln in CONF.read_text().splitlines()]
    return dict(ln.split("=", 1) for ln in lines if ln and not ln.startswith("#"))


def test_nccl_conf_holds_only_nccl_defaults_that_fit_every_cluster():
    """/etc/nccl.conf should be NCCL_* NAME=VALUE lines, none of them host-specific."""
    settings = conf_settings()
    assert settings, "/etc/nccl.conf sets nothing"
    for name, value in settings.items():
        assert re.fullmatch(r"NCCL_[A-Z0-9_]+", name) and value and " " not in value, f"{name}={value!r}"
    # These depend on the host's interfaces and HCAs; a wrong value breaks IB or the bootstrap.
    host_specific = {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_DISABLE",
                     "NCCL_NET", "NCCL_NET_PLUGIN"}
    assert not host_specific & set(settings), f"host-specific settings: {host_specific & set(settings)}"


def test_nccl_reads_the_image_defaults_and_the_environment_overrides_them(run_in_image):
    """NCCL should apply /etc/nccl.conf, and a variable set in the environment should win."""
    settings = conf_settings()
    names = sorted(settings)
    result, seen, out = nccl_probe(run_in_image, names=names)
    assert result == 0, f"ncclGetUniqueId failed ({result}):\n{out}"
    assert seen == settings, f"NCCL should have applied /etc/nccl.conf {settings}, got {seen}"
    # A user's value (docker -e, a manifest's env, an sbatch export) for each name.
    override = {name: f"{value}-user" if name != "NCCL_DEBUG" else "VERSION" for name, value in settings.items()}
    result, seen, out = nccl_probe(run_in_image, env=override, names=names)
    assert seen == override, f"the environment should override /etc/nccl.conf: {seen}"


@pytest.mark.parametrize("env, warns", [
    ({}, True),
    ({"NCCL_DEBUG": "VERSION"}, False),  # the user's choice beats the image's WARN
], ids=["image-default", "user-override"])
def test_nccl_names_the_cause_when_no_interface_fits(run_in_image, env, warns):
    """With no usable interface NCCL should fail and, by the image's default, print why."""
    # Only lo exists and the user asks for eth0: NCCL cannot bootstrap.
    result, _, out = nccl_probe(run_in_image, env={"NCCL_SOCKET_IFNAME": "eth0", **env},
                                network_mode="none")
    assert result != 0, f"ncclGetUniqueId should fail without eth0:\n{out}"
    line = "NCCL WARN Bootstrap : no socket interface found"
    assert (line in out) is warns, f"expected the WARN line: {warns}\n{out}"


@pytest.mark.parametrize("network, interface", [
    ("bridge", "eth0"),  # the container's own interface, not lo
    ("none", "lo"),  # single-node job in a container with only lo: NCCL's lo fallback is kept
])
def test_nccl_bootstrap_picks_a_usable_interface_in_a_container(run_in_image, network, interface):
    """NCCL should bootstrap on the container's interface, and on lo when that is all there is."""
    result, _, out = nccl_probe(run_in_image, env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"},
                                network_mode=network)
    assert result == 0, f"ncclGetUniqueId failed ({result}):\n{out}"
    m = re.search(r"NCCL INFO Bootstrap : Using (\w+):", out)
    assert m and m.group(1) == interface, f"expected the bootstrap on {interface}:\n{out}"


# The verbs library NCCL dlopens and the symbols it looks up in it, read from NCCL's own binary:
# NCCL (src/misc/ibvsymbols.cc) loads each ibv_X into a pointer named ibv_internal_X.
VERBS_PROBE = r"""
import ctypes, glob, re
lib = glob.glob("/opt/venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2")[0]
data = open(lib, "rb").read()
sonames = sorted({n.decode() for n in re.findall(rb"\x00(libibverbs\.so[.\d]*)\x00", data)})
symbols = sorted({"ibv_" + n.decode() for n in re.findall(rb"\x00ibv_internal_([a-z0-9_]+)\x00", data)})
print("SONAMES", " ".join(sonames))
print("SYMBOLS", len(symbols))
ctypes.CDLL(lib)
for soname in sonames:
    try:
        verbs = ctypes.CDLL(soname)
    except OSError as e:
        print("NOTFOUND", soname, e)
        continue
    print("LOADED", soname)
    for symbol in symbols:
        if not hasattr(verbs, symbol):
            print("MISSING", soname, symbol)
"""


def test_nccls_own_verbs_lookups_resolve_in_the_image(run_in_image):
    """Every libibverbs name and verbs symbol the venv's NCCL asks for should resolve."""
    code, out = run_in_image(["python", "-c", VERBS_PROBE], entrypoint="", timeout=120)
    sonames = re.search(r"^SONAMES (.*)$", out, re.MULTILINE)
    symbols = re.search(r"^SYMBOLS (\d+)$", out, re.MULTILINE)
    assert code == 0 and sonames and symbols, f"the probe did not run ({code}):\n{out}"
    assert "libibverbs.so.1" in sonames.group(1).split(), f"NCCL asks for other names: {sonames.group(1)}"
    assert int(symbols.group(1)) >= 10, f"found too few of NCCL's verbs lookups:\n{out}"
    assert "LOADED libibverbs.so.1" in out, f"NCCL's dlopen of libibverbs.so.1 would fail:\n{out}"
    assert "MISSING" not in out, f"symbols NCCL needs are missing:\n{out}"
