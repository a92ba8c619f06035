# shellcheck shell=sh
# Loads the container's environment (written by the entrypoint, no secrets) into login shells:
# SSH logins and tmux windows get docker run -e variables, the venv, CUDA and NVIDIA paths.
# Always reloaded here: /etc/profile has just reset PATH. /etc/bash.bashrc covers `ssh host cmd`.
if [ -r /etc/team/environment ]; then
  # shellcheck source=/dev/null  # written at container start
  . /etc/team/environment
fi
