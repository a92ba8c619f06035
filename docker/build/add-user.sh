#!/usr/bin/env bash
# Make the image's user: add-user.sh NAME UID GID (Dockerfile RUN, bind-mounted at build time,
# never in a layer). Its home is 0750 on every base (Ubuntu's HOME_MODE; Debian's useradd would
# make it 0755): only the user (and its group) reads it, and the tests see what production gets.
set -euo pipefail
user=$1 uid=$2 gid=$3
# ACCOUNTS_PREFIX: a folder holding a copy of a base's etc/passwd, group, shadow, gshadow, on
# which shadow's --prefix makes the same changes (tests/test_base.py); empty in the build.
prefix=${ACCOUNTS_PREFIX:-}
at=()
if [ -n "$prefix" ]; then at=(--prefix "$prefix"); fi

# A base may ship a login account on the user's IDs: ubuntu:24.04, and so every
# nvidia/cuda:*-ubuntu24.04, has `ubuntu` on 1000:1000, on which groupadd stops ("GID '1000'
# already exists"; jupyterhub/repo2docker#1346). It is removed with its home, so that the user is
# the same on every base (renamed, it would keep that account's groups); the entrypoint's UID
# mapping (10-user.sh) then finds no other name on the UID. System accounts (IDs below 1000)
# are never removed: a clash with one stops the build as before.
if [ "$uid" -ge 1000 ]; then
  mapfile -t holders < <(awk -F: -v id="$uid" -v me="$user" '$3 == id && $1 != me { print $1 }' "$prefix/etc/passwd")
  for name in "${holders[@]}"; do
    echo "add-user.sh: removing the base's account $name (UID $uid), whose IDs $user takes"
    userdel "${at[@]}" --remove "$name"
  done
fi
if [ "$gid" -ge 1000 ]; then
  mapfile -t holders < <(awk -F: -v id="$gid" -v me="$user" '$3 == id && $1 != me { print $1 }' "$prefix/etc/group")
  for name in "${holders[@]}"; do
    echo "add-user.sh: removing the base's group $name (GID $gid), whose ID $user takes"
    groupdel "${at[@]}" "$name"
  done
fi
groupadd "${at[@]}" --gid "$gid" "$user"
useradd "${at[@]}" --create-home --shell /bin/bash --uid "$uid" --gid "$gid" --groups users "$user"
chmod 0750 "$prefix/home/$user"
