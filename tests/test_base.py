"""The base image: what nvidia/cuda:*-base brings that the image removes or overrides (forward-
compat libcuda, a second libcudart, /usr/local/cuda without nvcc, NVIDIA_REQUIRE_CUDA, NVIDIA's
apt source, Ubuntu's login noise, setgid helpers, home mode), the Debian stand-in's fidelity to
the pinned facts of the real base, and pinning the base by digest (make mirror-base).

Every image test runs against the image under test, whichever base built it; the stand-in's
own test skips, saying why, when the image was built on the real base."""
import json
import os
import re
import subprocess

import pytest
import requests
from conftest import ROOT
from ssh_client import Key, ssh_connect, start_with_ssh
from test_publish import make

import docker

VERSIONS = json.loads((ROOT / "versions.json").read_text())
ROW = next(r for r in VERSIONS["matrix"] if r["name"] == VERSIONS["default"])
FACTS = json.loads((ROOT / ROW["base_facts"]).read_text())


def versions_py(*args, root=ROOT):
    return subprocess.run(["python3", str(root / "scripts" / "versions.py"), *args],
                          capture_output=True, text=True, check=False)


def build_arg(name):
    out = subprocess.run(["python3", str(ROOT / "scripts" / "build_info.py"), "build-args"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines())[name]


def as_root(run_in_image, script, **kwargs):
    code, out = run_in_image(["bash", "-c", script], entrypoint=[], user="root", **kwargs)
    assert code == 0, out
    return out


# --- what the base ships and the image must not keep --------------------------------------


def test_no_forward_compat_libcuda_in_the_image(run_in_image):
    """Image should hold no libcuda* at all (only the toolkit mounts the host's) and no compat dir:
    NVIDIA's toolkit would put cuda-compat first in the loader path on old drivers (error 804)."""
    out = as_root(run_in_image, "find / -xdev \\( -name 'libcuda.so*' -o -name 'libcudadebugger.so*' "
                  "-o -path '*/cuda*/compat' \\) -print 2>/dev/null; echo probe-done")
    assert "probe-done" in out, out
    found = [line for line in out.splitlines() if line.startswith("/")]
    assert not found, f"forward-compat driver files in the image: {found}"
    _, out = run_in_image(["dpkg-query", "-W", "-f", "${db:Status-Status} ${Package}\\n", "cuda-compat-*"],
                          entrypoint=[])
    assert not re.search(r"^installed ", out, re.MULTILINE), f"a cuda-compat package is installed:\n{out}"


def test_only_the_wheels_cuda_runtime_and_no_cuda_home(run_in_image):
    """Image should have no system libcudart (the wheels' only, none in the loader cache) and no
    /usr/local/cuda without nvcc, so torch.utils.cpp_extension finds no CUDA_HOME instead of a wrong one."""
    out = as_root(run_in_image, (
        "find / -xdev -name 'libcudart*' 2>/dev/null | sed 's/^/cudart: /'; "
        "ldconfig -p | grep -i cudart | sed 's/^/cache: /'; "
        "ls -d /usr/local/cuda* /etc/ld.so.conf.d/*cuda* 2>/dev/null | sed 's/^/path: /'; "
        "python -c 'from torch.utils.cpp_extension import CUDA_HOME; print(\"CUDA_HOME:\", CUDA_HOME)'"))
    cudart = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("cudart: ")]
    assert cudart, f"no libcudart at all, the probe is broken (torch needs the wheel's):\n{out}"
    system = [path for path in cudart if not path.startswith("/opt/venv/")]
    assert not system, f"a CUDA runtime besides the wheels': {system}"
    assert "cache: " not in out, f"the loader cache offers a libcudart:\n{out}"
    assert "path: " not in out, f"/usr/local/cuda* or its loader configuration is left:\n{out}"
    assert "CUDA_HOME: None" in out, f"torch.utils.cpp_extension should find no CUDA_HOME:\n{out}"


