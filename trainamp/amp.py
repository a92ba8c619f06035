"""The AMP lesson: what automatic mixed precision takes in a PyTorch training step.

1. autocast: the forward pass runs matmuls and convolutions in a 16-bit dtype (bf16 or fp16)
   while the weights, the optimizer state and the loss stay FP32 (train_step).
2. fp16 has a narrow range: small gradients underflow to zero. A GradScaler multiplies the
   loss before backward, unscales the gradients before clipping, skips the optimizer step when
   they overflowed and adapts the scale (train_step). bf16 has FP32's range: no scaler.
3. The optimizer: fused SGD on a GPU, except beside a GradScaler (make_optimizer says why).
4. Which dtype: bf16 where the hardware computes it, fp16 on older GPUs, FP32 on a CPU
   without bf16 instructions (resolve_amp, cpu_bf16).
5. A guard that stops a run whose loss stays NaN/inf, without a host sync per step (LossGuard).

The rest of the package (data, launch, checkpoints) is the same with or without AMP."""
import contextlib
import math
import os
import pathlib
import re

import torch
import torch.nn.functional as F

from .errors import Diverged, UsageError
from .model import logits_of


def autocast(device_type, amp_dtype):
    """The forward pass's precision: autocast to amp_dtype, or FP32 (None: nothing to do)."""
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=amp_dtype)


def train_step(model, x, y, optimizer, scaler, amp_dtype, grad_clip, device_type, graphs=False):
    """autocast forward; then scale -> backward -> unscale_ -> clip_grad_norm_ -> step -> update.
    With bf16 or FP32 the scaler is disabled and those calls are pass-throughs. graphs: the
    model replays CUDA graphs, whose outputs (the logits, the gradients) the next step's replay
    overwrites: only what this step computed from them is kept (loss, argmax, the update)."""
    if graphs:
        torch.compiler.cudagraph_mark_step_begin()
    with autocast(device_type, amp_dtype):
        logits = logits_of(model(x))
        # The loss in FP32: log-softmax over 16-bit logits loses the small probabilities.
        loss = F.cross_entropy(logits.float(), y)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if grad_clip > 0:
        # Unscale first, or the threshold would apply to the scaled (e.g. x65536) gradients.
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)  # skips the step if the unscaled gradients hold inf/NaN
    scaler.update()
    return loss.detach(), logits.detach()


def make_scaler(device, amp_dtype):
    """A GradScaler for fp16 only; disabled (every call a pass-through) for bf16 and FP32."""
    return torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)


def make_optimizer(model, args, lr, device, amp_dtype):
    """SGD with Nesterov momentum, weight decay on the weights only; fused where it is safe."""
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)  # no weight decay on BN/bias
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # fused=True: one kernel for the whole update on GPU instead of one per tensor. Not with a
    # GradScaler (fp16): fused SGD advances its momentum on the overflow steps the scaler must
    # skip, so the routine first-step overflow turns every weight into NaN (seen on an H200,
    # torch 2.11; LibreYOLO/libreyolo#771). foreach SGD skips those steps cleanly.
    fused = {"fused": True} if device.type == "cuda" and amp_dtype != torch.float16 else {}
    return torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True, **fused)


def make_scheduler(optimizer, warmup, total):
    """Per step: a linear warm-up over `warmup` steps, then a cosine decay to 0 at `total`."""
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def resolve_amp(mode, device):
    """The autocast dtype for --amp on this device (None = FP32)."""
    if mode == "off":
        return None
    if device.type == "cpu":
        if mode == "fp16":
            raise UsageError("--amp fp16 needs a CUDA GPU (float16 autocast with GradScaler);"
                             " on CPU use --amp bf16 (or auto), or --amp off")
        return torch.bfloat16 if mode == "bf16" or cpu_bf16()[0] else None
    # bf16 tensor cores arrived with Ampere (sm_80); older GPUs only emulate it, slowly.
    has_bf16 = torch.cuda.get_device_capability(device)[0] >= 8
    if mode == "bf16" and not has_bf16:
        raise UsageError(f"{torch.cuda.get_device_name(device)} has no bf16 tensor cores:"
                         " use --amp fp16 (or auto)")
    if mode == "auto":
        return torch.bfloat16 if has_bf16 else torch.float16
    return torch.bfloat16 if mode == "bf16" else torch.float16


# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below AVX512_CORE_BF16: oneDNN then emulates bf16.
EMULATED_BF16_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                      "AVX512_CORE_VNNI")


