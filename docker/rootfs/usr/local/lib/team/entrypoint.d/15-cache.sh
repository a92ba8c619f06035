# shellcheck shell=bash
# Step 15: put the download and compile caches (pip, Hugging Face, torch hub, TorchInductor
# and Triton kernels) in $CACHE_DIR, by default /workspace/.cache when /workspace is a mounted
# host directory, so the next container of the image reuses them instead of downloading or
# compiling again (train_amp.py --compile tuned spends minutes tuning kernels the first time).
# CACHE_DIR=none keeps the tools' own defaults inside the container, lost with it.

_cache_step() {
  local dir=${CACHE_DIR-}
  if [ -z "$dir" ]; then
    # Only a bind mount: caches in the image's own /workspace would be lost with the container.
    [ "${WORKSPACE_MOUNTED:-0}" = 1 ] || return 0  # set by 10-user.sh
    dir=/workspace/.cache
  fi
  [ "$dir" = none ] && return 0
  case $dir in
    /*) ;;
    *) log_error "CACHE_DIR must be an absolute path or 'none' (got '$dir'). Fix: -e CACHE_DIR=/workspace/.cache"; exit 64 ;;
  esac
  # A new named volume (-v cache:/cache -e CACHE_DIR=/cache) is an empty folder owned by root:
  # hand it to the user. Never a folder that holds files: those may be someone else's.
  if ! as_nb_user test -w "$dir" 2>/dev/null && [ "$(id -u)" = 0 ] &&
     { [ ! -e "$dir" ] || [ -z "$(ls -A "$dir" 2>/dev/null)" ]; }; then
    mkdir -p "$dir" 2>/dev/null && chown "$NB_USER:$(id -gn "$NB_USER")" "$dir" 2>/dev/null
  fi
  # Made as the user who will write the caches, so a root-owned folder never blocks them.
  if ! as_nb_user mkdir -p "$dir" 2>/dev/null || ! as_nb_user test -w "$dir"; then
    log_warn "Caches stay inside the container: $NB_USER cannot write $dir. Fix: make it writable by UID ${NB_UID:-$(id -u)}, or -e CACHE_DIR=none"
    return 0
  fi
  # Like pytest's .pytest_cache: git ignores the folder without the project's .gitignore.
  if [ ! -e "$dir/.gitignore" ]; then
    printf '# Caches written by the team-dl image (CACHE_DIR), not project files.\n*\n' |
      as_nb_user tee "$dir/.gitignore" >/dev/null
  fi
  # pip, Hugging Face (HF_HOME) and torch hub (TORCH_HOME) default to folders under
  # XDG_CACHE_HOME; Inductor and Triton do not. Values the user set win.
  export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$dir}
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$dir/torchinductor}
  export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$dir/triton}
  log_info "Caches (pip, Hugging Face, torch hub, compiled kernels) persist in $dir; CACHE_DIR=none keeps them in the container"
}
_cache_step
unset -f _cache_step
