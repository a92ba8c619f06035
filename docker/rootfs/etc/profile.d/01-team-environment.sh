# shellcheck shell=sh
# Loads the container's environment (written by the entrypoint, no secrets) into login shells:
# SSH logins and tmux windows get docker run -e variables, the venv, CUDA and NVIDIA paths.
# Always reloaded here: /etc/profile has just reset PATH. /etc/bash.bashrc covers `ssh host cmd`.
# Never for root (`docker exec -it C bash`, sudo -i): root sources nothing dev can change, and
# root's shell drops /opt/venv/bin from PATH, since dev can write it (pip install): a command
# dev put there would run as root (python and pip say how to run them as dev: venv-exec).
# Root's `docker exec` has the container's -e variables anyway. Commands by absolute path: PATH
# is not yet trusted here. For dev, only a file root wrote (35-env.sh; it was dev's before).
if [ "$(/usr/bin/id -u)" = 0 ]; then
  PATH=$(printf '%s\n' "$PATH" | /usr/bin/tr ':' '\n' | /usr/bin/grep -vx '/opt/venv/bin/\{0,1\}' | /usr/bin/paste -sd: -)
elif [ -r /etc/team/environment ] && [ "$(/usr/bin/stat -c %u /etc/team/environment)" = 0 ]; then
  # shellcheck source=/dev/null  # written at container start
  . /etc/team/environment
fi
