"""train_amp.py's own fp16 step on the GPU: a step the GradScaler skips for overflow must leave
the weights and the optimizer untouched, and training must go on with finite weights.

Guards a real failure: torch 2.11's fused SGD advanced its momentum on skipped steps, so the
routine first-step overflow turned every weight into NaN (LibreYOLO/libreyolo#771)."""
import importlib
import io
import math
import pathlib
import sys

import pytest
import torch
import torch.nn.functional as F


def _train_amp():
    """train_amp imported the one documented way (see trainamp/api.py): its folder first on
    sys.path. It is beside smoke_tests/ in the repository, in /usr/local/bin in the image; its
    package trainamp beside it, or in the venv's site-packages."""
    here = pathlib.Path(__file__).resolve().parent
    for folder in (here.parent, pathlib.Path("/usr/local/bin")):
        if (folder / "train_amp.py").is_file():
            sys.path.insert(0, str(folder))
            return importlib.import_module("train_amp")
    pytest.skip("train_amp.py is neither beside smoke_tests/ nor in /usr/local/bin")


def _noise_jpegs(gen, n, h, w):
    """n JPEG files (quality 90) of h x w px of random pixels, as the uint8 CPU tensors
    train_amp's decoder takes."""
    from PIL import Image
    out = []
    for _ in range(n):
        px = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen)
        buf = io.BytesIO()
        Image.fromarray(px.numpy()).save(buf, format="JPEG", quality=90)
        out.append(torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8))
    return out


@pytest.mark.gpus(1)
def test_train_amp_fp16_overflow_step_is_skipped_and_training_stays_finite():
    """train_amp's fp16 step should skip an overflow step cleanly and then train on."""
    ta = _train_amp()
    dev = torch.device("cuda", 0)
    args = ta.build_parser().parse_args(["--amp", "fp16"])
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    opt = ta.make_optimizer(net, args, 0.05, dev, torch.float16)
    # A loss scale far beyond fp16's range: the first backward overflows, as real runs often do.
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 40)
    x, y = torch.randn(256, 32, device=dev), torch.randint(4, (256,), device=dev)
    before = [p.detach().clone() for p in net.parameters()]
    ta.train_step(net, x, y, opt, scaler, torch.float16, 1.0, "cuda")
    assert scaler.get_scale() < 2.0 ** 40, "the scaler should have lowered its scale after an overflow"
    for b, p in zip(before, net.parameters()):
        assert torch.equal(b, p.detach()), "a skipped step changed the weights"
    first = F.cross_entropy(net(x).float(), y).item()
    for _ in range(60):
        loss, _ = ta.train_step(net, x, y, opt, scaler, torch.float16, 1.0, "cuda")
    assert all(torch.isfinite(p).all() for p in net.parameters()), "weights went non-finite after a skipped step"
    assert loss.item() < first, f"loss should fall after the skipped step: {first:.4f} -> {loss.item():.4f}"


@pytest.mark.gpus(1)
def test_gpu_crop_kernel_matches_roi_align_on_the_gpu():
    """--decode device's Triton kernel (crop, resize, flip, normalise of a whole batch) should
    compute on the GPU what roi_align + flip + normalise compute, at photo sizes."""
    ta = _train_amp()
    dev = torch.device("cuda", 0)
    assert ta.use_fused_crop(dev), "Triton is missing: --decode device falls back to roi_align"
    gen = torch.Generator().manual_seed(0)
    shapes = [(375, 500), (640, 427), (333, 640), (500, 500), (120, 90), (1200, 900)] * 4
    imgs = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen).to(dev)
            for h, w in shapes]
    boxes = ta.random_crop_boxes(shapes, gen)
    flip = torch.rand(len(imgs), generator=gen) < 0.5
    fused = ta.crop_to_batch(imgs, boxes, flip, 224, True)
    # The roi_align path in float32 (on a GPU it runs in float16, whose sample positions are
    # off by up to half a pixel in a 1200 px photo: too coarse to compare noise images with).
    ref = ta.crop_resize(imgs, boxes, 224, dtype=torch.float32)
    ref = ta.normalise(torch.where(flip.view(-1, 1, 1, 1).to(dev), ref.flip(-1), ref), dev, True)
    diff = (fused - ref).abs()
    # Float rounding only (one level of 255 is ~0.017 after normalising); a wrong sample,
    # weight or flip differs by many levels.
    assert diff.max().item() < 2e-3, (
        f"fused crop vs roi_align: mean {diff.mean().item():.6f}, max {diff.max().item():.6f}")