def _dsl_holds(requirement, props):
    """libnvidia-container's check of one NVIDIA_REQUIRE_* value (src/cli/dsl.c): a space
    separates alternatives, a comma joins conditions; versions compare number by number."""
    def version(v):
        return [int(x) for x in v.split(".")]

    def holds(condition):
        name, op, value = re.fullmatch(r"([a-z]+)(>=|<=|!=|=|<|>)(.+)", condition).groups()
        if name == "brand":
            return (props[name].lower() == value.lower()) == (op == "=")
        a, b = version(props[name]), version(value)
        width = max(len(a), len(b))
        a, b = a + [0] * (width - len(a)), b + [0] * (width - len(b))
        return {">=": a >= b, "<=": a <= b, "=": a == b, "!=": a != b, "<": a < b, ">": a > b}[op]

    terms = [t for t in requirement.split(" ") if t]
    return not terms or any(all(holds(c) for c in t.split(",") if c) for t in terms)


# (driver, the CUDA version that driver reports): release drivers from 470 to 580.
DRIVERS = [("470.256.02", "11.4"), ("520.61.05", "11.8"), ("525.60.11", "12.0"),
           ("525.60.13", "12.0"), ("525.147.05", "12.0"), ("530.30.02", "12.1"),
           ("535.183.01", "12.2"), ("545.29.06", "12.3"), ("550.54.15", "12.4"),
           ("570.133.07", "12.8"), ("580.95.05", "13.0")]


def test_nvidia_require_cuda_admits_exactly_the_drivers_the_wheels_run_on(image):
    """The image's NVIDIA_REQUIRE_CUDA should come from versions.json (min_driver) and, read as the
    NVIDIA Container Toolkit reads it, admit every driver from min_driver on, on GeForce and data
    center GPUs alike, and refuse every older one (the base's admitted 470 and refused 530/545)."""
    env = dict(item.split("=", 1) for item in image.attrs["Config"]["Env"])
    value = env.get("NVIDIA_REQUIRE_CUDA", "")
    assert value == build_arg("NVIDIA_REQUIRE_CUDA"), \
        f"NVIDIA_REQUIRE_CUDA={value!r}, versions.json gives {build_arg('NVIDIA_REQUIRE_CUDA')!r}"
    floor = [int(x) for x in ROW["min_driver"].split(".")]
    wrong = []
    for driver, cuda in DRIVERS:
        for brand in ("geforce", "tesla", "nvidiartx"):
            admitted = _dsl_holds(value, {"driver": driver, "cuda": cuda, "brand": brand})
            if admitted != ([int(x) for x in driver.split(".")] >= floor):
                wrong.append(f"{brand} {driver}: {'admitted' if admitted else 'refused'}")
    assert not wrong, f"NVIDIA_REQUIRE_CUDA={value!r} decides wrongly for: {wrong}"
    # The start-up check warns below the same floor: tests/test_lifecycle.py, test_gpu_checks_*.


def test_the_requirement_reader_matches_the_toolkit_on_the_bases_value():
    """The reader above should judge NVIDIA's own value as the toolkit does (its documented
    behaviour: 530 refused, 470 and 535 admitted through their brand branches), or it proves nothing."""
    base = next(e.split("=", 1)[1] for e in FACTS["Env"] if e.startswith("NVIDIA_REQUIRE_CUDA="))
    assert not _dsl_holds(base, {"driver": "530.30.02", "cuda": "12.1", "brand": "geforce"})
    assert _dsl_holds(base, {"driver": "470.256.02", "cuda": "11.4", "brand": "geforce"})
    assert _dsl_holds(base, {"driver": "535.183.01", "cuda": "12.2", "brand": "tesla"})
    assert _dsl_holds(base, {"driver": "550.54.15", "cuda": "12.4", "brand": "geforce"})


def test_image_has_no_nvidia_apt_source(run_in_image):
    """Image should leave apt pointing at the distribution's archive only (NVIDIA's source gone)."""
    out = as_root(run_in_image, "grep -rl 'nvidia' /etc/apt/sources.list /etc/apt/sources.list.d/ || true; echo probe-done")
    assert out.strip() == "probe-done", f"NVIDIA's apt source is still configured:\n{out}"


APT_STUB = """#!/bin/sh
case " $* " in *" update "*)
  echo "update-args: $*"
  grep -rh '^deb' /etc/apt/sources.list.d/ | sed 's/^/update-saw: /' ;;
esac
exit 0
"""


