"""Versions: the libraries torch actually loads are the ones the image (or the caller) claims.

torchvision/torchaudio versions come from package metadata, not an import, so that a broken
extension library fails its own tests (test_vision_audio.py) instead of this whole module."""
import importlib.metadata
import sys

import pytest
import torch
from packaging.requirements import Requirement  # a dependency of pytest: always there
from smokelib import VERSION_KEYS

VISION = importlib.metadata.version("torchvision")
AUDIO = importlib.metadata.version("torchaudio")


def loaded_versions():
    """What is really loaded: the cuDNN and NCCL numbers come from the shared libraries."""
    cudnn = torch.backends.cudnn.version()
    return {
        "torch": torch.__version__.split("+")[0],
        "torchvision": VISION.split("+")[0],
        "torchaudio": AUDIO.split("+")[0],
        "cuda": torch.version.cuda,
        "cudnn": f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version()[:3])) if torch.distributed.is_nccl_available() else None,
        "python": ".".join(map(str, sys.version_info[:3])),
    }


def release(version):
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2])


def declared_torch(dist):
    """The torch requirements a distribution declares in its metadata (markers that apply)."""
    reqs = [Requirement(r) for r in importlib.metadata.requires(dist) or []]
    return [r for r in reqs if r.name == "torch" and (r.marker is None or r.marker.evaluate({"extra": ""}))]


def test_torchvision_and_torchaudio_belong_to_the_loaded_torch():
    """torchvision and torchaudio must be releases made for the loaded torch, on the same CUDA
    build. Each one's metadata says which torch: `torch==2.6.0` (the classic pinned pairs) or, for
    the stable-ABI wheels torch 2.14+ brought, a floor (`torch>=2.14.0`). Without such a
    requirement the release rule applies: torchvision 0.(m+15), torchaudio 2.m with torch 2.m."""
    major, minor = release(torch.__version__)
    assert major == 2, f"pairing rule known for torch 2.x only; torch is {torch.__version__}"
    loaded = torch.__version__.split("+")[0]
    for dist, version, paired in (("torchvision", VISION, (0, minor + 15)), ("torchaudio", AUDIO, (major, minor))):
        declared = declared_torch(dist)
        if declared:
            wrong = [str(r.specifier) for r in declared if not r.specifier.contains(loaded, prereleases=True)]
            assert not wrong, f"{dist} {version} requires torch{wrong}, but torch {torch.__version__} is loaded"
        else:
            assert release(version) == paired, (
                f"{dist} {version} is not the release paired with torch {torch.__version__}")
    locals_ = {name: v.partition("+")[2] for name, v in
               (("torch", torch.__version__), ("torchvision", VISION), ("torchaudio", AUDIO))}
    suffixes = {s for s in locals_.values() if s}
    assert len(suffixes) <= 1, f"torch, torchvision and torchaudio come from different builds: {locals_}"


def test_cuda_build_ships_cudnn_and_nccl():
    """A CUDA build of torch must load a cuDNN of its compile-time major version and an NCCL."""
    assert torch.version.cuda, f"torch {torch.__version__} is a CPU-only build"
    runtime = torch.backends.cudnn.version()
    assert runtime, "torch.backends.cudnn.version() is None: no libcudnn could be loaded"
    compiled = torch._C._cudnn.getCompileVersion()
    assert runtime // 10000 == compiled[0], (
        f"loaded cuDNN {runtime} has another major version than torch was built with {compiled}")
    assert torch.distributed.is_nccl_available(), "this torch build has no NCCL backend"
    # (major, minor, patch), plus a suffix string on some builds.
    nccl = torch.cuda.nccl.version()
    assert len(nccl) >= 3 and all(isinstance(v, int) for v in nccl[:3]), f"odd NCCL version {nccl}"


@pytest.mark.needs_expectations
@pytest.mark.parametrize("key", VERSION_KEYS)
def test_loaded_version_equals_expected(key, expected_versions):
    """Each loaded version must equal the expected one (image label or --expect-versions file)."""
    if key not in expected_versions:
        pytest.skip(f"the expectations file gives no {key!r} version")
    want = expected_versions[key]
    have = loaded_versions()[key]
    # Labels carry major.minor (cudnn 9.1) where the library reports 9.1.0: compare on the
    # components the expectation gives.
    assert have is not None and have.split(".")[:len(want.split("."))] == want.split("."), (
        f"{key}: loaded {have}, expected {want}")
