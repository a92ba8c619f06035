"""torchvision and torchaudio: their compiled ops load and compute on each device."""
import importlib
import math

import pytest
import torch


def load(name):
    """Import inside the test, so a broken extension fails these tests, not the whole run."""
    try:
        return importlib.import_module(name)
    except (ImportError, OSError, RuntimeError) as err:  # e.g. a .so built for another torch
        pytest.fail(f"import {name} failed: {err!r}", pytrace=False)


def test_torchvision_nms_keeps_the_best_of_overlapping_boxes(device):
    """nms must drop a box that overlaps a higher-scoring one and keep a disjoint box."""
    best = torch.tensor([0.0, 0.0, 10.0, 10.0])
    overlapping = best + torch.tensor([1.0, 0.0, 1.0, 0.0])  # IoU 9/11 with `best`
    disjoint = best + 20.0
    boxes = torch.stack([overlapping, best, disjoint]).to(device)
    scores = torch.tensor([0.8, 0.9, 0.7], device=device)
    kept = load("torchvision").ops.nms(boxes, scores, iou_threshold=0.5).cpu().tolist()
    assert kept == [1, 2], f"nms on {device} kept {kept}; want the best box (1) then the disjoint one (2)"


def test_torchaudio_spectrogram_peaks_at_the_tone_frequency(device):
    """A pure tone's spectrogram must peak in the frequency bin of that tone."""
    sample_rate, n_fft, bin_ = 16000, 512, 40
    freq = bin_ * sample_rate / n_fft  # exactly on a bin centre
    t = torch.arange(sample_rate) / sample_rate
    wave = torch.sin(2 * math.pi * freq * t).to(device)
    spec = load("torchaudio").transforms.Spectrogram(n_fft=n_fft).to(device)(wave)
    assert spec.shape[0] == n_fft // 2 + 1, f"unexpected spectrogram shape {tuple(spec.shape)}"
    peak = int(spec.mean(dim=1).argmax())
    assert peak == bin_, f"spectrogram on {device} peaks in bin {peak}, the tone is in bin {bin_}"
