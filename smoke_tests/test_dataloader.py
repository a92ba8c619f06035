"""DataLoader: worker processes hand batches to the trainer through shared memory (/dev/shm)."""
import contextlib
import os

import pytest
import torch
from smokelib import RandomImages

BATCH, WORKERS, PREFETCH = 16, 2, 2


def _shm_mib():
    st = os.statvfs("/dev/shm")
    return st.f_blocks * st.f_frsize / 2**20, st.f_bavail * st.f_frsize / 2**20


def test_dataloader_workers_pass_real_batches_through_shared_memory():
    """num_workers>0 must deliver every sample intact, in shared memory; a small /dev/shm fails clearly."""
    dataset = RandomImages(length=BATCH * 8)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS,
                                         prefetch_factor=PREFETCH, timeout=120)
    seen, error, batches = [], None, iter(loader)
    try:
        for images, indices in batches:
            assert images.is_shared(), "a worker's batch did not arrive through shared memory"
            for j in (0, len(indices) - 1):
                expected = RandomImages.sample(int(indices[j]), dataset.shape)
                assert torch.equal(images[j], expected), f"sample {int(indices[j])} arrived corrupted"
            seen += indices.tolist()
    except RuntimeError as err:  # a worker killed by SIGBUS when /dev/shm is full
        error = str(err)
    finally:
        # Stop the other workers now: another one's SIGBUS would make the loader's SIGCHLD
        # handler raise wherever Python is later (once inside pytest's report: INTERNALERROR).
        with contextlib.suppress(RuntimeError):
            batches._shutdown_workers()
    if error is not None:
        total, free = _shm_mib()
        mib = BATCH * torch.Size(dataset.shape).numel() * 4 / 2**20
        pytest.fail(
            f"DataLoader workers failed ({error}). /dev/shm is {total:.0f} MiB ({free:.0f} MiB free); "
            f"{WORKERS} workers x {PREFETCH} prefetched batches of {mib:.1f} MiB need more. "
            "Start the container with a larger --shm-size (e.g. docker run --shm-size=8g ...) "
            "or --ipc=host.", pytrace=False)
    assert sorted(seen) == list(range(len(dataset))), "the loader lost or repeated samples"
