#!/bin/sh
# Build our small stargz snapshotter daemon (scripts/lazy/main.go) over Debian 12's packaged
# library. Why a build script: Debian ships the library (golang-github-containerd-stargz-
# snapshotter-dev 0.12) but not the daemon, and its service/resolver/cri.go needs k8s.io/cri-api,
# which Debian lacks; we don't use CRI, so a copy of the library tree without that one file
# builds in GOPATH mode with Debian's Go 1.19. Nothing third-party is committed or vendored.
# Usage: scripts/lazy/build-daemon.sh [OUT]   (default /work/lazy-bin/stargz-grpc)
set -eu
out=${1:-/work/lazy-bin/stargz-grpc}
here=$(cd "$(dirname "$0")" && pwd)
lib=/usr/share/gocode/src/github.com/containerd/stargz-snapshotter
for need in go:golang-go "$lib":golang-github-containerd-stargz-snapshotter-dev; do
  path=${need%%:*}
  if ! command -v "$path" >/dev/null 2>&1 && [ ! -e "$path" ]; then
    echo "ERROR build-daemon: $path missing; apt-get install ${need#*:}" >&2
    exit 1
  fi
done
gopath=$(mktemp -d)
trap 'rm -rf "$gopath"' EXIT
# GOPATH = ours (the trimmed copy and main) first, then Debian's packaged tree for the rest.
mkdir -p "$gopath/src/github.com/containerd" "$gopath/src/team-dl/stargz-grpc"
cp -r "$lib" "$gopath/src/github.com/containerd/stargz-snapshotter"
rm "$gopath/src/github.com/containerd/stargz-snapshotter/service/resolver/cri.go"
cp "$here/main.go" "$gopath/src/team-dl/stargz-grpc/main.go"
mkdir -p "$(dirname "$out")"
cd "$gopath/src/team-dl/stargz-grpc"
GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOCACHE="${GOCACHE:-/var/tmp/team-dl-lazy-gocache}" \
  go build -o "$out" .
echo "INFO build-daemon: built $out" >&2