@pytest.mark.gpus(1)
def test_device_decode_never_overwrites_images_the_callers_stream_still_reads():
    """--decode device decodes on the batch thread's side stream and drops each batch's images
    once their crop is queued there. The next batch's decode must not be handed that memory
    while the crop is still queued: torchvision writes its images out of the caller's stream
    order (pytorch/vision#9606), so the queued reads saw the next batch's pixels."""
    ta = _train_amp()
    dev = torch.device("cuda", 0)
    gen = torch.Generator().manual_seed(0)
    first, second = _noise_jpegs(gen, 16, 256, 256), _noise_jpegs(gen, 16, 256, 256)
    paths = [f"{i}.jpg" for i in range(len(first))]
    side = torch.cuda.Stream(dev)
    wrong = 0
    with torch.cuda.stream(side):
        want = [im.sum(dtype=torch.int64).item() for im in ta.decode_jpegs(first, paths, dev)[0]]
        for _ in range(5):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of queued work ahead of the reads below
            imgs = ta.decode_jpegs(first, paths, dev)[0]
            sums = [im.sum(dtype=torch.int64) for im in imgs]  # queued behind the sleep
            del imgs  # as the batch thread drops a batch's images once its crop is queued
            ta.decode_jpegs(second, paths, dev)  # same sizes: the allocator's pick is that memory
            side.synchronize()
            wrong += [s.item() for s in sums] != want
    assert wrong == 0, (f"in {wrong} of 5 rounds the first batch's queued reads saw other "
                        "pixels: the decoder wrote into memory they had not read yet")


@pytest.mark.gpus(1)
def test_device_batches_are_right_when_their_crops_lag_behind_the_next_decode(monkeypatch):
    """DeviceBatches must not let the next batch's decode write into images whose crop is still
    queued (pytorch/vision#9606, see decode_jpegs). Each crop is held back here behind a sleep
    kernel while the thread decodes the next batch into images of the same sizes: every batch
    must still equal the same batch decoded and cropped with the GPU idle in between (without
    the guard, on an H200, they differed from the first batch on)."""
    ta = _train_amp()
    dev = torch.device("cuda", 0)
    gen = torch.Generator().manual_seed(1)
    loader = []
    for _ in range(8):
        files = _noise_jpegs(gen, 16, 240, 320)
        packed = ta.JpegBatch(torch.cat(files), torch.tensor([len(f) for f in files]),
                              [f"{i}.jpg" for i in range(16)], [])
        loader.append((packed, torch.arange(16)))
    batches = ta.DeviceBatches(loader, 64, dev, True, True, ta.BadImages(), seed=3)
    want = []
    for k, (x, y) in enumerate(loader):
        want.append(batches.prepare(0, k, x, y)[0].clone())
        torch.cuda.synchronize()
    crop = ta.crop_to_batch

    def lagging(*args):
        torch.cuda._sleep(50_000_000)  # ~25 ms queued ahead of the crop on the batch stream
        return crop(*args)

    # Where decode_on_device looks it up (replacing train_amp's name would change nothing).
    monkeypatch.setattr(importlib.import_module("trainamp.data.device"), "crop_to_batch", lagging)
    try:
        got = [x.clone() for x, _ in batches]
    finally:
        batches.close()
    torch.cuda.synchronize()
    wrong = [k for k, (g, w) in enumerate(zip(got, want)) if not torch.equal(g, w)]
    assert len(got) == len(want) and not wrong, (
        f"batches {wrong} of {len(want)} differ: their images were decoded into before their"
        " crops read them")


