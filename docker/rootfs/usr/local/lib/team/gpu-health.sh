#!/bin/bash
# Healthcheck part (called by /usr/local/bin/healthcheck): the GPUs the container started with
# (25-gpu-record.sh wrote them down) still answer. Exit 1 with the cause and the fixes when one
# is gone; 0 when all answer, or when the container started without a GPU (nothing to lose).
set -uo pipefail
# Run as root by the healthcheck: system folders only (dev can write /opt/venv/bin; healthcheck).
PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# The one known way a running container loses its GPUs while the host still has them, NVIDIA
# Container Toolkit: "Containers losing access to GPUs with error: Failed to initialize NVML".
NVIDIA_DOC=https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/troubleshooting.html#containers-losing-access-to-gpus-with-error-failed-to-initialize-nvml-unknown-error

# The record: "gpu <index>, <name>" and "node <path>" lines. Only one this user wrote (the
# entrypoint, as root or as --user's UID) counts: the healthcheck runs as that user, and dev
# may write /tmp/team-run; the lines are only read, never run.
gpus_at_start="" nodes_at_start=""
for record in /run/team/gpus /tmp/team-run/gpus; do
  if [ -f "$record" ] && [ ! -L "$record" ] && [ -O "$record" ]; then
    while IFS= read -r line; do
      case "$line" in
        "gpu "*) gpus_at_start+="${gpus_at_start:+$'\n'}${line#gpu }" ;;
        "node "*) nodes_at_start+=" ${line#node }" ;;
      esac
    done < "$record"
    break
  fi
done
[ -n "$gpus_at_start" ] || exit 0

# Cheap when it answers (one NVML query); a hung driver must not hang the check past Docker's
# 10 s HEALTHCHECK timeout, which also has to cover the service checks after this one.
now=$(timeout 5 nvidia-smi --query-gpu=index,name --format=csv,noheader 2>&1)
rc=$?
problem=""
if [ "$rc" = 124 ]; then
  problem="nvidia-smi did not answer within 5 s"
elif [ "$rc" != 0 ] || ! grep -qE '^[0-9]+,' <<< "$now"; then
  problem="nvidia-smi fails: $(head -n 1 <<< "$now")"
else
  listed=$(cut -d, -f1,2 <<< "$now")
  while IFS= read -r gpu; do
    grep -qxF "$gpu" <<< "$listed" || problem+="${problem:+; }nvidia-smi no longer lists GPU $gpu"
  done <<< "$gpus_at_start"
fi
[ -n "$problem" ] || exit 0

# Which device nodes went away or may no longer be opened: "Operation not permitted" is the
# device cgroup refusing them. Only on this failure path: opening a GPU node costs like NVML.
for node in $nodes_at_start; do
  if [ ! -e "$node" ]; then
    problem+="; $node: gone"
  elif ! err=$({ : < "$node"; } 2>&1); then
    problem+="; $node: ${err##*: }"
  fi
done

case "$problem" in
  *"Unknown Error"*|*"Operation not permitted"*)
    advice="Known cause: the host reloaded systemd (systemctl daemon-reload, e.g. by a package upgrade) while Docker uses the systemd cgroup driver, which takes away the GPU access that --gpus gave this container. Fix now: restart the container (docker restart <name>) and resume training from its last checkpoint. For good, on the host (NVIDIA's fixes): start GPU containers through CDI (sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml, then docker run --device nvidia.com/gpu=all ... instead of --gpus all), or set \"exec-opts\": [\"native.cgroupdriver=cgroupfs\"] in /etc/docker/daemon.json and restart Docker. See $NVIDIA_DOC" ;;
  *)
    advice="Check the host: nvidia-smi there, and the kernel log for Xid errors (sudo dmesg | grep -i xid); restart the container once the host sees the GPU again." ;;
esac
echo "unhealthy: a GPU this container started with is gone ($problem). $advice"
exit 1
