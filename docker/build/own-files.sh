#!/usr/bin/env bash
# The project's own files as one tree laid out as in the image (the Dockerfile's own stage), made
# the same by every build: modes, owners and mtimes are set here, not taken from the checkout.
# Usage: own-files.sh OWN PYTHON_VERSION   (OWN already holds the COPY'd files)
set -euo pipefail
own=$1
site=/opt/venv/lib/python$2/site-packages
test -f "$own$site/trainamp/main.py" || { echo "own-files.sh: no trainamp in $own$site" >&2; exit 1; }

# Every Python start in /opt/venv imports team_uid_env (a .pth line): code started without the
# entrypoint as a UID with no passwd entry gets a user name and a writable HOME (the file says
# why). team_pip_guard likewise: `pip install --upgrade torch...` says that the pin held it.
for mod in team_uid_env team_pip_guard; do
  ln -s "/usr/local/lib/team/python/$mod.py" "$own$site/$mod.py"
  echo "import $mod" >"$own$site/${mod//_/-}.pth"
done

# Modes as git records them (644, or 755 when executable), whatever the clone's umask; root's.
chown -R 0:0 "$own"
find "$own" -type d -exec chmod 755 {} +
find "$own" -type f -perm /111 -exec chmod 755 {} +
find "$own" -type f ! -perm /111 -exec chmod 644 {} +
# The venv's own directories keep the venv's owner and mode (the builder stage: group 100 may
# pip install there): COPY gives a directory the metadata of its copy in this tree.
dir=$site
while [ "$dir" != /opt ]; do
  chown 0:100 "$own$dir" && chmod 775 "$own$dir"
  dir=${dir%/*}
done

# Byte-compiled here: a read-only root cannot cache them, and compiling costs ~2 ms a start.
python3 /build/layer-trees.py compile "$own" "$site/team_uid_env.py" "$site/team_pip_guard.py" "$site/trainamp"
python3 /build/layer-trees.py normalize "$own"
