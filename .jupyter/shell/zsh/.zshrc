# Start-up file of the lab's zsh terminals (see ../../jupyter_server_config.py): yours first, then
# the workbook's Python in front of the PATH, at the workbook's root.
ZDOTDIR="$MINISGL_ZDOTDIR"
[ -f "$ZDOTDIR/.zshenv" ] && . "$ZDOTDIR/.zshenv"
[ -f "$ZDOTDIR/.zshrc" ] && . "$ZDOTDIR/.zshrc"
export PATH="$MINISGL_BIN:$PATH"
cd "$MINISGL_REPO" || true
