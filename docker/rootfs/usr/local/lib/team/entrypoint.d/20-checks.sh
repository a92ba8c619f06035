# shellcheck shell=bash
# Setup step (sourced): start-up checks that print the exact fix (/dev/shm, GPU, driver, GPU
# architecture) and a short banner. Fast on purpose: nvidia-smi and versions.json, no torch import.
# Sets GPUS_AT_START: "index, name" of each GPU nvidia-smi listed, one a line; empty without one
# (25-gpu-record.sh keeps it for the healthcheck).

# _check_shm_and_memlock: /dev/shm big enough for DataLoader workers and NCCL; with RDMA devices,
# a locked-memory limit NCCL can register its buffers under.
_check_shm_and_memlock() {
  local shm_kib
  # DataLoader workers and NCCL pass tensors through /dev/shm; Docker's default is 64 MiB.
  shm_kib=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $2 }')
  if [ -n "$shm_kib" ] && [ "$shm_kib" -lt 1048576 ]; then
    log_warn "/dev/shm is only $((shm_kib / 1024)) MiB: PyTorch DataLoader workers and NCCL fail with 'Bus error' or 'No space left'. Fix: docker run --shm-size=8g ... (or --ipc=host)"
  fi

  # NCCL over InfiniBand/RoCE pins (registers) its buffers; Docker's default locked-memory
  # limit (8 MiB) makes ibv_reg_mr fail, and NCCL then aborts or falls back to TCP sockets.
  # /dev/infiniband/uverbs* is what a container gets when RDMA devices are passed to it.
  local memlock
  if compgen -G '/dev/infiniband/uverbs*' >/dev/null || [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
    memlock=$(ulimit -l)
    if [ "$memlock" != unlimited ] && [ "$memlock" -lt 8388608 ]; then
      log_warn "InfiniBand/RoCE devices are visible but the locked-memory limit is $memlock KiB: NCCL cannot register its buffers and aborts or falls back to TCP sockets. Fix: docker run --ulimit memlock=-1 ... (Slurm/Kubernetes: raise the node's limit, e.g. LimitMEMLOCK=infinity in the slurmd/containerd unit)"
    fi
  fi
}

