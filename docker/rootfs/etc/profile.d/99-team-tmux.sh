# shellcheck shell=sh
# Optional tmux auto-attach: with SSH_TMUX_AUTOATTACH=1, interactive SSH logins join the shared
# session "main", so a dropped connection leaves shells and jobs running. Opt out: ~/.no_auto_tmux.
case $- in *i*) ;; *) return 0 ;; esac
if [ "${SSH_TMUX_AUTOATTACH:-0}" = 1 ] && [ -n "${SSH_TTY:-}" ] && [ -z "${TMUX:-}" ] \
  && [ "${TERM_PROGRAM:-}" != vscode ] && [ ! -e "$HOME/.no_auto_tmux" ] \
  && command -v tmux >/dev/null 2>&1; then
  # Leave the SSH session when tmux detaches or ends; stay in a plain shell if tmux cannot start.
  tmux new-session -A -s main && exit
fi
