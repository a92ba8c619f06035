#!/usr/bin/env python3
"""Run pip as it would run on another CPU: `pip_for_machine.py MACHINE PIP-ARGS...` (MACHINE as
Python's platform.machine() says it there: x86_64, aarch64). scripts/check_wheels.py's runner.

pip's --platform chooses which wheel tags may install, but the environment markers in the wheels'
metadata are still evaluated for the machine pip runs on (pypa/pip#10050, "not a bug" to pip).
torch 2.6.0's aarch64 wheel requires its nvidia-* libraries only `platform_machine == "x86_64"`:
from an x86_64 host, a plain `pip --platform manylinux_2_28_aarch64` dry run pulls them in and
answers for a CUDA build that an arm64 image would never get. Markers read platform.machine()
when they are evaluated, so setting it here makes them answer as the image's pip will.
"""
import platform
import runpy
import sys

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    machine = sys.argv.pop(1)
    platform.machine = lambda: machine
    sys.argv[0] = "pip"
    runpy.run_module("pip", run_name="__main__", alter_sys=True)
