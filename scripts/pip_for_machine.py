#!/usr/bin/env python3
"""Run pip as it would run on another CPU and Python: `pip_for_machine.py MACHINE PIP-ARGS...`
(MACHINE as Python's platform.machine() says it there: x86_64, aarch64; MARKER_PYTHON=3.10 in
the environment: that Python's version). scripts/check_wheels.py's runner.

pip's --platform and --python-version choose which wheel tags and Requires-Python may install,
but the environment markers in the wheels' metadata and in requirement files are still evaluated
for the interpreter pip runs on (pypa/pip#10050, "not a bug" to pip). torch 2.6.0's aarch64
wheel requires its nvidia-* libraries only `platform_machine == "x86_64"`: from an x86_64 host, a
plain `pip --platform manylinux_2_28_aarch64` dry run pulls them in and answers for a CUDA build
that an arm64 image would never get; and a `pkg==X; python_version >= "3.11"` line would be
taken for a Python 3.10 base by a Python 3.11 host. Markers read platform.machine() and
platform.python_version() when they are evaluated, so setting them here makes them answer as
the image's pip will.
"""
import os
import platform
import runpy
import sys

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    machine = sys.argv.pop(1)
    platform.machine = lambda: machine
    python = os.environ.get("MARKER_PYTHON")
    if python:
        if not all(part.isdigit() for part in python.split(".")) or python.count(".") not in (1, 2):
            sys.exit(f"pip_for_machine: MARKER_PYTHON={python!r} is not a Python version like 3.10")
        full = python if python.count(".") == 2 else python + ".0"
        platform.python_version = lambda: full
        platform.python_version_tuple = lambda: tuple(full.split("."))
    sys.argv[0] = "pip"
    runpy.run_module("pip", run_name="__main__", alter_sys=True)
