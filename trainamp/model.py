"""The model and how it runs: a torchvision classifier (random init), its memory format,
torch.compile (with the compiler checks that fail early), CUDA graphs, DDP, and the backend
flags (TF32, cudnn.benchmark, determinism)."""
import difflib
import importlib
import os
import pathlib
import random
import shutil
import sys
import tempfile

import numpy as np
import torch
import torchvision

from .errors import GiB, UsageError


def classification_models():
    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_model_name(name):
    names = classification_models()
    if name not in names:
        near = difflib.get_close_matches(name, names, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else "see --list-models"
        raise UsageError(f"unknown model {name!r}: {hint} (torchvision classification models"
                         " only, e.g. resnet50)")


def build_model(name, num_classes, image_size):
    """A randomly initialised torchvision classifier (the name is checked by check_args)."""
    kwargs = {"weights": None, "num_classes": num_classes}
    if name.startswith(("vit_", "swin_v2", "maxvit")):
        kwargs["image_size"] = image_size
    if name in ("inception_v3", "googlenet"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = True
    try:
        return torchvision.models.get_model(name, **kwargs)
    except TypeError:
        kwargs.pop("image_size", None)
        return torchvision.models.get_model(name, **kwargs)


def logits_of(out):
    # A few torchvision models return named tuples in training mode.
    return out.logits if hasattr(out, "logits") else out


def is_conv_net(model):
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


def configure_backends(args, device):
    # Strict FP32 unless asked: TF32 changes results and would blur the FP32-vs-AMP comparison.
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    # cudnn.benchmark times the convolution algorithms once per input shape and keeps the fastest.
    torch.backends.cudnn.benchmark = device.type == "cuda" and not args.deterministic
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def check_compiler(device):
    """Fail early with the fix instead of a long Inductor traceback after the first step."""
    supported = getattr(torch._dynamo, "is_dynamo_supported", lambda: True)
    if not supported():
        raise UsageError(f"--compile is not supported on Python {sys.version.split()[0]} with"
                         f" torch {torch.__version__}: drop --compile")
    # On CPU Inductor compiles C++ kernels with $CXX (default g++); on a GPU it writes Triton
    # kernels, and Triton builds its launchers with $CC (default: the first of cc/gcc/clang).
    # Inductor dlopens the kernels it builds from its cache: on a noexec mount (Docker's
    # --tmpfs /tmp is noexec) every compile fails after minutes with a long traceback.
    cache = pathlib.Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or tempfile.gettempdir())
    if on_noexec_mount(cache):
        raise UsageError(f"--compile: Inductor's cache {cache} is on a noexec filesystem, so the"
                         " kernels it builds cannot be loaded: set TORCHINDUCTOR_CACHE_DIR to a"
                         " writable folder that allows exec (docker: --tmpfs /tmp:exec), or"
                         " drop --compile")
    cxx = os.environ.get("CXX") or "g++"
    if device.type == "cpu" and shutil.which(cxx) is None:
        raise UsageError(f"--compile needs a C++ compiler and {cxx!r} was not found: install g++"
                         " (apt-get install g++) or set CXX, or drop --compile")
    if device.type == "cuda":
        cc = os.environ.get("CC")
        if (shutil.which(cc) if cc else next(filter(shutil.which, ("cc", "gcc", "clang")),
                                            None)) is None:
            raise UsageError("--compile on a GPU needs a C compiler for Triton: install gcc"
                             " or set CC, or drop --compile")
        try:
            import triton  # noqa: F401
        except ImportError:
            raise UsageError("--compile on a GPU needs Triton: pip install triton (the version"
                             " torch pins), or drop --compile") from None


def on_noexec_mount(path):
    """Whether the filesystem that holds path (or would: its nearest existing parent) is
    mounted noexec."""
    path = pathlib.Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return bool(os.statvfs(path).f_flag & getattr(os, "ST_NOEXEC", 0))
    except OSError:
        return False


def use_compile(args, device):
    """--compile on/tuned/off as given; auto: on for a GPU when compiling can work, else off."""
    if args.compile != "auto":
        return args.compile in ("on", "tuned")
    if device.type != "cuda":
        return False  # on CPU, compiling costs more than it saves on all but long runs
    try:
        check_compiler(device)
    except UsageError:
        return False
    return True


def use_channels_last(args, device, net):
    """--channels-last on/off as given; auto: on for conv nets on a GPU (tensor-core NHWC)."""
    return args.channels_last == "on" or (
        args.channels_last == "auto" and device.type == "cuda" and is_conv_net(net))


def use_cuda_graphs(args, device, ranks, compiled):
    """--cuda-graphs on: checked, it needs what it replays. Not with DDP: its bucketed
    all-reduce splits the compiled graph and runs between the pieces, untested here."""
    if args.cuda_graphs != "on":
        return False
    if not (compiled and device.type == "cuda"):
        raise UsageError("--cuda-graphs replays the compiled model on a GPU: it needs --compile"
                         " and a CUDA device; drop --cuda-graphs")
    if ranks.enabled:
        raise UsageError("--cuda-graphs is for one process on one GPU (with DDP's all-reduce it"
                         " is untested): drop --cuda-graphs")
    return True


def wrap_model(net, plan, ranks):
    """DDP when distributed, then torch.compile when the Plan says: (the model to call,
    compiled?, CUDA graphs?)."""
    model, device, compiled, graphs = net, plan.device, plan.compile, plan.cuda_graphs
    if ranks.enabled:
        model = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None)
    if compiled:
        # Inductor reads its config when it compiles, at the first call: set it either way so
        # one process (benchmarks/bench_amp.py) can run tuned and untuned configurations in turn.
        # Coordinate descent re-times each generated kernel's block sizes around the
        # heuristic's pick; on ResNet-50 that speeds up the BatchNorm/ReLU kernels.
        inductor_config().coordinate_descent_tuning = plan.tuned
        # CUDA graphs (what mode="reduce-overhead" sets): one replay instead of launching
        # ~940 kernels a step from Python.
        inductor_config().triton.cudagraphs = graphs
    return (torch.compile(model) if compiled else model), compiled, graphs


def cuda_graph_skips():
    """How often Inductor compiled a graph without CUDA graphs although asked (say a mutated
    input): it logs why only under TORCH_LOGS=perf_hints and runs on, slower. Process-wide."""
    from torch._dynamo.utils import counters
    return counters["inductor"].get("cudagraph_skips", 0)


def inductor_config():
    return importlib.import_module("torch._inductor.config")  # not loaded by "import torch"


def tuning_on():
    """What Inductor will do (read back, so logs and results report the setting in force)."""
    return inductor_config().coordinate_descent_tuning


def peak_mem_gib(device, graphs=False):
    """Peak GPU memory since the last reset. With CUDA graphs the activations live in the
    graphs' private pool, which the allocated figure leaves out once recorded (ResNet-50: 0.65
    GiB instead of 10.5): then the reserved figure, which holds the pool."""
    if device.type != "cuda":
        return None
    return (torch.cuda.max_memory_reserved(device) if graphs
            else torch.cuda.max_memory_allocated(device)) / GiB


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