def cpu_bf16():
    """(native, why): whether this CPU computes bf16 in hardware (x86 AVX512-BF16 or AMX),
    and why, in words for the start line. Elsewhere oneDNN emulates bf16: a resnet18 step
    then takes about 10x as long as in FP32 (13x measured at 64 px; benchmarks/results/
    2026-12-05-cpu-bf16.md). With the hardware, bf16 is the faster choice at real image sizes
    (1.65x FP32 at 224 px on an AVX512-BF16 EPYC)."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "")
    if cap.upper() in EMULATED_BF16_ISAS:
        return False, f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN off the CPU's bf16 instructions"
    # torch's own checks (cpuinfo, what its kernels dispatch on); /proc/cpuinfo where absent.
    checks = {"AMX": "_is_amx_tile_supported", "AVX512-BF16": "_is_avx512_bf16_supported"}
    if all(hasattr(torch.cpu, f) for f in checks.values()):
        have = [name for name, f in checks.items() if getattr(torch.cpu, f)()]
    else:
        flags = set(re.findall(r"\w+", pathlib.Path("/proc/cpuinfo").read_text()
                               if os.path.exists("/proc/cpuinfo") else ""))
        have = [name for name, f in (("AMX", "amx_bf16"), ("AVX512-BF16", "avx512_bf16"))
                if f in flags]
    if have:
        return True, f"this CPU has {have[0]}"
    return False, "this CPU has no AVX512-BF16 or AMX: bf16 would be emulated, about 10x slower"


def amp_name(dtype):
    return {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def amp_choice(mode, device, dtype):
    """--amp as the start line shows it: the dtype, and for auto on a CPU, why."""
    if mode != "auto":
        return amp_name(dtype)
    return f"{amp_name(dtype)} (auto{': ' + cpu_bf16()[1] if device.type == 'cpu' else ''})"


def weights_finite(net):
    """All floating-point parameters and buffers finite? (one host sync)"""
    flags = [t.isfinite().all() for t in net.state_dict().values() if t.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


class LossGuard:
    """Stops a run whose loss stays non-finite. The streak of consecutive non-finite losses is
    counted on the device (a sync per step would stall the GPU) and read only where the loop
    waits for the device anyway: at log points and before every checkpoint."""

    def __init__(self, device, scaler, hint):
        # Without a GradScaler (bf16, FP32) a non-finite loss sends NaN/inf gradients into the
        # weights, which never recover: stop after 3 in a row. With one (fp16) a step whose
        # gradients overflow is skipped and the weights kept, so a few non-finite losses (a
        # batch that overflows fp16) are survivable; each skip halves the scale, and after 16
        # in a row the default 2**16 is down to 1: more than the scaler's routine back-off.
        self.limit = 16 if scaler.is_enabled() else 3
        self.streak = torch.zeros((), dtype=torch.int32, device=device)
        self.worst = torch.zeros_like(self.streak)  # the longest streak since the last check
        self.value = torch.zeros((), device=device)  # the latest non-finite loss
        self.hint = hint

    def update(self, loss):
        bad = ~torch.isfinite(loss)
        self.streak.add_(1).mul_(bad)
        torch.maximum(self.worst, self.streak, out=self.worst)
        self.value = torch.where(bad, loss.float(), self.value)

    def check(self, ranks, global_step, net=None):
        """Raise Diverged (on every rank) if the loss stayed non-finite for self.limit steps,
        or when net is given and its weights are not all finite."""
        worst, streak, value = torch.stack([self.worst.float(), self.streak.float(),
                                            self.value.float()]).tolist()
        weights_bad = net is not None and not weights_finite(net)
        if not ranks.any_true(worst >= self.limit or weights_bad):
            self.worst.copy_(self.streak)
            return
        if worst >= self.limit and streak == worst:
            what = (f"the loss has been {value} since global step {global_step - int(streak) + 1}"
                    f" ({int(streak)} steps in a row, the limit is {self.limit})")
        elif worst >= self.limit:
            what = (f"the loss was non-finite ({value}) for {int(worst)} steps in a row before"
                    f" global step {global_step} (the limit is {self.limit})")
        elif weights_bad:
            what = f"the model's weights are no longer finite at global step {global_step}"
        else:
            what = f"the loss went non-finite on another rank by global step {global_step}"
        raise Diverged(f"training diverged: {what}; {self.hint()}")
