# shellcheck shell=bash
# Setup step (sourced): write down the GPUs the container started with (GPUS_AT_START, from
# 20-checks.sh) and their /dev/nvidia* nodes for the healthcheck's gpu-health.sh: a GPU lost
# later turns the container unhealthy. Started without a GPU: no record, nothing to lose.

_gpu_record_step() {
  local dir nodes gpu node
  # A restarted container keeps its files: a record must describe this start, not the one before.
  rm -f /run/team/gpus /tmp/team-run/gpus 2>/dev/null
  [ -n "${GPUS_AT_START:-}" ] || return 0
  # The nodes CUDA opens: one per GPU, the control device, unified memory.
  nodes=$(compgen -G '/dev/nvidia[0-9]*'; for n in /dev/nvidiactl /dev/nvidia-uvm; do [ ! -e "$n" ] || echo "$n"; done)
  # Where services.sh writes its state: /run/team, else /tmp/team-run (non-root, --read-only).
  # Plain lines, read and never sourced: the healthcheck runs as root, and a file in /tmp is
  # one that dev could have written.
  for dir in /run/team /tmp/team-run; do
    if mkdir -p "$dir" 2>/dev/null && [ -w "$dir" ]; then
      {
        while IFS= read -r gpu; do echo "gpu $gpu"; done <<< "$GPUS_AT_START"
        for node in $nodes; do echo "node $node"; done
      } > "$dir/gpus"
      return 0
    fi
  done
  log_info "No writable /run/team or /tmp/team-run: the healthcheck cannot notice a GPU lost while the container runs. Fix: docker run --tmpfs /tmp ..."
}

_gpu_record_step
unset -f _gpu_record_step