def test_apt_install_drops_nvidia_sources_before_updating(run_in_image):
    """docker/build/apt-install.sh should remove NVIDIA's apt source before `apt-get update`
    (keeping other sources) and make a failed index download an error (--error-on=any)."""
    build = str(ROOT / "docker" / "build")
    script = (
        "mkdir -p /tmp/stub && cat > /tmp/stub/apt-get <<'EOF'\n" + APT_STUB + "EOF\n"
        "chmod +x /tmp/stub/apt-get\n"
        "echo 'deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/ /'"
        " > /etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list\n"
        "echo 'deb http://mirror.example.invalid/debian bookworm main' > /etc/apt/sources.list.d/site.list\n"
        "PATH=/tmp/stub:$PATH /build/apt-install.sh some-package && echo apt-install-ok\n"
    )
    out = as_root(run_in_image, script, volumes={build: {"bind": "/build", "mode": "ro"}})
    assert "apt-install-ok" in out and "update-args:" in out, f"apt-get update was not run:\n{out}"
    saw = [line for line in out.splitlines() if line.startswith("update-saw: ")]
    assert saw == ["update-saw: deb http://mirror.example.invalid/debian bookworm main"], \
        f"apt-get update should see the site's source and not NVIDIA's: {saw}"
    assert "--error-on=any" in out, f"a failed index download must fail the update:\n{out}"


def test_setgid_helpers_the_base_adds_lose_their_bit(run_in_image):
    """Image should strip setuid/setgid from files the base adds beyond Debian's (Ubuntu's
    pam_extrausers_chkpwd), found by a search, not a fixed list (the allow-list test covers all)."""
    out = as_root(run_in_image, "stat -c '%a %n' /usr/sbin/pam_extrausers_chkpwd 2>/dev/null; echo probe-done")
    mode = out.split()[0] if not out.startswith("probe-done") else None
    if mode is None:
        pytest.skip("this base has no /usr/sbin/pam_extrausers_chkpwd (the stand-in and Ubuntu have one)")
    assert int(mode, 8) & 0o6000 == 0, f"pam_extrausers_chkpwd keeps setuid/setgid: mode {mode}"


def test_home_is_private_to_the_user(run_in_image):
    """Image should make dev's home 0750 on any base (Ubuntu's HOME_MODE; Debian's useradd says 0755)."""
    out = as_root(run_in_image, "stat -c '%a %U' /home/dev")
    assert out.split() == ["750", "dev"], f"/home/dev is {out.strip()}"


def test_no_other_account_shares_the_users_uid_or_gid(run_in_image):
    """Image should have dev alone on its UID and GID: a base's own account there (ubuntu:24.04's
    `ubuntu` on 1000:1000) would own dev's files under another name and take its group."""
    out = as_root(run_in_image, "id -u dev; id -g dev; getent passwd; echo ==; getent group")
    uid, gid, rest = out.split("\n", 2)
    passwd, group = rest.split("==\n")
    same_uid = [line.split(":")[0] for line in passwd.splitlines() if line.split(":")[2:3] == [uid]]
    same_gid = [line.split(":")[0] for line in group.splitlines() if line.split(":")[2:3] == [gid]]
    assert same_uid == ["dev"] and same_gid == ["dev"], f"UID {uid}: {same_uid}; GID {gid}: {same_gid}"


def test_ssh_login_prints_no_motd_legal_notice_or_banner(start_container):
    """An interactive SSH login should print no banner, MOTD, 'minimized' notice or legal text:
    only the prompt (and sshd's 'Last login' line on later logins)."""
    key = Key()
    c = start_with_ssh(start_container, key.public)
    client = ssh_connect(c, key.pkey)
    assert not client.get_transport().get_banner(), "sshd sends a pre-login banner"
    channel = client.invoke_shell(term="xterm-256color", width=200, height=50)
    channel.settimeout(30)
    # Everything the login prints comes before the shell's first prompt: read up to it, then
    # prove the shell answers.
    login = ""
    while not re.search(r"[$#] $", strip_ansi(login)):
        login += channel.recv(65536).decode(errors="replace")
    channel.send("echo MARK-$((40+2))\n")
    rest = ""
    while "MARK-42" not in rest:
        rest += channel.recv(65536).decode(errors="replace")
    client.close()
    lines = strip_ansi(login).splitlines()
    noise = [ln for ln in lines[:-1] if ln.strip() and not ln.startswith("Last login:")]
    assert not noise, "text before the first prompt:\n" + "\n".join(noise)
    for text in ("minimized", "unminimize", "NO WARRANTY", "free software"):
        assert text not in login + rest, f"login output contains {text!r}:\n{login}{rest}"


