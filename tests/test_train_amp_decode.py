"""The JPEG decode paths' internals, run in the image on CPU: device crops, flips and resizes
against torchvision's, the workers' transforms, loader passes and workers, the Triton crop kernel."""
import json

from train_amp_helpers import MAKE_JPEGS

# The device path's batched crop against torchvision's RandomResizedCrop (what the workers
# run), 20,000 draws each on three image shapes (the last one forces the fallback crop); its
# flip rate and resize filter through decode_on_device on real JPEG bytes. Prints JSON.
AUG_STATS = r"""
import io, json, sys, numpy as np, torch, torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image
from torchvision.io import encode_jpeg
sys.path.insert(0, "/usr/local/bin")
import train_amp

def q(v):
    return torch.quantile(v.float(), torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95]))

def stats(left, top, cw, ch, h, w):
    return {"area": cw * ch / (h * w), "log_aspect": torch.log(cw / ch),
            "centre_x": (left + cw / 2) / w, "centre_y": (top + ch / 2) / h}

n, out = 20000, {"quantile_gap": {}}
for h, w in ((375, 500), (640, 333), (40, 400)):
    b = train_amp.random_crop_boxes([(h, w)] * n, torch.Generator().manual_seed(0))
    ours = stats(b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1], h, w)
    torch.manual_seed(0)
    img = Image.new("RGB", (w, h))
    r = torch.tensor([T.RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
                      for _ in range(n)], dtype=torch.float64)  # top, left, height, width
    ref = stats(r[:, 1], r[:, 0], r[:, 3], r[:, 2], h, w)
    for k in ours:
        out["quantile_gap"][f"{h}x{w} {k}"] = (q(ours[k]) - q(ref[k])).abs().max().item()
ramp = torch.arange(64).mul(4).expand(3, 48, 64).to(torch.uint8).contiguous()
data = encode_jpeg(ramp, quality=95)
flipped = 0
for k in range(20):
    packed = (data.repeat(100), torch.full((100,), len(data)), ["ramp.jpg"] * 100, [])
    x, _ = train_amp.decode_on_device(packed, True, 16, torch.device("cpu"),
                                      gen=train_amp.batch_generator(k))
    flipped += (x[:, :, :, 0].mean((1, 2)) > x[:, :, :, -1].mean((1, 2))).sum().item()
out["flip_rate"] = flipped / 2000
img = torch.from_numpy(np.array(Image.open(io.BytesIO(data.numpy().tobytes())))).permute(2, 0, 1)
ours = train_amp.crop_resize([img], torch.tensor([[0., 0., 64., 48.]]), 16)
ref = F.interpolate(img[None].float(), size=(16, 16), mode="bilinear", antialias=True)
out["resize_mean_abs_diff"] = (ours - ref).abs().mean().item()
print(json.dumps(out))
"""


