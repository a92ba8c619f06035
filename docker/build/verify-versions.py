#!/usr/bin/env python3
"""Build-time check: fail the build unless the image holds exactly the versions it claims.

Compares torch/torchvision/torchaudio, CUDA, cuDNN, NCCL and Python against the build args
(which the Makefile takes from versions.json and writes into the tag), checks that there is
exactly one libcudnn and one libnccl in the image, and writes what it found as JSON, with the
versions.json row's name and min_driver (the start-up checks read both from that record).
"""
import argparse
import json
import os
import pathlib
import platform
import sys

# Python's machine name -> Docker's architecture (the image's platform, as versions.json says it).
DOCKER_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def lib_copies(stem):
    """Every file called <stem>.so* outside /proc,/sys: the copies a loader could pick up."""
    found = []
    for top in ("/usr", "/opt", "/lib", "/lib64", "/usr/local"):
        for dirpath, _dirs, files in os.walk(top):
            found += [os.path.join(dirpath, f) for f in files if f.startswith(stem + ".so")]
    return sorted({os.path.realpath(p) for p in found})


def main():
    p = argparse.ArgumentParser()
    for k in ("torch", "torchvision", "torchaudio", "cuda", "cudnn", "nccl", "python"):
        p.add_argument("--" + k, required=True)
    # The CUDA the base image declares (CUDA_VERSION): the row's own (the default), or the stand-in's
    # (its default row's) when a non-default row is built on the one stand-in (Makefile BASE_CUDA).
    p.add_argument("--base-cuda", default="")
    p.add_argument("--row", required=True, help="the versions.json row the build args come from")
    p.add_argument("--min-driver", required=True, help="that row's min_driver")
    p.add_argument("--platform", default="", help="the build's TARGETPLATFORM (empty: not checked)")
    p.add_argument("--out", required=True)
    want = p.parse_args()

    import torch
    import torchaudio
    import torchvision

    cudnn = torch.backends.cudnn.version()  # e.g. 90100, read from the loaded libcudnn
    nccl = torch.cuda.nccl.version()         # e.g. (2, 21, 5), read from the loaded libnccl
    have = {
        "row": want.row,
        "min_driver": want.min_driver,
        "torch": torch.__version__.split("+")[0],
        "torchvision": torchvision.__version__.split("+")[0],
        "torchaudio": torchaudio.__version__.split("+")[0],
        "cuda": torch.version.cuda,
        "cudnn": f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}",
        "nccl": ".".join(map(str, nccl)),
        "python": ".".join(map(str, sys.version_info[:3])),
        # The architecture this image runs on (the build's TARGETPLATFORM): the kernel list below
        # is that platform's wheel's, which differs between x86_64 and aarch64.
        "platform": "linux/" + DOCKER_ARCH.get(platform.machine(), platform.machine()),
        "base_cuda": os.environ.get("CUDA_VERSION", ""),
        # The kernels compiled into the wheel (get_arch_list() is empty without a GPU): the
        # entrypoint compares the GPU's compute capability against this without importing torch.
        "cuda_arch_list": torch._C._cuda_getArchFlags().split(),
        "libcudnn": lib_copies("libcudnn"),
        "libnccl": lib_copies("libnccl"),
    }
    errors = []
    if want.platform and have["platform"] != want.platform:
        errors.append(f"the image runs on {have['platform']}, the build was asked for {want.platform}")
    for key in ("torch", "torchvision", "torchaudio"):
        if have[key] != getattr(want, key):
            errors.append(f"{key} is {have[key]}, the build args say {getattr(want, key)}")
    for key in ("cuda", "cudnn", "nccl", "python"):
        # The tag carries major.minor (cuda12.4, cudnn9, py3.10): match on that prefix.
        if not (have[key] + ".").startswith(getattr(want, key) + "."):
            errors.append(f"{key} is {have[key]}, the build args say {getattr(want, key)}")
    base_cuda = want.base_cuda or want.cuda
    if not (have["base_cuda"] + ".").startswith(base_cuda + "."):
        errors.append(f"the base image's CUDA_VERSION is {have['base_cuda']!r}, the build expects "
                      f"{base_cuda} (torch is built for {want.cuda})")
    for lib in ("libcudnn", "libnccl"):
        if len(have[lib]) != 1:
            errors.append(f"expected exactly one {lib}, found {len(have[lib])}: {have[lib]}")
    if errors:
        sys.exit("verify-versions: the image does not match its tag:\n  " + "\n  ".join(errors))
    pathlib.Path(want.out).write_text(json.dumps(have, indent=2) + "\n")
    print("verify-versions: OK", json.dumps({k: v for k, v in have.items() if not k.startswith("lib")}))


if __name__ == "__main__":
    main()