def strip_ansi(text):
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r", "", text)


# --- the stand-in looks like the real base ------------------------------------------------

PROBE = r"""
p=$1
if [ -L "$p" ]; then echo "symlink $(readlink "$p")"
elif [ -d "$p" ]; then echo "dir"
elif [ -f "$p" ]; then echo "file $(stat -c '%a %G' "$p") $(base64 -w0 < "$p" | head -c 65536)"
else echo "missing"; fi
"""


def _standin(docker_client, image):
    if image.labels.get("team.base.standin") != "true":
        pytest.skip("the image under test was built on the real base (no team.base.standin label): "
                    "there is no stand-in to compare with the pinned facts")
    ref = os.environ.get("BASE_IMAGE") or VERSIONS["standin"]["image"]
    try:
        return ref, docker_client.images.get(ref)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the image under test was built on the stand-in, but {ref} is not here: make base-standin")


def test_standin_carries_the_real_bases_env_labels_and_cmd(docker_client, image):
    """The stand-in should have exactly the real base's Env (order too), its Labels (plus
    team.base.standin*), Cmd and Entrypoint, as pinned in the facts file."""
    _, standin = _standin(docker_client, image)
    config = standin.attrs["Config"]
    assert config["Env"] == FACTS["Env"], f"stand-in Env {config['Env']} differs from the pinned {FACTS['Env']}"
    labels = config["Labels"] or {}
    extra = {k for k in labels if k not in FACTS["Labels"] and not k.startswith("team.base.standin")}
    assert {k: labels.get(k) for k in FACTS["Labels"]} == FACTS["Labels"] and not extra, \
        f"stand-in labels {labels} differ from the pinned {FACTS['Labels']}"
    assert config["Cmd"] == FACTS["Cmd"] and config["Entrypoint"] == FACTS["Entrypoint"], \
        f"Cmd/Entrypoint {config['Cmd']}/{config['Entrypoint']} differ from the pinned ones"


def test_standin_has_the_real_bases_files_packages_and_loader_cache(docker_client, image):
    """The stand-in should have every pinned file (type, link target, content, mode, group),
    the cuda-* packages in dpkg's database, and libcudart in the loader cache like the real base."""
    import base64

    ref, _ = _standin(docker_client, image)
    script = "probe() {" + PROBE + "}\n" + "".join(
        f"echo \"== {e['path']}\"; probe '{e['path']}'\n" for e in FACTS["files"])
    script += "echo '== dpkg'; dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n' 'cuda-*'\n"
    script += "echo '== cache'; ldconfig -p | grep -o 'lib[a-z]*\\.so\\.[0-9]*' | sort -u\n"
    out = docker_client.containers.run(ref, ["bash", "-c", script], remove=True).decode()
    sections = dict(re.findall(r"^== (\S+)\n(.*?)(?=^== |\Z)", out, re.MULTILINE | re.DOTALL))
    wrong = []
    for e in FACTS["files"]:
        got = sections.get(e["path"], "missing").strip().split(" ", 3)
        if got[0] != e["type"]:
            wrong.append(f"{e['path']}: {got[0]}, pinned {e['type']}")
        elif e["type"] == "symlink" and got[1] != e["target"]:
            wrong.append(f"{e['path']} -> {got[1]}, pinned -> {e['target']}")
        elif e["type"] == "file":
            mode, group, data = got[1], got[2], base64.b64decode(got[3] if len(got) > 3 else "")
            text = data.decode(errors="replace")
            if "content" in e:
                expected = e["content"]
                for old, new in FACTS["standin"]["replace"].items():
                    expected = expected.replace(old, new)
                if text != expected:
                    wrong.append(f"{e['path']}: content {text!r}, pinned {expected!r}")
            if "elf_soname" in e and not (data.startswith(b"\x7fELF") and e["elf_soname"].encode() in data):
                wrong.append(f"{e['path']}: no ELF object with SONAME {e['elf_soname']}")
            if "contains_line" in e and e["contains_line"] not in text.splitlines():
                wrong.append(f"{e['path']}: no line {e['contains_line']!r}")
            if "mode" in e and mode != e["mode"].lstrip("0"):
                wrong.append(f"{e['path']}: mode {mode}, pinned {e['mode']}")
            if "group" in e and group != e["group"]:
                wrong.append(f"{e['path']}: group {group}, pinned {e['group']}")
    installed = {line.split()[0]: line.split()[1] for line in sections.get("dpkg", "").splitlines()
                 if line.endswith(" installed")}
    for name, info in FACTS["packages"].items():
        if name not in installed:
            wrong.append(f"package {name} not installed")
        elif info.get("version") and installed[name] != info["version"]:
            wrong.append(f"package {name} {installed[name]}, pinned {info['version']}")
    if "libcudart.so.12" not in sections.get("cache", ""):
        wrong.append("libcudart.so.12 is not in the loader cache (000_cuda.conf puts it there on the real base)")
    assert not wrong, f"the stand-in {ref} differs from {ROW['base_facts']} (FORCE=1 make base-standin):\n" + "\n".join(wrong)


