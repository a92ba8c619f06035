"""doctor.py's pre-flight checks of what the user typed for make run/build (not of the host):
the image reference against Docker's grammar (scripts/reference.py) and make run's STOP_TIMEOUT,
each a FAIL row with its fix before Docker gives its own error or a job loses its checkpoint.
"""
import re

import reference
from doctor_report import FAIL, Row

# The entrypoint keeps the last 3 s of a stop for JupyterLab and sshd (services.sh): below 4 s,
# jobs get no time at all.
STOP_MIN = 4


def check_reference(image):
    """REF (REGISTRY/IMAGE:TAG) as Docker's grammar reads it; make's variables named when typed."""
    bad = reference.problem(image)
    if not bad:
        return []
    return [Row(FAIL, "image reference", bad, "give make REGISTRY, IMAGE and TAG that Docker accepts, "
                "e.g. make run IMAGE=team-dl (lowercase; the tag in TAG, a digest in DIGEST)")]


def check_stop_timeout(value):
    """make run's STOP_TIMEOUT goes to docker run --stop-timeout and to the entrypoint: under 4 s
    (0 included) docker stop kills the jobs before they can save a checkpoint."""
    if value is None:
        return []
    if not re.fullmatch(r"[0-9]{1,5}", value.strip()):
        return [Row(FAIL, "stop timeout", f"STOP_TIMEOUT={value!r} is not a number of seconds: docker run "
                    "--stop-timeout refuses it", f"make run STOP_TIMEOUT=60 (whole seconds, {STOP_MIN} or more)")]
    if int(value) < STOP_MIN:
        return [Row(FAIL, "stop timeout", f"STOP_TIMEOUT={value} gives a stopping container {value} s: docker stop "
                    "kills the jobs in it (training in tmux, a terminal, docker exec) before they can save a "
                    f"checkpoint; they get STOP_TIMEOUT less 3 s, so {STOP_MIN} s is the least that gives them any",
                    [f"make run STOP_TIMEOUT=60 (or anything from {STOP_MIN} up; the default is 30)",
                     "to stop without saving on purpose, skip this check: PREFLIGHT=0"])]
    return []