def test_device_augmentation_has_the_cpu_paths_crop_and_flip_statistics(run_in_image):
    """The GPU path's batched crops should draw torchvision RandomResizedCrop's distribution,
    flip half the images and resize like resize(antialias=True)."""
    code, logs = run_in_image(["python3", "-c", AUG_STATS], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    r = json.loads(logs.strip().splitlines()[-1])
    # 20,000 draws: the quantiles of two samples of one distribution differ by about 0.005.
    worst = max(r["quantile_gap"].items(), key=lambda kv: kv[1])
    assert worst[1] < 0.02, f"crop distribution differs from RandomResizedCrop: {worst}; {r}"
    assert abs(r["flip_rate"] - 0.5) < 0.04, f"flip rate {r['flip_rate']} over 2000 images"
    assert r["resize_mean_abs_diff"] < 1.0, f"resize filter differs (0-255 scale): {r}"


# The workers' transforms (CropFlip, ResizeCentreCrop) against torchvision's RandomResizedCrop +
# flip and Resize + CenterCrop on a photo-sized JPEG and an ImageNet-sized one, with the same
# torch seed: pixels, the draws they take from torch's generator, and the scale decoded. Prints JSON.
WORKER_TRANSFORMS = r"""
import io, json, sys, numpy as np, torch
import torchvision.transforms.v2 as T
from PIL import Image
sys.path.insert(0, "/usr/local/bin")
import train_amp

def jpeg(h, w):
    rng = np.random.default_rng(h)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([np.sin(xx / rng.uniform(20, 200)) * 60 + np.cos(yy / rng.uniform(20, 200)) * 60
                    + 128 for _ in range(3)], -1) + rng.normal(0, 14, (h, w, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()

ref_train = T.Compose([T.RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                                           antialias=True), T.RandomHorizontalFlip(), T.PILToTensor()])
ref_val = T.Compose([T.Resize(256, antialias=True), T.CenterCrop(224), T.PILToTensor()])
import trainamp.data.cpu
scales, draft = [], trainamp.data.cpu.draft_jpeg
def spy(*args):
    scales.append(draft(*args))
    return scales[-1]
trainamp.data.cpu.draft_jpeg = spy  # where the transforms look it up
out = {}
for name, data in (("photo", jpeg(1836, 3264)), ("imagenet", jpeg(375, 500))):
    for on in (False, True):
        train, val = train_amp.image_transforms(224, train_amp.DecodeOptions(jpeg_draft=on))
        key = f"{name} draft {'on' if on else 'off'}"
        scales.clear()
        diffs, same_draws = [], 0
        for seed in range(24):
            torch.manual_seed(seed)
            a = ref_train(Image.open(io.BytesIO(data)).convert("RGB"))
            after_ref = torch.rand(1).item()
            torch.manual_seed(seed)
            b = train(Image.open(io.BytesIO(data)))
            same_draws += torch.rand(1).item() == after_ref
            diffs.append((a.float() - b.float()).abs().mean().item())
        a = ref_val(Image.open(io.BytesIO(data)).convert("RGB"))
        b = val(Image.open(io.BytesIO(data)))
        out[key] = {"train_diff": max(diffs), "same_draws": same_draws, "shape": list(b.shape),
                    "val_diff": (a.float() - b.float()).abs().mean().item(),
                    "reduced": sum(f < 1 for f in scales), "decoded": len(scales)}
print(json.dumps(out))
"""


def test_workers_decode_large_jpegs_at_reduced_scale_with_torchvisions_crops(run_in_image):
    """The workers' transforms should draw torchvision's crops and flips (the same generator
    draws) and give its exact pixels at full scale; a photo should be decoded at a reduced
    scale (draft_jpeg) for every crop that allows it, within a level or so of a full decode."""
    code, logs = run_in_image(["python3", "-c", WORKER_TRANSFORMS], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    r = json.loads(logs.strip().splitlines()[-1])
    for key, v in r.items():
        assert v["same_draws"] == 24 and v["shape"] == [3, 224, 224], f"{key}: {v}"
    for key in ("photo draft off", "imagenet draft off", "imagenet draft on"):
        assert r[key]["train_diff"] == 0 and r[key]["val_diff"] == 0, (
            f"{key}: at full scale the pixels should be torchvision's exactly: {r}")
    assert r["imagenet draft on"]["reduced"] == 0, f"a 500 px JPEG has no scale to spare: {r}"
    photo = r["photo draft on"]
    # A 3264 x 1836 photo: every validation resize and most crops decode at 1/2 or less.
    assert photo["reduced"] >= 12, f"the photo was decoded at full scale: {photo}"
    assert photo["train_diff"] < 2.0 and photo["val_diff"] < 2.0, (
        f"reduced-scale decoding should differ from a full decode by a level or two: {photo}")


# --decode device over 3 epochs and a resume into epoch 2's second batch: which files each
# training batch decoded, against the sampler's order of each epoch, and how many times a
# loader was iterated for training (PlanBatches). Prints JSON.
ONE_ITERATION = r"""
import json, sys, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp

import trainamp.data.prefetch
passes, trained = [], []
iterate, decode = torch.utils.data.DataLoader.__iter__, trainamp.data.prefetch.decode_on_device
def counting(self):
    passes.append(type(self.batch_sampler).__name__)
    return iterate(self)
def recording(packed, train, *a, **k):
    if train:
        trained.append(list(packed[2]))
    return decode(packed, train, *a, **k)
# where DeviceBatches looks it up
torch.utils.data.DataLoader.__iter__, trainamp.data.prefetch.decode_on_device = counting, recording
out = {}
for name, start in (("whole", None), ("resumed", (1, 1))):
    passes.clear(); trained.clear()
    args = train_amp.build_parser().parse_args([
        "--data", "imgs", "--decode", "device", "--model", "resnet18", "--image-size", "32",
        "--batch-size", "16", "--epochs", "3", "--num-workers", "2", "--checkpoint-dir", "",
        "--progress", "none", "--device", "cpu", "--decode-cpu-share", "0"])
    train_amp.fill_defaults(args)
    t = train_amp.Trainer(args, train_amp.Ranks(), torch.device("cpu"), train_amp.StopRequest())
    if start:
        t.start_epoch, t.start_step = start
    t.run()
    expect = []
    for epoch in range(start[0] if start else 0, 3):
        t.sampler.set_epoch(epoch)
        t.sampler.start = 16 * (start[1] if start and epoch == start[0] else 0)
        paths = [t.train_set.samples[i][0] for i in t.sampler]
        expect += [paths[b:b + 16] for b in range(0, len(paths) - 15, 16)]
    out[name] = {"passes": passes.count("PlanBatches"), "batches": len(trained),
                 "in_order": trained == expect, "first": trained[0][:2], "expect": expect[0][:2]}
print(json.dumps(out))
"""


def test_decode_device_reads_the_whole_job_in_one_loader_pass_in_each_epochs_order(run_in_image):
    """--decode device should iterate its loader once for the whole job (the workers read on
    across epoch ends) and still train each epoch's batches in that epoch's sampler order,
    from the saved batch on when resuming."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              f"python3 - <<'EOF'\n{ONE_ITERATION}\nEOF\n")
    code, logs = run_in_image(["bash", "-c", script], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    r = json.loads(logs.strip().splitlines()[-1])
    # 48 training images in batches of 16: 3 batches an epoch; the resume skips 3 + 1.
    assert r["whole"]["batches"] == 9 and r["resumed"]["batches"] == 5, r
    assert r["whole"]["passes"] == 1 and r["resumed"]["passes"] == 1, (
        f"the loader was iterated once per epoch, not once for the job: {r}")
    assert r["whole"]["in_order"] and r["resumed"]["in_order"], (
        f"the batches are not the sampler's order of each epoch: {r}")


# After each validation of a --decode device run on CPU: the DataLoader worker processes alive
# and the loader iterators that still exist. The garbage collector is off, so an iterator kept
# only by a reference cycle stays (as it did until the collector happened to run, once inside a
# later loader's forked worker, where its __del__ broke that loader's pipes: EOFError in CI).
VAL_WORKERS_END = r"""
import gc, json, multiprocessing, sys, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp
import trainamp.trainer
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
gc.disable()
after, evaluate = [], trainamp.trainer.evaluate
def counting(*a, **k):
    result = evaluate(*a, **k)
    after.append({"workers": len(multiprocessing.active_children()),
                  "iterators": sum(isinstance(o, _MultiProcessingDataLoaderIter)
                                   for o in gc.get_objects())})
    return result
trainamp.trainer.evaluate = counting  # where the trainer looks it up
args = train_amp.build_parser().parse_args([
    "--data", "imgs", "--decode", "device", "--model", "resnet18", "--image-size", "32",
    "--batch-size", "16", "--epochs", "3", "--num-workers", "2", "--checkpoint-dir", "",
    "--progress", "none", "--device", "cpu"])
train_amp.fill_defaults(args)
train_amp.Trainer(args, train_amp.Ranks(), torch.device("cpu"), train_amp.StopRequest()).run()
print(json.dumps(after))
"""


def test_decode_device_validation_shuts_its_workers_down_when_each_validation_ends(run_in_image):
    """--decode device (here on CPU, where batches are prepared inline) should let go of each
    validation's loader iterator when the validation ends, so that its workers exit there and
    then, not whenever the garbage collector - maybe in a later loader's worker - gets to it."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              f"python3 - <<'EOF'\n{VAL_WORKERS_END}\nEOF\n")
    code, logs = run_in_image(["bash", "-c", script], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    after = json.loads(logs.strip().splitlines()[-1])
    # Left: the training loader's 2 persistent workers and its one iterator while the job's
    # single training pass lasts; by the last validation that pass is over: nothing.
    assert after == [{"workers": 2, "iterators": 1}] * 2 + [{"workers": 0, "iterators": 0}], (
        f"validation workers or iterators outlived their validation: {after}")


# The thread that prepares --decode device batches on a GPU, started where it cannot start (no
# GPU here: its set_device fails): the training thread must get the error, not wait for ever.
THREAD_START_FAILS = r"""
import sys, threading, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp
batches = train_amp.DeviceBatches([], 32, torch.device("cuda", 0), False, True,
                                  train_amp.BadImages())
seen = {}
def train():
    try:
        next(iter(batches.epoch(0)))
        seen["error"] = "none: a batch came"
    except BaseException as e:
        seen["error"] = type(e).__name__
trainer = threading.Thread(target=train, daemon=True)
trainer.start()
trainer.join(60)
print("HUNG" if trainer.is_alive() else f"RAISED {seen['error']}")
"""


def test_a_batch_thread_that_cannot_start_fails_training_instead_of_hanging_it(run_in_image):
    """If the --decode device batch thread fails before its first batch (here: no GPU for its
    set_device), the training thread should raise that error, not wait on the queue for ever."""
    code, logs = run_in_image(["python3", "-c", THREAD_START_FAILS], timeout=120)
    assert code == 0, f"exited {code}:\n{logs}"
    last = logs.strip().splitlines()[-1]
    assert last.startswith("RAISED") and "none" not in last, (
        f"the training thread should get the batch thread's error: {last}\n{logs[-2000:]}")


# --decode device with the workers decoding a share of each batch (CollateBytes) against the
# GPU decoding all of it: the same image for every label, a file the CPU cannot decode left to
# the device decoder (which names it), and the CPU's images first in the batch. Prints JSON.
CPU_SHARE = r"""
import json, sys, torch
from torchvision.io import encode_jpeg
sys.path.insert(0, "/usr/local/bin")
import train_amp

gen = torch.Generator().manual_seed(0)
batch = []
for label in range(12):
    img = torch.randint(0, 256, (3, 40 + 3 * label, 60 - 2 * label), dtype=torch.uint8,
                        generator=gen)
    data = encode_jpeg(img, quality=90)
    batch.append((data[:60] if label == 1 else data, label, f"{label}.jpg"))  # 1: truncated
out = {}
for share in (0.0, 0.5):
    packed, y = train_amp.CollateBytes(share)(batch)
    bad = train_amp.BadImages()
    bad.report = lambda found, bad=bad: bad.__dict__.setdefault("found", []).extend(found)
    x, keep = train_amp.decode_on_device(packed, False, 16, torch.device("cpu"), bad)
    y = y[list(keep)]
    out[share] = {"cpu_decoded": len(packed.shapes), "labels": y.tolist(),
                  "bad": [p for p, _ in bad.__dict__.get("found", [])],
                  "images": {int(l): x[i] for i, l in enumerate(y)}}
a, b = out[0.0], out[0.5]
print(json.dumps({
    "cpu_decoded": [a["cpu_decoded"], b["cpu_decoded"]], "labels": [a["labels"], b["labels"]],
    "bad": [a["bad"], b["bad"]],
    "worst_diff": max((a["images"][k] - b["images"][k]).abs().max().item() for k in a["images"]),
    "same_labels": sorted(a["images"]) == sorted(b["images"])}))
"""


def test_workers_decoding_part_of_each_batch_give_the_same_images_and_labels(run_in_image):
    """--decode-cpu-share: the workers' CPU-decoded images should come first, each with its own
    label, equal to what the device decoder makes of the same file; a file the CPU cannot
    decode goes on to the device decoder, which names it once."""
    code, logs = run_in_image(["python3", "-c", CPU_SHARE], timeout=300)
    assert code == 0, f"exited {code}:\n{logs}"
    r = json.loads(logs.strip().splitlines()[-1])
    # 12 files, half for the CPU: 6 minus the truncated one decoded there, first in the batch.
    assert r["cpu_decoded"] == [0, 5], r
    assert r["labels"][1][:5] == [0, 2, 3, 4, 5], f"the CPU's images are not first: {r}"
    assert r["bad"] == [["1.jpg"], ["1.jpg"]], f"the truncated file should be named once: {r}"
    assert r["same_labels"] and r["worst_diff"] == 0, f"an image changed or lost its label: {r}"


# The GPU path's fused Triton kernel (crop_to_batch) against the roi_align path it replaces,
# run by Triton's interpreter on CPU: shrinking (several samples per output pixel), enlarging,
# a crop touching the edges, flips, both memory formats, and batches split into groups.
FUSED_CROP = r"""
import json, sys, torch
sys.path.insert(0, "/usr/local/bin")
import train_amp

assert train_amp.use_fused_crop(torch.device("cpu")), "Triton's interpreter is not in use"
gen = torch.Generator().manual_seed(0)
shapes = [(37, 50), (64, 33), (20, 90), (12, 12), (90, 70), (8, 200)]
imgs = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen) for h, w in shapes]
boxes = train_amp.random_crop_boxes(shapes, gen)
boxes[0] = torch.tensor([0., 0., 50., 37.])  # the whole image: samples on every edge
flip = torch.rand(len(imgs), generator=gen) < 0.5
flip[:2] = torch.tensor([True, False])
worst, one_group = {}, train_amp.DecodeOptions().pad_group_elems
for channels_last in (False, True):
    for group_elems in (one_group, 3 * 40 * 60):
        for size in (16, 24):
            fused, ref = (train_amp.crop_to_batch(imgs, boxes, flip, size, channels_last,
                                                  train_amp.DecodeOptions(fused_crop=on,
                                                                          pad_group_elems=group_elems))
                          for on in (True, False))
            key = f"cl={channels_last} groups={group_elems} size={size}"
            assert fused.is_contiguous(memory_format=torch.channels_last if channels_last
                                       else torch.contiguous_format), key
            worst[key] = (fused - ref).abs().max().item()
print(json.dumps(worst))
"""


def test_gpu_crop_kernel_matches_the_roi_align_path(run_in_image):
    """The Triton kernel that crops, resizes, flips and normalises a whole batch on the GPU
    should compute what roi_align + flip + normalise compute (run here in Triton's CPU
    interpreter, so a wrong index, flip or filter shows on a CPU host)."""
    code, logs = run_in_image(["python3", "-c", FUSED_CROP], timeout=300,
                              environment={"TRITON_INTERPRET": "1"})
    assert code == 0, f"exited {code}:\n{logs}"
    worst = json.loads(logs.strip().splitlines()[-1])
    # Normalised units (1/255 of a channel is ~0.017): float rounding only.
    bad = {k: v for k, v in worst.items() if v > 1e-4}
    assert not bad, f"the fused crop differs from roi_align + flip + normalise: {bad}"
