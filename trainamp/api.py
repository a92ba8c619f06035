"""The names that code outside the package uses, in one place: train_amp.py re-exports them,
so `import train_amp` (its folder first on sys.path: the repository root, /usr/local/bin in
the image) gives the same names as before the package existed. Who uses what:
benchmarks/bench_amp.py sets up with writable_home/build_parser/fill_defaults/
check_model_name, times with benchmark and train (a Ranks and a StopRequest), and its loader
alone with ImageFolderData/collate_bytes, sizing pools and workers with cpu_cores (as
bench_input.py does); bench_input.py also times the --decode device stages (decode_jpegs,
random_crop_boxes, batch_generator, crop_to_batch with DecodeOptions) and the workers'
transforms (image_transforms, open_image), and writes digits_split out as JPEGs. The tests
call main in-process, step with make_optimizer/train_step, compare random_crop_boxes/
decode_on_device/crop_resize with torchvision's CPU transforms and crop_to_batch's kernel with
its roi_align path (use_fused_crop, DecodeOptions), the workers' share of the decoding with
the device's (CollateBytes, BadImages), one loader pass for the job (Trainer), CUDA graphs
(resolve_plan, wrap_model, build_model) and the launch detection (launch_env, choose_gpu...).
A test that replaces a function to spy on it replaces it in the module that calls it
(trainamp.trainer.train_step, not train_amp.train_step)."""
from .amp import make_optimizer, resolve_amp, train_step
from .checkpoint import fsync, load_checkpoint, save_checkpoint
from .cli import build_parser, fill_defaults, parse_args
from .data.bad import BadImages
from .data.cpu import (
    CollateBytes,
    JpegBatch,
    collate_bytes,
    draft_jpeg,
    image_transforms,
    open_image,
)
from .data.device import (
    batch_generator,
    crop_resize,
    crop_to_batch,
    decode_jpegs,
    decode_on_device,
    normalise,
    random_crop_boxes,
    use_fused_crop,
)
from .data.loader import cpu_cores, default_workers
from .data.options import DecodeOptions
from .data.prefetch import DeviceBatches
from .data.sources import ImageFolderData, SampleFormat, digits_split
from .errors import SaveFailed, UsageError
from .launch import (
    LaunchEnv,
    Ranks,
    StopRequest,
    choose_gpu,
    expand_nodelist,
    launch_env,
    node_gpus,
    pick_device,
    visible_gpus,
    writable_home,
)
from .main import main
from .model import build_model, check_model_name, device_name, wrap_model
from .plan import Plan, resolve_plan
from .report import benchmark
from .trainer import Trainer, evaluate, train

__all__ = [
    "BadImages", "CollateBytes", "DecodeOptions", "DeviceBatches", "ImageFolderData", "JpegBatch",
    "LaunchEnv", "Plan", "Ranks", "SampleFormat", "SaveFailed", "StopRequest", "Trainer",
    "UsageError", "batch_generator", "benchmark", "build_model", "build_parser",
    "check_model_name", "choose_gpu", "collate_bytes", "cpu_cores", "crop_resize",
    "crop_to_batch", "decode_jpegs", "decode_on_device", "default_workers", "device_name",
    "digits_split", "draft_jpeg", "evaluate", "expand_nodelist", "fill_defaults", "fsync",
    "image_transforms", "launch_env", "load_checkpoint", "main", "make_optimizer", "node_gpus",
    "normalise", "open_image", "parse_args", "pick_device", "random_crop_boxes", "resolve_amp",
    "resolve_plan", "save_checkpoint", "train", "train_step", "use_fused_crop", "visible_gpus",
    "wrap_model", "writable_home",
]
