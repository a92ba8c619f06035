#!/usr/bin/env python3
"""Turn the pinned facts about the real base image (tests/data/nvidia-cuda-*.json, named by
versions.json's `base_facts`) into the Debian stand-in, so there is one copy of them.

Usage: base_facts.py import-changes FACTS
           print the `docker import --change` values (ENV, LABEL, CMD, ENTRYPOINT), NUL-separated
       base_facts.py standin-root FACTS ROOT DEBDIR ARCH
           write the base's files into the debootstrap tree ROOT: files no package owns go in
           directly; package-owned ones become small .deb files in DEBDIR (built with dpkg-deb,
           architecture ARCH), for `dpkg -i` inside ROOT, so the stand-in's dpkg database has
           the same cuda-* packages as the real base and removing them works the same way
"""
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys

# ELF e_machine for the stand-in libraries: the host's architecture, as debootstrap's.
MACHINES = {"amd64": 62, "arm64": 183}


def load(path):
    return json.loads(pathlib.Path(path).read_text())


def standin_text(facts, text):
    """The real content with the stand-in's deliberate changes (an unresolvable NVIDIA host)."""
    for old, new in facts["standin"]["replace"].items():
        text = text.replace(old, new)
    return text


def import_changes(facts):
    # Dockerfile syntax: ENV/LABEL values in double quotes (JSON escaping is valid there).
    changes = [f"ENV {e.split('=', 1)[0]}={json.dumps(e.split('=', 1)[1])}" for e in facts["Env"]]
    changes += [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in facts["Labels"].items()]
    if facts.get("Cmd"):
        changes.append(f"CMD {json.dumps(facts['Cmd'])}")
    if facts.get("Entrypoint"):
        changes.append(f"ENTRYPOINT {json.dumps(facts['Entrypoint'])}")
    return changes


def elf_with_soname(soname, machine):
    """A minimal ELF64 shared object whose only content is its SONAME: enough for ldconfig to
    list it in the loader cache under that name, as it lists NVIDIA's real library. Layout:
    header, PT_LOAD + PT_DYNAMIC, a dynamic section (SONAME, STRTAB, STRSZ, NULL), strings."""
    strtab = b"\0" + soname.encode() + b"\0"
    ehsize, phsize, dynsize = 64, 56, 16
    dyn_off = ehsize + 2 * phsize
    str_off = dyn_off + 4 * dynsize
    size = str_off + len(strtab)
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little endian, SysV
    header += struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, ehsize, 0, 0, ehsize, phsize, 2, 64, 0, 0)
    load = struct.pack("<IIQQQQQQ", 1, 4, 0, 0, 0, size, size, 0x1000)              # PT_LOAD, R
    dynamic = struct.pack("<IIQQQQQQ", 2, 6, dyn_off, dyn_off, dyn_off, 4 * dynsize, 4 * dynsize, 8)
    entries = struct.pack("<qQqQqQqQ", 14, 1, 5, str_off, 10, len(strtab), 0, 0)    # SONAME, STRTAB, STRSZ, NULL
    return header + load + dynamic + entries + strtab


def write_entry(facts, entry, root, machine):
    """Create one `files` entry under root (a debootstrap tree or a package's data tree)."""
    dest = root / entry["path"].lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if entry["type"] == "symlink":
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        os.symlink(entry["target"], dest)
        return
    if entry["type"] == "dir":
        dest.mkdir(exist_ok=True)
        return
    if "contains_line" in entry:
        # A setting in a distribution file: replace the key's line (commented or not), or add it.
        key = entry["contains_line"].split()[0]
        lines = dest.read_text().splitlines() if dest.exists() else []
        kept = [ln for ln in lines if ln.lstrip("#").split()[:1] != [key]]
        dest.write_text("\n".join([*kept, entry["contains_line"]]) + "\n")
    elif "copy_of" in entry and (root / entry["copy_of"].lstrip("/")).exists():
        shutil.copy2(root / entry["copy_of"].lstrip("/"), dest)
    elif "elf_soname" in entry:
        dest.write_bytes(elf_with_soname(entry["elf_soname"], machine))
    elif "content" in entry:
        dest.write_text(standin_text(facts, entry["content"]))
    else:
        dest.write_text(f"Stand-in for {entry['path']} of {facts['image']} (not the real file).\n")
    if "group" in entry:
        os.chown(dest, 0, group_id(root, entry["group"]))
    os.chmod(dest, int(entry.get("mode", "0644"), 8))


def group_id(root, name):
    for line in (root / "etc/group").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return int(fields[2])
    sys.exit(f"base_facts.py: no group {name!r} in {root}/etc/group")


def build_deb(facts, name, info, entries, debdir, arch, machine):
    """A small .deb named like NVIDIA's package, holding its entries and maintainer scripts."""
    tree = debdir / f"{name}.tree"
    (tree / "DEBIAN").mkdir(parents=True)
    for entry in entries:
        if entry.get("made_by") != "postinst":  # e.g. the alternatives links: made when installed
            write_entry(facts, entry, tree, machine)
    version = info.get("version") or "0~standin"
    control = [f"Package: {name}", f"Version: {version}", f"Architecture: {info.get('architecture', arch)}",
               "Maintainer: team-dl stand-in <noreply@invalid>",
               f"Description: stand-in for {name} of {facts['image']}"]
    if info.get("depends"):
        control.append(f"Depends: {info['depends']}")
    (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
    conffiles = [e["path"] for e in entries if e.get("conffile")]
    if conffiles:
        (tree / "DEBIAN/conffiles").write_text("\n".join(conffiles) + "\n")
    for script, when in (("postinst", "configure"), ("prerm", "remove")):
        if info.get(script):
            path = tree / "DEBIAN" / script
            path.write_text(f'#!/bin/sh\nset -e\nif [ "$1" = {when} ]; then\n{info[script]}\nfi\n')
            path.chmod(0o755)
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(debdir / f"{name}.deb")],
                   check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(tree)


def standin_root(facts, root, debdir, arch):
    machine = MACHINES.get(arch)
    if machine is None:
        sys.exit(f"base_facts.py: no stand-in libraries for architecture {arch!r} (have {sorted(MACHINES)})")
    debdir.mkdir(parents=True, exist_ok=True)
    by_package = {}
    for entry in facts["files"]:
        if entry.get("package"):
            by_package.setdefault(entry["package"], []).append(entry)
        else:
            write_entry(facts, entry, root, machine)
    for name, info in facts["packages"].items():
        build_deb(facts, name, info, by_package.pop(name, []), debdir, arch, machine)
    if by_package:
        sys.exit(f"base_facts.py: files name packages that `packages` lacks: {sorted(by_package)}")


def main(argv):
    if len(argv) == 2 and argv[0] == "import-changes":
        sys.stdout.write("".join(c + "\0" for c in import_changes(load(argv[1]))))
    elif len(argv) == 5 and argv[0] == "standin-root":
        standin_root(load(argv[1]), pathlib.Path(argv[2]), pathlib.Path(argv[3]), argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
