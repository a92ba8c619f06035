"""--decode device on the GPU: nvJPEG decode of a whole batch (decode_jpegs), torchvision's
random resized crop drawn for the batch at once, and crop + resize + flip + normalise in one
Triton kernel (crop_to_batch; roi_align where Triton is missing)."""
import math
import os
import random

import torch

from ..errors import BadImageError, error_text
from .bad import BadImages
from .cpu import RRC_RATIO, RRC_SCALE, JpegBatch
from .crop_kernel import _crop_kernel, triton
from .options import DEFAULT

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)

STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)

# Normalising 0..255 images is one affine map per channel: x * UINT8_SCALE + UINT8_SHIFT.
UINT8_SHIFT, UINT8_SCALE = -MEAN / STD, 1 / (255 * STD)

# One stream per device on which only the JPEG decoder's images are allocated (see decode_jpegs).
_DECODE_STREAMS = {}


def decode_jpegs(datas, paths, device):
    """Decode a batch on the device -> (images, indices of the decoded ones, [(path, reason)]).
    One batched call (nvJPEG); only when that fails, one call per file to find the bad ones.
    On a GPU the caller's stream waits for the images, and the decoder is never handed memory
    that the caller's stream still has queued work on (below)."""
    if device.type != "cuda":
        return _decode_jpegs(datas, paths, device)
    # torchvision allocates the images on the current stream but writes them from a stream of
    # its own that is not ordered after the current one (and nvJPEG's hardware engine ignores
    # stream order anyway): pytorch/vision#9606. Decoding with the side stream current, the
    # last batch's images, freed while its crop kernel was still queued there, could be handed
    # to the decoder and overwritten before that kernel read them: silently wrong training
    # images. So the images are allocated on a stream where nothing else ever runs, and
    # recorded on the caller's: the allocator hands their memory out again only once the
    # caller's stream is past every use of it. No host synchronisation.
    caller = torch.cuda.current_stream(device)
    own = _DECODE_STREAMS.get(device)
    if own is None:
        own = _DECODE_STREAMS[device] = torch.cuda.Stream(device)
    with torch.cuda.stream(own):
        imgs, keep, bad = _decode_jpegs(datas, paths, device)
    caller.wait_stream(own)
    for im in imgs:
        im.record_stream(caller)
    return imgs, keep, bad


def _decode_jpegs(datas, paths, device):
    """decode_jpegs with whatever stream is current."""
    from torchvision.io import ImageReadMode, decode_jpeg
    try:
        return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device), range(len(datas)), []
    except RuntimeError:
        pass
    imgs, keep, bad = [], [], []
    for i, (data, path) in enumerate(zip(datas, paths)):
        try:
            imgs.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
            keep.append(i)
        except RuntimeError as e:
            bad.append((path, error_text(e)))
    return imgs, keep, bad


def random_crop_boxes(sizes, gen, scale=RRC_SCALE, ratio=RRC_RATIO, tries=10):
    """RandomResizedCrop.get_params for a whole batch at once -> (N, 4) float64 boxes
    (x1, y1, x2, y2) in pixels. sizes: (N, 2) heights and widths. The same distribution as
    torchvision's loop: up to `tries` (area, aspect) draws, the first that fits wins, else its
    centre-crop fallback; drawing all tries at once and taking the first fit is equivalent."""
    sizes = torch.as_tensor(sizes, dtype=torch.float64).reshape(-1, 2)
    h, w = sizes[:, :1], sizes[:, 1:]
    n = len(sizes)
    area = h * w * torch.empty(n, tries, dtype=torch.float64).uniform_(*scale, generator=gen)
    aspect = torch.exp(torch.empty(n, tries, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=gen))
    cw, ch = torch.round(torch.sqrt(area * aspect)), torch.round(torch.sqrt(area / aspect))
    fits = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
    first = fits.to(torch.uint8).argmax(1, keepdim=True)
    found = fits.any(1)
    cw, ch = cw.gather(1, first)[:, 0], ch.gather(1, first)[:, 0]
    h, w = h[:, 0], w[:, 0]
    # torchvision's fallback: the whole image, cut to the nearest allowed aspect, centred.
    in_ratio = w / h
    fw = torch.where(in_ratio > ratio[1], torch.round(h * ratio[1]), w)
    fh = torch.where(in_ratio < ratio[0], torch.round(w / ratio[0]), h)
    cw, ch = torch.where(found, cw, fw), torch.where(found, ch, fh)
    u = torch.rand(n, 2, dtype=torch.float64, generator=gen)
    top = torch.where(found, torch.floor(u[:, 0] * (h - ch + 1)), torch.round((h - ch) / 2))
    left = torch.where(found, torch.floor(u[:, 1] * (w - cw + 1)), torch.round((w - cw) / 2))
    return torch.stack([left, top, left + cw, top + ch], 1)


