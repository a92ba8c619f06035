"""The input pipeline's settings: DecodeOptions, the switches that benchmarks and tests vary,
passed down as one value instead of set as module globals (the defaults are what training
uses); and the constants the --decode flags' defaults come from."""
import dataclasses

# --decode device: the share of each batch the DataLoader workers decode on the CPU
# (CollateBytes). 0 until measured a win over whole epochs (README: input pipeline).
DECODE_CPU_SHARE = 0.0

# CPU cores per GPU at which --decode auto lets the DataLoader workers decode: below it they
# cannot keep an H200 training ResNet-50 with AMP busy (README, input pipeline: 15 workers
# decoded + augmented 2,473 ImageNet-like JPEGs/s, ~165 per core; the GPU trains 6,648/s).
CORES_FOR_WORKER_DECODE = 40


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    # --decode workers: decode a JPEG at 1/2, 1/4 or 1/8 scale where the crop allows
    # (draft_jpeg). Off only to measure what it saves (bench_input.py) or to compare with
    # torchvision's pixels.
    jpeg_draft: bool = True
    # --decode device: crop_to_batch runs the Triton kernel where it can (use_fused_crop);
    # False takes the roi_align path on a GPU too (bench_input.py compares the two).
    fused_crop: bool = True
    # Elements of one padded group of images in crop_resize (and of one buffer of the fused
    # kernel): bounds the memory a batch with a few huge photos takes (a 4000x3000 image padded
    # into every slot would need 12 GB for 256).
    pad_group_elems: int = 3 * 2 ** 26


DEFAULT = DecodeOptions()
