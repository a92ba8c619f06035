"""Does an image say it is what its tag says? The descriptive tag (scripts/build_info.py's
tag(): 2.6.0-cuda12.4-cudnn9-py3.11-runtime, maybe with -zstd) names torch, CUDA, cuDNN and
Python; the build writes the same into labels. scripts/pull.py refuses a pulled image whose
labels contradict its tag (a mis-tagged push) instead of calling it verified.
"""
import re

DESCRIPTIVE = re.compile(r"(?P<torch>\d+\.\d+\.\d+)-cuda(?P<cuda>\d+\.\d+)-cudnn(?P<cudnn>\d+)-py(?P<python>\d+\.\d+)"
                         r"-runtime(?:-zstd)?")
# tag field -> the label that must agree with it
LABELS = {"torch": "team.torch.version", "cuda": "team.cuda.version", "cudnn": "team.cudnn.version",
          "python": "team.python.version"}
VERSION_LABEL = "org.opencontainers.image.version"


def agrees(said, label):
    """'3.11' agrees with 3.11 and 3.11.7; '2.6.0' with 2.6.0 and 2.6.0+cu124; '9' with 9.1.0.70."""
    return label == said or label.startswith((said + ".", said + "+"))


def contradiction(tag, labels):
    """The first label that contradicts a descriptive tag, as 'LABEL=value, but the tag T says
    X'; None when they agree, when the tag is not a descriptive one (latest, 2.6, sha-...) or the
    image has no such label (an image built elsewhere)."""
    m = DESCRIPTIVE.fullmatch(tag or "")
    if not m:
        return None
    version = labels.get(VERSION_LABEL)
    base = tag.removesuffix("-zstd")
    if version is not None and version != base:
        return f"{VERSION_LABEL}={version!r}, but the tag {tag} says {base}"
    for field, label in LABELS.items():
        value = labels.get(label)
        if value is not None and not agrees(m.group(field), value):
            return f"{label}={value!r}, but the tag {tag} says {field} {m.group(field)}"
    return None