@pytest.mark.gpus(1)
def test_train_amp_decode_device_trains_whole_epochs_and_counts_bad_files_per_epoch(tmp_path):
    """train_amp --decode device should train several epochs from JPEGs on the GPU with one
    producer thread running ahead across epoch ends, validate, and count a skipped unreadable
    file in each epoch it belongs to (not in the epoch that was training when it was decoded)."""
    from PIL import Image
    ta = _train_amp()
    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", 63), ("val", 16)):
        for i in range(n):
            d = tmp_path / split / f"class{i % 2}"
            d.mkdir(parents=True, exist_ok=True)
            px = torch.randint(0, 256, (96 + i % 7 * 9, 128, 3), dtype=torch.uint8, generator=gen)
            Image.fromarray(px.numpy()).save(d / f"{i:03d}.jpg", quality=90)
    (tmp_path / "train" / "class0" / "truncated.jpg").write_bytes(
        (tmp_path / "train" / "class0" / "000.jpg").read_bytes()[:100])
    args = ta.build_parser().parse_args([
        "--data", str(tmp_path), "--decode", "device", "--model", "resnet18", "--image-size",
        "64", "--batch-size", "16", "--epochs", "3", "--compile", "off", "--skip-bad-images",
        "--checkpoint-dir", "", "--progress", "none"])
    ta.fill_defaults(args)
    r = ta.train(args, ta.Ranks(), torch.device("cuda", 0), ta.StopRequest())
    hist = r["history"]
    assert [h["epoch"] for h in hist] == [1, 2, 3], hist
    assert [h["steps"] for h in hist] == [4, 4, 4], hist
    assert [h["skipped_images"] for h in hist] == [1, 1, 1], (
        f"each epoch reads the truncated file once: {[h['skipped_images'] for h in hist]}")
    assert all(math.isfinite(h["train_loss"]) and "val_acc" in h for h in hist), hist


@pytest.mark.gpus(1)
def test_cuda_graphs_replay_the_compiled_step_and_train_the_same_losses():
    """--cuda-graphs should replay the compiled forward and backward as CUDA graphs (a profiled
    step calls cudaGraphLaunch; without the flag it does not) and train the same losses as the
    same compiled model launched kernel by kernel."""
    ta = _train_amp()
    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(1)
    data = [(torch.randn(16, 3, 32, 32, device=dev, generator=gen).contiguous(
        memory_format=torch.channels_last), torch.randint(10, (16,), device=dev, generator=gen))
        for _ in range(6)]
    losses, launches = {}, {}
    for flag in ("off", "on"):
        args = ta.build_parser().parse_args(["--compile", "on", "--cuda-graphs", flag])
        torch._dynamo.reset()
        torch.manual_seed(0)
        net = ta.build_model("resnet18", 10, 32).to(dev).to(memory_format=torch.channels_last)
        model, compiled, graphs = ta.wrap_model(net, ta.resolve_plan(args, dev, ta.Ranks()),
                                                ta.Ranks())
        assert compiled and graphs == (flag == "on")
        opt = ta.make_optimizer(net, args, 0.05, dev, torch.bfloat16)
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        def step(x, y, model=model, opt=opt, scaler=scaler, graphs=graphs):
            return ta.train_step(model, x, y, opt, scaler, torch.bfloat16, 1.0, "cuda",
                                 graphs)[0].item()
        losses[flag] = [step(x, y) for x, y in data]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            step(*data[0])
        launches[flag] = sum(e.count for e in prof.key_averages() if e.key == "cudaGraphLaunch")
    assert launches["on"] >= 1, "--cuda-graphs: the profiled step launched no CUDA graph"
    assert launches["off"] == 0, f"without --cuda-graphs the step launched {launches['off']} graphs"
    for a, b in zip(losses["off"], losses["on"]):
        assert math.isclose(a, b, rel_tol=2e-2, abs_tol=1e-2), (
            f"CUDA graphs changed the losses: {losses['off']} vs {losses['on']}")


