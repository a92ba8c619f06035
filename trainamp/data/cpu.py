"""The DataLoader workers' side: the training and validation transforms (PIL, JPEGs decoded at
a reduced scale where the crop allows), and --decode device's collate, which reads files and
decodes --decode-cpu-share of each batch on the CPU."""
import math
import typing

import torch

from .bad import split_bad
from .options import DEFAULT


def open_image(path):
    """The workers' loader: the file's header read, its pixels not yet decoded, so that the
    transform can decode a JPEG at a reduced scale (draft_jpeg). PIL closes the file once the
    pixels are loaded."""
    from PIL import Image
    return Image.open(path)


def draft_jpeg(img, need, enabled=True):
    """Have PIL decode a not yet loaded JPEG at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling:
    fewer pixels to decode and to resize) where it still has at least `need` (width, height)
    pixels. -> the factor from the original's coordinates to the decoded image's (1.0: full
    scale). What the crop then resizes from has at least as many pixels as it needs, so the
    output differs from a full decode only by the DCT's downscaling filter. enabled: False
    decodes at full scale (DecodeOptions.jpeg_draft)."""
    if not enabled or img.format != "JPEG":
        return 1.0
    width = img.size[0]
    drafted = img.draft(None, (max(1, need[0]), max(1, need[1])))
    # (mode, box): box is the whole original image in the decoded image's coordinates.
    return drafted[1][2] / width if drafted else 1.0

# torchvision's RandomResizedCrop defaults: 8-100% of the area, aspect 3/4-4/3.
RRC_SCALE, RRC_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


class CropFlip:
    """The workers' training transform, on a PIL image not yet decoded: torchvision's
    RandomResizedCrop (RRC_SCALE, RRC_RATIO; the same draws from torch's generator) + a
    horizontal flip half the time + PILToTensor, decoding a JPEG at the smallest scale that
    leaves the crop at least `size` pixels each way. At full scale the pixels are exactly
    torchvision's (crop, then PIL's antialiased bilinear resize)."""

    def __init__(self, size, draft=True):
        self.size, self.draft = size, draft

    def __call__(self, img):
        from PIL import Image
        from torchvision.transforms import RandomResizedCrop
        from torchvision.transforms.v2.functional import pil_to_tensor
        top, left, h, w = RandomResizedCrop.get_params(img, RRC_SCALE, RRC_RATIO)
        width, height = img.size
        f = draft_jpeg(img, (math.ceil(width * self.size / w), math.ceil(height * self.size / h)),
                       self.draft)
        img = img.convert("RGB")
        out = (img.crop((left, top, left + w, top + h)).resize((self.size,) * 2, Image.BILINEAR)
               if f == 1.0 else
               img.resize((self.size,) * 2, Image.BILINEAR,
                          box=(left * f, top * f, (left + w) * f, (top + h) * f)))
        if torch.rand(1) < 0.5:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return pil_to_tensor(out)


class ResizeCentreCrop:
    """The workers' validation transform, on a PIL image not yet decoded: torchvision's
    Resize(size * 8 / 7) (the shorter side) + CenterCrop(size) + PILToTensor, decoding a JPEG
    at the smallest scale that still has the resized image's pixels. At full scale the pixels
    are exactly torchvision's."""

    def __init__(self, size, draft=True):
        self.size, self.short, self.draft = size, int(size * 8 / 7), draft

    def __call__(self, img):
        from PIL import Image
        from torchvision.transforms.v2.functional import center_crop, pil_to_tensor
        width, height = img.size
        # torchvision's Resize(int) output size: the shorter side `short`, the longer rounded down.
        if width <= height:
            size = self.short, int(self.short * height / width)
        else:
            size = int(self.short * width / height), self.short
        f = draft_jpeg(img, size, self.draft)
        img = img.convert("RGB")
        img = img.resize(size, Image.BILINEAR,
                         box=None if f == 1.0 else (0, 0, width * f, height * f))
        return pil_to_tensor(center_crop(img, [self.size]))


def image_transforms(image_size, options=DEFAULT):
    """The CPU path's (train, val) transforms: RandomResizedCrop + flip, Resize + CenterCrop,
    on images open_image opened (JPEGs decoded at a reduced scale where the crop allows)."""
    return CropFlip(image_size, options.jpeg_draft), ResizeCentreCrop(image_size, options.jpeg_draft)


def collate_images(batch):
    """((images or None, bad), labels): unreadable samples left out and listed in bad."""
    good, bad = split_bad(batch)
    if not good:
        return (None, bad), torch.zeros(0, dtype=torch.int64)
    x, y = torch.utils.data.default_collate(good)
    return (x, bad), y


class JpegBatch(typing.NamedTuple):
    """A --decode device batch from the loader. flat/lengths: the files nvJPEG decodes, one
    flat uint8 tensor; paths: theirs, to name one that fails; unread: [(path, reason)] of files
    that could not be read. pixels/shapes: the images the workers decoded already (CHW uint8,
    one flat tensor, and their heights and widths); they come first in the batch's order."""
    flat: torch.Tensor
    lengths: torch.Tensor
    paths: list
    unread: list
    pixels: torch.Tensor = torch.zeros(0, dtype=torch.uint8)
    shapes: torch.Tensor = torch.zeros(0, 2, dtype=torch.int64)


class CollateBytes:
    """collate_fn of --decode device: (JpegBatch, labels). Runs in the DataLoader workers, and
    there decodes the first cpu_share of each batch's files on the CPU (libjpeg-turbo), so that
    nvJPEG gets fewer: on an H200 its batch of 256 took 15.5 ms alone but 24-45 ms beside the
    training, the pace-setter of the whole pipeline, while the workers only read files. A file
    the CPU cannot decode stays bytes: nvJPEG decodes it or names it."""

    def __init__(self, cpu_share=0.0):
        self.cpu_share = cpu_share

    def __call__(self, batch):
        # One flat tensor (+ lengths or shapes) each: a worker hands the main process one
        # shared-memory block apiece; 256 small tensors would need 256 file descriptors.
        good, bad = split_bad(batch)
        decoded, files, on_cpu = [], [], round(self.cpu_share * len(good))
        for i, sample in enumerate(good):
            img = cpu_decode(sample[0]) if i < on_cpu else None
            (files if img is None else decoded).append((img, sample))
        order = decoded + files
        flat = (torch.cat([s[0] for _, s in files]) if files
                else torch.zeros(0, dtype=torch.uint8))
        pixels = (torch.cat([im.reshape(-1) for im, _ in decoded]) if decoded
                  else torch.zeros(0, dtype=torch.uint8))
        packed = JpegBatch(
            flat, torch.tensor([len(s[0]) for _, s in files], dtype=torch.int64),
            [s[2] for _, s in files], bad, pixels,
            torch.tensor([im.shape[-2:] for im, _ in decoded], dtype=torch.int64).reshape(-1, 2))
        return packed, torch.tensor([s[1] for _, s in order], dtype=torch.int64)


collate_bytes = CollateBytes()  # the GPU decodes every file


def cpu_decode(data):
    """JPEG bytes -> CHW uint8 RGB image on the CPU, or None when it cannot be decoded."""
    from torchvision.io import ImageReadMode, decode_jpeg
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB)
    except RuntimeError:
        return None
