#!/usr/bin/env python3
"""train_amp.py: train a torchvision image classifier with automatic mixed precision (AMP).
Resumable (SIGTERM-safe checkpoints), runs unchanged under torchrun (DDP), and --compare
measures what AMP buys on this machine: FP32 vs AMP, as a table, JSON and a PNG chart.

The code is the trainamp package: beside this file in the repository, in the venv's
site-packages in the image. The AMP step itself (autocast, GradScaler, the optimizer) is
trainamp/amp.py. Imported as a module, this file gives the names of trainamp/api.py."""
import sys

try:
    if __name__ == "__main__":
        # Before torch is imported: a job started with stderr closed (2>&-) must not have
        # the next file opened take its number, and a `| tee` that ends must cost nothing.
        from trainamp.streams import guard_std_streams
        guard_std_streams()
    from trainamp.api import *  # the names benchmarks and tests use
    from trainamp.api import __all__  # noqa: F401
    from trainamp.main import main
except ModuleNotFoundError as e:
    if e.name != "trainamp":
        raise
    sys.exit(f"train_amp.py: error: its package trainamp is neither beside {__file__} nor"
             " installed: copy the repository's trainamp/ folder next to train_amp.py")

if __name__ == "__main__":
    sys.exit(main())