def _fake_cpu_bf16(monkeypatch, avx512_bf16, amx):
    """Make train_amp see a CPU with or without bf16 hardware (torch's own cpuinfo checks)."""
    for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)


@pytest.mark.parametrize("avx512_bf16, amx, want", [
    (False, False, None), (True, False, torch.bfloat16), (False, True, torch.bfloat16)])
def test_amp_auto_on_cpu_is_bf16_only_where_the_cpu_computes_it(monkeypatch, avx512_bf16, amx, want):
    """--amp auto on a CPU should pick bf16 only with AVX512-BF16 or AMX, else FP32 (None);
    --amp bf16 should still give bf16 on any CPU."""
    ta = _train_amp()
    _fake_cpu_bf16(monkeypatch, avx512_bf16, amx)
    cpu = torch.device("cpu")
    assert ta.resolve_amp("auto", cpu) == want, f"avx512_bf16={avx512_bf16} amx={amx}"
    assert ta.resolve_amp("bf16", cpu) == torch.bfloat16, "an explicit --amp bf16 must still run"


def test_amp_auto_on_a_cpu_without_bf16_says_fp32_and_why_and_bf16_warns(monkeypatch, capfd):
    """On a CPU without bf16 hardware, --amp auto's start line should say FP32 and why; an
    explicit --amp bf16 should train with a one-line warning that it is emulated."""
    ta = _train_amp()
    _fake_cpu_bf16(monkeypatch, False, False)
    job = ["--device", "cpu", "--model", "resnet18", "--data", "synthetic", "--synthetic-size",
           "8", "--num-classes", "2", "--image-size", "32", "--batch-size", "8", "--steps", "1",
           "--checkpoint-dir", ""]
    assert ta.main([*job, "--amp", "auto"]) == 0
    out, err = capfd.readouterr()
    assert "amp=off (auto: this CPU has no AVX512-BF16 or AMX" in out, out
    assert "warning" not in err, f"--amp auto chose FP32: nothing to warn about\n{err}"
    assert ta.main([*job, "--amp", "bf16"]) == 0
    out, err = capfd.readouterr()
    assert " amp=bf16 " in out, out
    warnings = [ln for ln in err.splitlines() if "warning: bf16 autocast runs emulated" in ln]
    assert len(warnings) == 1, f"expected one emulation warning:\n{err}"


def test_a_save_whose_temp_file_vanished_is_not_called_a_full_disk(monkeypatch, tmp_path):
    """A save that fails for another reason than space (here its temp file removed by someone
    else before the rename) should say what happened, not 'free space' or 'the disk is full'."""
    ta = _train_amp()
    checkpoint = importlib.import_module("trainamp.checkpoint")  # where save_checkpoint calls it
    real_fsync = checkpoint.fsync

    def fsync_then_vanish(path):
        real_fsync(path)
        if str(path).endswith(".tmp"):
            pathlib.Path(path).unlink()
    monkeypatch.setattr(checkpoint, "fsync", fsync_then_vanish)
    with pytest.raises(ta.SaveFailed) as err:
        ta.save_checkpoint(tmp_path / "ck" / "last.pt", {"w": torch.zeros(4)})
    msg = str(err.value)
    assert "FileNotFoundError" in msg and "there is no earlier last.pt" in msg, msg
    for wrong in ("disk is full", "Free space", "once there is room", "MiB free"):
        assert wrong not in msg, f"a vanished file was worded as a space problem ({wrong!r}): {msg}"