# --- every row's base, as its facts file pins it -----------------------------------------


@pytest.mark.parametrize("row", VERSIONS["matrix"], ids=[r["name"] for r in VERSIONS["matrix"]])
def test_each_row_names_the_facts_of_its_own_base(row):
    """A versions.json row should point at the facts file of its own base, and repeat what that
    base is: the image, its CUDA_VERSION, the Ubuntu release, python3 (the wheels' Python, the
    tag's pyX.Y) and glibc (the manylinux tags scripts/check_wheels.py asks for)."""
    facts = json.loads((ROOT / row["base_facts"]).read_text())
    env = dict(e.split("=", 1) for e in facts["Env"])
    have = {"base_image": facts["image"], "cuda_full": env.get("CUDA_VERSION"),
            "ubuntu": facts["os"]["ubuntu"], "python": facts["os"]["python3"], "glibc": facts["os"]["glibc"]}
    wrong = {k: f"row {row[k]!r}, facts {v!r}" for k, v in have.items() if row[k] != v}
    assert not wrong, f"row {row['name']} and {row['base_facts']} disagree: {wrong}"


FACTS_FILES = sorted({r["base_facts"] for r in VERSIONS["matrix"]})


def _accounts_root(tmp_path, accounts):
    """A base's account files, for shadow's --prefix: root, the `users` group, and the login
    accounts the facts file says the base ships (with their homes)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    passwd, group = ["root:x:0:0:root:/root:/bin/bash"], ["root:x:0:", "shadow:x:42:", "users:x:100:"]
    for a in accounts:
        passwd.append(f"{a['name']}:x:{a['uid']}:{a['gid']}:{a['gecos']}:{a['home']}:{a['shell']}")
        group.append(f"{a['group']}:x:{a['gid']}:")
        home = tmp_path / a["home"].lstrip("/")
        home.mkdir(parents=True)
        os.chown(home, a["uid"], a["gid"])
    (etc / "passwd").write_text("\n".join(passwd) + "\n")
    (etc / "group").write_text("\n".join(group) + "\n")
    (etc / "shadow").write_text("".join(f"{line.split(':')[0]}:*:19000:0:99999:7:::\n" for line in passwd))
    (etc / "gshadow").write_text("".join(f"{line.split(':')[0]}:*::\n" for line in group))
    (etc / "login.defs").write_text("UID_MIN 1000\nGID_MIN 1000\nUSERGROUPS_ENAB yes\n")
    return tmp_path


@pytest.mark.skipif(os.geteuid() != 0, reason="useradd --prefix chowns the new home: needs root")
@pytest.mark.parametrize("facts_file", FACTS_FILES)
def test_the_image_user_takes_its_uid_on_every_rows_base(facts_file, tmp_path):
    """docker/build/add-user.sh should make dev 1000:1000 (home 0750, in `users`) on each row's base,
    also where the base ships its own account on those IDs (ubuntu:24.04's `ubuntu`), which must go."""
    accounts = json.loads((ROOT / facts_file).read_text())["accounts"]
    root = _accounts_root(tmp_path, accounts)
    out = subprocess.run([str(ROOT / "docker" / "build" / "add-user.sh"), "dev", "1000", "1000"],
                         env={**os.environ, "ACCOUNTS_PREFIX": str(root)}, capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"add-user.sh failed on {facts_file}'s accounts {accounts}:\n{out.stdout}{out.stderr}"
    passwd = [line.split(":") for line in (root / "etc/passwd").read_text().splitlines()]
    group = [line.split(":") for line in (root / "etc/group").read_text().splitlines()]
    assert [p[0] for p in passwd if p[2] == "1000"] == ["dev"], f"UID 1000 is not dev's alone: {passwd}"
    assert [g[0] for g in group if g[2] == "1000"] == ["dev"], f"GID 1000 is not dev's alone: {group}"
    assert "dev" in next(g for g in group if g[0] == "users")[3].split(","), "dev is not in group users"
    home = root / "home" / "dev"
    assert home.is_dir() and (home.stat().st_mode & 0o777) == 0o750, "dev's home is missing or not 0750"
    left = [a["home"] for a in accounts if (root / a["home"].lstrip("/")).exists()]
    assert not left, f"the removed account's home is left: {left}"


# --- the base pinned by digest, and a copy of it in the team's registry -------------------


def test_builds_use_the_base_pinned_by_digest():
    """make build, versions.py (CI) and the Dockerfile's default should all use base_image@digest."""
    digest = ROW["base_image_digest"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"versions.json base_image_digest is {digest!r}"
    pinned = f"{ROW['base_image']}@{digest}"
    out = versions_py("base-image", "--require-digest")
    assert out.returncode == 0 and out.stdout.strip() == pinned, out.stdout + out.stderr
    assert build_arg("BASE_IMAGE") == pinned
    dry = make("-n", "build")
    assert f"--build-arg BASE_IMAGE={pinned} " in dry.stdout, f"make build does not use {pinned}:\n{dry.stdout}"
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE={pinned}\n" in dockerfile, "the Dockerfile's default BASE_IMAGE is not the pinned one"
    assert f"ARG NVIDIA_REQUIRE_CUDA={build_arg('NVIDIA_REQUIRE_CUDA')}\n" in dockerfile, \
        "the Dockerfile's default NVIDIA_REQUIRE_CUDA differs from versions.json's"
    # The release builds on a digest only: the pin, else the one its setup job resolved for an
    # unpinned row (trust on first use, docs/publishing.md); a base still without one stops it.
    release = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert "versions.py base-image" in release and "scripts/base_bump.py bases" in release, \
        "the release workflow neither reads the pin nor resolves an unpinned base's digest"
    assert "has no base digest" in release and "*@sha256:*) ;;" in release, \
        "the release workflow would build on a base without a digest"


def test_an_unpinned_base_is_refused_for_release(tmp_path):
    """versions.py base-image --require-digest (the release workflow's check) should fail, saying
    what to do, when versions.json has no digest for the base."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "versions.py").write_text((ROOT / "scripts" / "versions.py").read_text())
    data = json.loads((ROOT / "versions.json").read_text())
    for r in data["matrix"]:
        r["base_image_digest"] = ""
    (tmp_path / "versions.json").write_text(json.dumps(data))
    out = versions_py("base-image", "--require-digest", root=tmp_path)
    assert out.returncode != 0 and "base_image_digest" in out.stderr, out.stdout + out.stderr
    unpinned = versions_py("base-image", root=tmp_path)
    assert unpinned.stdout.strip() == ROW["base_image"], "without a digest the plain tag is used"


def _base_of(docker_client, image):
    """The image the image under test was built on: the stand-in here, nvidia/cuda in CI."""
    ref = os.environ.get("BASE_IMAGE") or versions_py("base-image").stdout.strip()
    if "@" in ref:  # name:tag@digest: Docker's image store knows it as name@digest
        name, digest = ref.split("@", 1)
        if ":" in name.rsplit("/", 1)[-1]:
            name = name.rsplit(":", 1)[0]
        ref = f"{name}@{digest}"
    try:
        return docker_client.images.get(ref)
    except docker.errors.ImageNotFound:
        # BuildKit keeps the bases it pulls to itself: fetch it into Docker's store.
        subprocess.run(["/usr/bin/docker", "pull", ref], check=True, capture_output=True)
        return docker_client.images.get(ref)


MANIFEST_TYPES = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"


def _registry_digest(registry, repo, ref):
    r = requests.head(f"http://{registry}/v2/{repo}/manifests/{ref}", headers={"Accept": MANIFEST_TYPES}, timeout=10)
    return r.headers.get("Docker-Content-Digest") if r.status_code == 200 else None


def test_mirror_base_copies_the_base_by_digest_and_survives_the_upstream_tag(local_registry,
                                                                              docker_client, image):
    """make mirror-base should pull the pinned digest, push it to REGISTRY and print the copy's
    reference; after the upstream manifest is deleted, the copy is still whole: the same image."""
    base = _base_of(docker_client, image)
    tag = ROW["base_image"].rsplit(":", 1)[1]
    upstream = f"{local_registry}/upstream/cuda"
    base.tag(upstream, tag)
    docker_client.images.push(upstream, tag)
    digest = _registry_digest(local_registry, "upstream/cuda", tag)
    assert digest, "the stand-in upstream was not published"

    result = make("mirror-base", f"REGISTRY={local_registry}/team", f"BASE_UPSTREAM={upstream}:{tag}",
                  f"BASE_DIGEST={digest}")
    assert result.returncode == 0, f"make mirror-base failed:\n{result.stdout}\n{result.stderr}"
    mirror = f"{local_registry}/team/upstream/cuda"
    printed = result.stdout.strip().splitlines()[-1]
    match = re.fullmatch(rf"{re.escape(mirror)}:{re.escape(tag)}@(sha256:[0-9a-f]{{64}})", printed)
    assert match, f"make mirror-base printed no mirrored reference:\n{result.stdout}"
    assert _registry_digest(local_registry, "team/upstream/cuda", tag) == match.group(1), \
        "the registry's tag is not at the printed digest"

    # The upstream tag disappears (NVIDIA removes end-of-life tags); the copy stays complete in the
    # team's registry: its manifest names the base's config (the image ID) and every layer is there.
    # (Asked of the registry itself: a local `docker pull` by digest may be answered from the cache.)
    deleted = requests.delete(f"http://{local_registry}/v2/upstream/cuda/manifests/{digest}", timeout=10)
    assert deleted.status_code == 202, f"could not delete the upstream manifest: {deleted.status_code}"
    assert _registry_digest(local_registry, "upstream/cuda", digest) is None, "the upstream copy is still served"
    manifest = requests.get(f"http://{local_registry}/v2/team/upstream/cuda/manifests/{match.group(1)}",
                            headers={"Accept": MANIFEST_TYPES}, timeout=10).json()
    assert manifest["config"]["digest"] == base.id, f"the mirror holds {manifest['config']['digest']}, the base is {base.id}"
    missing = [layer["digest"] for layer in manifest["layers"]
               if requests.head(f"http://{local_registry}/v2/team/upstream/cuda/blobs/{layer['digest']}",
                                timeout=10).status_code != 200]
    assert not missing, f"layers missing from the mirror: {missing}"


def test_mirror_base_refuses_without_registry_or_digest(local_registry):
    """make mirror-base should refuse, saying what to set, with no REGISTRY or no pinned digest."""
    no_registry = make("mirror-base", "REGISTRY=")
    assert no_registry.returncode != 0 and "REGISTRY" in no_registry.stderr, no_registry.stderr
    no_digest = make("mirror-base", f"REGISTRY={local_registry}/team", "BASE_DIGEST=")
    assert no_digest.returncode != 0 and "base_image_digest" in no_digest.stderr, no_digest.stderr