def centre_crop_boxes(sizes):
    """The validation crop: the field of view of Resize(size * 8/7) + CenterCrop(size)."""
    sizes = torch.as_tensor(sizes, dtype=torch.float64).reshape(-1, 2)
    h, w = sizes[:, 0], sizes[:, 1]
    side = torch.round(torch.minimum(h, w) * 7 / 8)
    top, left = torch.floor((h - side) / 2), torch.floor((w - side) / 2)
    return torch.stack([left, top, left + side, top + side], 1)


def crop_resize(imgs, boxes, size, dtype=None, group_elems=DEFAULT.pad_group_elems):
    """Crop boxes[i] of each CHW uint8 image imgs[i] (any sizes) and resize it to size x size:
    one torchvision.ops.roi_align per group of similar sizes instead of a crop + interpolate
    per image. roi_align with aligned=True samples each output pixel's bin on a grid of
    ceil(bin) x ceil(bin) points and averages them: an area filter when shrinking (the
    antialiasing of resize(antialias=True)), plain bilinear when enlarging. -> (N, 3, size,
    size) of dtype (float16 on a GPU: exact for 0..255, half the traffic; float32 on CPU).
    group_elems: DecodeOptions.pad_group_elems."""
    from torchvision.ops import roi_align
    device = imgs[0].device
    dtype = dtype or (torch.float16 if device.type == "cuda" else torch.float32)
    hw = [tuple(im.shape[-2:]) for im in imgs]
    order = sorted(range(len(imgs)), key=lambda i: hw[i][0] * hw[i][1])
    groups, cur, ch, cw = [], [], 0, 0
    for i in order:
        h, w = hw[i]
        nh, nw = max(ch, h + 1), max(cw, w + 1)
        if cur and (len(cur) + 1) * 3 * nh * nw > group_elems:
            groups.append((cur, ch, cw))
            cur, nh, nw = [], h + 1, w + 1
        cur.append(i)
        ch, cw = nh, nw
    groups.append((cur, ch, cw))
    boxes = torch.as_tensor(boxes, dtype=torch.float32)
    out = torch.empty(len(imgs), 3, size, size, dtype=dtype, device=device)
    for idx, gh, gw in groups:
        # Unused padding stays uninitialised: the samples never reach it. One replicated row and
        # column past each image's edge: a bilinear sample in its last pixel reads one beyond.
        # Per image only a view; the copies are one foreach call and the edges two batched
        # index operations (a Python loop of 3 copies per image cost 20 ms a batch on the host).
        pad = torch.empty(len(idx), 3, gh, gw, dtype=torch.uint8, device=device)
        views = [pad[j, :, :hw[i][0], :hw[i][1]] for j, i in enumerate(idx)]
        srcs = [imgs[i] for i in idx]
        if hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(views, srcs)
        else:
            for v, src in zip(views, srcs):
                v.copy_(src)
        hs = to_dev(torch.tensor([hw[i][0] for i in idx]), device)
        ws = to_dev(torch.tensor([hw[i][1] for i in idx]), device)
        j = torch.arange(len(idx), device=device)
        # column w <- column w - 1 (all rows), then row h <- row h - 1 (all columns)
        pad[j, :, :, ws] = pad[j, :, :, ws - 1]
        pad[j, :, hs, :] = pad[j, :, hs - 1, :]
        rois = torch.cat([torch.arange(len(idx), dtype=torch.float32)[:, None], boxes[idx]], 1)
        res = roi_align(pad.to(dtype), to_dev(rois.to(dtype), device), (size, size),
                        spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        if len(groups) == 1:
            out = res.index_select(0, to_dev(torch.as_tensor(
                sorted(range(len(idx)), key=idx.__getitem__)), device))
        else:
            out[to_dev(torch.as_tensor(idx), device)] = res
    return out

# Threads per program of the fused crop kernel's grid (one program: BLOCK output pixels of one
# image, all three channels).
CROP_BLOCK = 256


def use_fused_crop(device, options=DEFAULT):
    """Whether crop_to_batch runs the Triton kernel: on a GPU when Triton is there (the image
    has it: torch.compile needs it), and on CPU only in Triton's interpreter (the tests)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return options.fused_crop and triton is not None and (device.type == "cuda" or interpreted)


def crop_to_batch(imgs, boxes, flip, size, channels_last, options=DEFAULT):
    """Crop boxes[i] (x1, y1, x2, y2) of each CHW uint8 image imgs[i], resize it to size x size,
    mirror it where flip[i] (None: no flips), normalise -> one float32 (N, 3, size, size) batch
    in the model's memory format. On a GPU all of it is one Triton kernel per batch that reads
    the decoded images once and writes the batch once (the same samples as crop_resize's
    roi_align, in float32); elsewhere crop_resize, a flip by index and normalise."""
    device = imgs[0].device
    if not use_fused_crop(device, options):
        x = crop_resize(imgs, boxes, size, group_elems=options.pad_group_elems)
        if flip is not None:
            # Flip by index: one select over the batch, not a flip kernel per image.
            x = torch.where(to_dev(flip.view(-1, 1, 1, 1), device), x.flip(-1), x)
        return normalise(x, device, channels_last)
    n = len(imgs)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty((n, 3, size, size), dtype=torch.float32, device=device, memory_format=fmt)
    shift, scale = UINT8_SHIFT.flatten().tolist(), UINT8_SCALE.flatten().tolist()
    # Per image: where it starts in its group's buffer, height, width, flipped? Built whole,
    # not element by element: this runs on the thread that shares the GIL with training.
    meta = torch.zeros(n, 4, dtype=torch.int64)
    meta[:, 1:3] = torch.tensor([im.shape[-2:] for im in imgs], dtype=torch.int64)
    if flip is not None:
        meta[:, 3] = flip.to(torch.int64)
    # The images of a group are concatenated into one buffer (one copy) for the kernel to
    # index; groups bound the memory a batch of huge photos takes, as in crop_resize.
    groups, first, elems, starts = [], 0, 0, []
    for i, numel in enumerate((3 * meta[:, 1] * meta[:, 2]).tolist()):
        if i > first and elems + numel > options.pad_group_elems:
            groups.append((first, i))
            first, elems = i, 0
        starts.append(elems)
        elems += numel
    groups.append((first, n))
    meta[:, 0] = torch.tensor(starts, dtype=torch.int64)
    meta = to_dev(meta, device)
    boxes = to_dev(torch.as_tensor(boxes, dtype=torch.float32).contiguous(), device)
    for a, b in groups:
        flat = torch.cat([im.reshape(-1) for im in imgs[a:b]])
        grid = (b - a, triton.cdiv(size * size, CROP_BLOCK))
        _crop_kernel[grid](flat, meta[a:b], boxes[a:b], out[a:b], *out.stride(), *shift, *scale,
                           S=size, BLOCK=CROP_BLOCK)
    return out


def to_dev(t, device):
    """A small CPU tensor to the device without blocking the host: a copy from pageable memory
    first waits for everything queued on the stream; from pinned memory it is just queued."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def batch_generator(seed):
    return torch.Generator().manual_seed(seed)


def decode_on_device(packed, train, image_size, device, bad_images=None, gen=None,
                     channels_last=False, options=DEFAULT):
    """--decode device: JPEG decode on the device (nvJPEG on a GPU, one batched call), then a
    random resized crop + flip (train) or a centre crop (val) of the whole batch at once,
    normalised. -> (float32 images in the model's memory format, indices of the batch's
    samples they are): unreadable files go to bad_images. gen: the torch.Generator of the
    crops."""
    b = JpegBatch(*packed)
    imgs, keep, bad = [], [], []
    if len(b.lengths):
        imgs, keep, bad = decode_jpegs(list(torch.split(b.flat, b.lengths.tolist())), b.paths,
                                       device)
    if len(b.shapes):  # the images the workers decoded come first
        pixels = b.pixels.to(device, non_blocking=True)  # pinned by the loader: queued
        hw = b.shapes.tolist()
        imgs = [p.view(3, h, w) for p, (h, w) in zip(
            torch.split(pixels, [3 * h * w for h, w in hw]), hw)] + list(imgs)
        keep = list(range(len(hw))) + [len(hw) + k for k in keep]
    failed = b.unread + bad
    (BadImages() if bad_images is None else bad_images).report(failed)
    if not imgs:
        raise BadImageError(f"no image of a batch of {len(failed)} could be read (the first:"
                            f" {failed[0][0]}): check the data set")
    sizes = [im.shape[-2:] for im in imgs]
    flip = None
    if train:
        gen = gen or batch_generator(random.getrandbits(62))
        boxes = random_crop_boxes(sizes, gen)
        flip = torch.rand(len(imgs), generator=gen) < 0.5
    else:
        boxes = centre_crop_boxes(sizes)
    return crop_to_batch(imgs, boxes, flip, image_size, channels_last, options), keep


def normalise(x, device, channels_last):
    """uint8-range images -> (x / 255 - mean) / std as float32, in the model's memory format:
    one fused kernel (addcmul into a tensor that already has the layout)."""
    if device not in _NORM_AFFINE:
        _NORM_AFFINE[device] = (UINT8_SHIFT.to(device), UINT8_SCALE.to(device))
    shift, scale = _NORM_AFFINE[device]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty(x.shape, dtype=torch.float32, device=device, memory_format=fmt)
    return torch.addcmul(shift, x, scale, out=out)

_NORM_AFFINE = {}