_checks_step() {
  local versions=/usr/share/team-image/versions.json
  # shellcheck disable=SC2034  # read by 25-gpu-record.sh
  GPUS_AT_START=""
  _check_shm_and_memlock

  # One start of the system's python3 (not the venv's, which dev can write; -I -S: no site
  # packages, no .pth files) reads the build's record (versions.json's row, checked against
  # what was installed): the banner, the minimum driver (versions.json min_driver), the torch and
  # CUDA versions the warnings name, and the GPU architectures torch has kernels for.
  local torch_line="" arch_list="" min_driver="" torch="" cuda="" platform=""
  if [ -r "$versions" ]; then
    { read -r torch_line; read -r arch_list; read -r min_driver torch cuda platform; } < <(/usr/bin/python3 -I -S -c '
import json, sys
v = json.load(open(sys.argv[1]))
print("torch {torch}, CUDA {cuda}, cuDNN {cudnn}, NCCL {nccl}, Python {python}".format(**v)
      + (", " + v["platform"] if v.get("platform") else ""))
print(" ".join(v.get("cuda_arch_list") or []))
print(v.get("min_driver") or "-", ".".join(v["torch"].split(".")[:2]), v["cuda"], v.get("platform") or "-")' "$versions") || true
  fi
  [ "$min_driver" != - ] || min_driver=""
  # A record from before the platform was written: the machine this runs on is the image's.
  [ -n "$platform" ] && [ "$platform" != - ] || platform="linux/$(uname -m | sed 's/^x86_64$/amd64/; s/^aarch64$/arm64/')"
  log_info "Image: ${torch_line:-versions unknown ($versions missing)}"

  _check_gpus "$min_driver" "$torch" "$cuda" "$arch_list" "$platform"
}

# _check_gpus MIN_DRIVER TORCH CUDA "ARCH_LIST" PLATFORM: each GPU nvidia-smi lists, with a WARN
# and the fix for a driver below MIN_DRIVER or an architecture torch has no kernels for. The
# kernel list is the PLATFORM's wheel's: torch 2.15.0 has sm_75/sm_86 kernels on x86_64 only
# and sm_110 on aarch64 only.
_check_gpus() {
  local min_driver=$1 torch=$2 cuda=$3 arch_list=$4 platform=$5
  # The NVIDIA Container Toolkit mounts nvidia-smi and the /dev/nvidia* nodes only with --gpus.
  # No trace of it means a CPU run on purpose (or a forgotten flag): say how, but no WARN, so a
  # normal CPU start stays clean. A trace of it without a working GPU is a real problem: WARN.
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    if compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
      log_warn "GPU device nodes are present but nvidia-smi is missing: the driver libraries were not mounted. Fix: docker run --gpus all (NVIDIA Container Toolkit installed and configured: nvidia-ctk runtime configure)"
    else
      log_info "No GPU visible: running on CPU. For GPUs: docker run --gpus all ... (needs the NVIDIA Container Toolkit on the host)"
    fi
    return 0
  fi
  local gpus
  # compute_cap is a query field only since driver 510; older ones get "unknown" (and a WARN below).
  if ! gpus=$(nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader 2>&1); then
    gpus=$(nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | sed 's/$/, unknown/') || gpus=""
  fi
  if [ -z "$gpus" ] || ! [[ $gpus =~ ^[0-9]+, ]]; then
    log_warn "nvidia-smi is present but lists no GPU ($(printf '%s' "$gpus" | head -n 1)). Fix: check the host driver (nvidia-smi on the host) and run with --gpus all"
    return 0
  fi
  # shellcheck disable=SC2034  # read by 25-gpu-record.sh
  GPUS_AT_START=$(cut -d, -f1,2 <<< "$gpus")

  # torch.cuda.get_arch_list() is empty without a GPU, so a build on a CPU host may have stored
  # none: ask the compiled-in list then (GPU hosts only, about 1 s).
  if [ -z "$arch_list" ]; then
    # As the user: importing torch runs the venv's code, which dev can write (.pth files).
    arch_list=$(as_nb_user python3 -c 'import torch; print(torch._C._cuda_getArchFlags())' 2>/dev/null || true)
  fi

  local idx name driver cc sm
  while IFS=, read -r idx name driver cc; do
    idx=${idx// /}; name=${name# }; driver=${driver// /}; cc=${cc// /}
    log_info "GPU $idx: $name, compute capability $cc, driver $driver"
    if [ -n "$min_driver" ] && [ "$(printf '%s\n%s\n' "$min_driver" "$driver" | sort -V | head -n 1)" != "$min_driver" ]; then
      log_warn "GPU $idx: driver $driver is older than $min_driver, the minimum for CUDA $cuda: torch.cuda will fail with 'The NVIDIA driver on your system is too old'. Fix: upgrade the host's NVIDIA driver to >= $min_driver (data-center GPUs: or use CUDA forward compatibility)"
    fi
    sm=${cc/./}
    # Kernels for sm_XY also run on the same major with a higher minor (sm_86 on an sm_89 GPU).
    if [ -n "$arch_list" ] && [[ $sm =~ ^[0-9]+$ ]] && ! _arch_supported "$sm" "$arch_list"; then
      if [ "${cc%%.*}" -ge 10 ] && [ "$(printf '%s\n' "$torch" 2.7 | sort -V | head -n 1)" != 2.7 ]; then
        # `blackwell` is the moving tag of versions.json's Blackwell row (README: Flavours).
        log_warn "GPU $idx ($name) is a Blackwell GPU (sm_$sm); this image's PyTorch $torch wheels have no kernels for it (they have: $arch_list), so CUDA work fails with 'no kernel image is available'. Fix: use the Blackwell flavour of this image, tag 'blackwell' (PyTorch >= 2.7 built for CUDA 12.8+, with sm_100/sm_120 kernels; host driver >= 580), e.g. docker pull <registry>/team-dl:blackwell"
      else
        log_warn "GPU $idx ($name, sm_$sm) is not in the architectures of this image's PyTorch $torch for $platform ($arch_list): CUDA work fails with 'no kernel image is available'. Fix: use a PyTorch build for $platform that includes sm_$sm"
      fi
    fi
  done <<< "$gpus"
}

# _arch_supported SM "sm_50 sm_86 compute_90 ...": true when a kernel (same major, minor not
# above the GPU's) or PTX (not above the GPU's capability) exists for compute capability SM.
_arch_supported() {
  local want=$1 a num
  for a in $2; do
    num=${a#*_}
    case "$a" in
      sm_*) if [ "${num:0:${#num}-1}" = "${want:0:${#want}-1}" ] && [ "$num" -le "$want" ]; then return 0; fi ;;
      compute_*) if [ "$num" -le "$want" ]; then return 0; fi ;;
    esac
  done
  return 1
}

_checks_step
unset -f _checks_step _check_shm_and_memlock _check_gpus _arch_supported
