#!/usr/bin/env python3
"""Build-time helper (bind-mounted, never in a layer): turns what the build made into trees that
the runtime stage COPYs as layers, split by how often they change and byte-identical from one
build of a commit to the next (docs/building.md: Layers and reproducible builds).

Usage: layer-trees.py split-venv VENV OUT
           Move the torch group's files out of VENV's site-packages into OUT/<layer>/VENV/...
           (layers: nvidia = nvidia-* and cuda-*, torch = torch* and triton), leaving a .pth so that the
           build's next pip step still sees them; everything else stays in VENV.
       layer-trees.py unsplit VENV
           Remove that .pth again (the runtime stage joins the trees at VENV itself).
       layer-trees.py compile ROOT PATH...
           Byte-compile the .py files under ROOT/PATH (each PATH as the image will see it) with
           the image's paths in them; a symlink's target is read inside ROOT.
       layer-trees.py normalize ROOT...
           Set every mtime under each ROOT (itself included) to EPOCH, and the source mtime that
           each timestamp-based .pyc records to EPOCH too, so the .pyc stays valid.

Layers are diffs of file trees: a file's or directory's mtime and owner and mode are part of it,
so two builds minutes apart differ everywhere unless these are normalized. The epoch is fixed,
not the commit's time: a new commit that changes nothing in Python must give the same layers.
"""
import fnmatch
import importlib.metadata
import importlib.util
import os
import pathlib
import py_compile
import re
import struct
import sys

# 1980-01-01T00:00:00Z: the earliest time a zip file can hold, so a wheel or zip made from files
# of the image never fails on their dates.
EPOCH = 315532800
# Layer name -> distribution name patterns, in the order the runtime stage copies them (the one
# that changes least first). cuda-*: CUDA 13's wheels (cuda-toolkit, cuda-bindings,
# cuda-pathfinder), tied to the CUDA version like nvidia-*. torch's other dependencies (numpy,
# sympy, ...) are in the rest layer.
LAYERS = {"nvidia": ["nvidia-*", "cuda-*"], "torch": ["torch*", "triton"]}
PTH = "_team_build_layers.pth"


def _site(venv):
    found = sorted(pathlib.Path(venv).glob("lib/python3*/site-packages"))
    if len(found) != 1:
        sys.exit(f"layer-trees: expected one lib/python3*/site-packages in {venv}, found {found}")
    return found[0]


def _layer_of(dist_name):
    name = re.sub(r"[-_.]+", "-", dist_name).lower()
    return next((layer for layer, pats in LAYERS.items() if any(fnmatch.fnmatch(name, p) for p in pats)), None)


def _unit(path):
    """The piece of site-packages a RECORD path belongs to: its top-level entry, or the file
    itself inside the shared top-level __pycache__; None outside site-packages (bin/ scripts)."""
    parts = pathlib.PurePosixPath(path).parts
    if not parts or parts[0] == "..":
        return None
    return "/".join(parts[:2]) if parts[0] == "__pycache__" and len(parts) > 1 else parts[0]


def split_venv(venv, out):
    site = _site(venv)
    owners = {}  # unit -> {layer or None}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        layer = _layer_of(dist.metadata["Name"])
        for f in dist.files or []:
            unit = _unit(str(f))
            if unit:
                owners.setdefault(unit, set()).add(layer)
    mixed = {u: sorted(str(x) for x in o) for u, o in owners.items() if len(o) > 1}
    if mixed:
        sys.exit(f"layer-trees: these site-packages entries belong to more than one layer ({mixed}): "
                 "give them one owner in layer-trees.py LAYERS")
    rel_site = site.relative_to("/")
    for layer in LAYERS:
        dest_site = pathlib.Path(out, layer, rel_site)
        dest_site.mkdir(parents=True, exist_ok=True)
        for unit, (owner,) in sorted(owners.items()):
            if owner == layer and (site / unit).exists():
                (dest_site / unit).parent.mkdir(parents=True, exist_ok=True)
                os.rename(site / unit, dest_site / unit)  # same layer: a rename, no copy
        print(f"layer-trees: {layer}: {sorted(p.name for p in dest_site.iterdir())}")
    (site / PTH).write_text("".join(f"{pathlib.Path(out, layer, rel_site)}\n" for layer in LAYERS))


def unsplit(venv):
    (_site(venv) / PTH).unlink()


def compile_tree(root, paths):
    """Timestamp-based .pyc (Python's default) with the image's path as co_filename: they stay
    valid as long as the source keeps its mtime, which normalize sets; a user's edit of a
    source file is noticed as usual."""
    root = pathlib.Path(root)
    for path in paths:
        top = root / path.lstrip("/")
        files = [top] if top.suffix == ".py" else sorted(top.rglob("*.py"))
        for f in files:
            real = f
            if f.is_symlink() and os.readlink(f).startswith("/"):
                real = root / os.readlink(f).lstrip("/")
            image_path = "/" + str(f.relative_to(root))
            py_compile.compile(str(real), cfile=importlib.util.cache_from_source(str(f)),
                               dfile=image_path, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)


def _fix_pyc(path):
    """A timestamp-based .pyc records its source's mtime (bytes 8-11; flags 0 in bytes 4-7):
    write EPOCH there, as the source's mtime will be. Hash-based .pyc (flags 1 or 3) record no time."""
    with open(path, "r+b") as f:
        head = f.read(12)
        if len(head) == 12 and struct.unpack("<I", head[4:8])[0] == 0:
            f.seek(8)
            f.write(struct.pack("<I", EPOCH))


def normalize(roots):
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            for name in files:
                p = os.path.join(dirpath, name)
                if name.endswith(".pyc") and not os.path.islink(p):
                    _fix_pyc(p)
        # Directories last, deepest first: setting a child's time does not change its parent's.
        for dirpath, dirs, files in os.walk(root, topdown=False):
            for name in files + dirs:
                os.utime(os.path.join(dirpath, name), (EPOCH, EPOCH), follow_symlinks=False)
        os.utime(root, (EPOCH, EPOCH), follow_symlinks=False)


def main(argv):
    if not argv:
        sys.exit(__doc__)
    cmd, args = argv[0], argv[1:]
    if cmd == "split-venv" and len(args) == 2:
        split_venv(*args)
    elif cmd == "unsplit" and len(args) == 1:
        unsplit(*args)
    elif cmd == "compile" and len(args) >= 2:
        compile_tree(args[0], args[1:])
    elif cmd == "normalize" and args:
        normalize(args)
    else:
        sys.exit(f"layer-trees: bad arguments {argv}\n{__doc__}")


if __name__ == "__main__":
    main(sys.argv[1:])
