#!/usr/bin/env bash
# apt-get install for Dockerfile RUN steps (bind-mounted at build time, never in a layer).
# Trusts the BuildKit secret ca_bundle when given (TLS-inspecting proxy); keeps no lists.
set -euo pipefail
ca=/run/secrets/ca_bundle
opts=(-o Dpkg::Use-Pty=0)
if [ -s "$ca" ]; then opts+=(-o "Acquire::https::CAInfo=$ca"); fi
# Keep downloaded .debs in the cache mount instead of deleting them (Docker's default).
rm -f /etc/apt/apt.conf.d/docker-clean
apt-get "${opts[@]}" update -qq
apt-get "${opts[@]}" install -y -qq --no-install-recommends "$@" >/dev/null
