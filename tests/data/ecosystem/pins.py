"""What the image pins (torch, torchvision, torchaudio, triton, nvidia-*: constraints.txt), as
installed: the version, the sha256 of the dist-info RECORD (which lists every file's hash), and
the identity of files a reinstall replaces even with the same bytes (path, inode, size and mtime
of RECORD and of torch's native libraries). Prints one JSON object. No torch import."""
import hashlib
import importlib.metadata
import json
import os
import pathlib

CONSTRAINTS = "/opt/venv/etc/constraints.txt"


def stamp(path):
    st = os.stat(path)
    return [str(path), st.st_ino, st.st_size, st.st_mtime_ns]


def installed(name):
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    files = dist.files or []
    record = next(f for f in files if f.name == "RECORD" and f.parent.name.endswith(".dist-info"))
    path = dist.locate_file(record)
    got = {"version": dist.version, "record": stamp(path),
           "record_sha256": hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()}
    if name == "torch":
        native = [f for f in files if f.name == "libtorch_cpu.so" or (f.parent.name == "torch" and f.name.startswith("_C."))]
        got["files"] = sorted(stamp(dist.locate_file(f)) for f in native)
    return got


with open(CONSTRAINTS) as f:
    names = [line.split("==")[0].strip() for line in f if "==" in line and not line.startswith("#")]
print(json.dumps({name: installed(name) for name in names}, sort_keys=True))
