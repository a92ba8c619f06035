# shellcheck shell=sh
# Sourced by the Dockerfile's pip steps (bind-mounted at build time, never in a layer): pip's
# index settings for this build only, read from BuildKit secrets, never from build args (those
# are written into the image history, and an index URL may hold user:password).
for _var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST; do
  if [ -s "/run/secrets/$_var" ]; then
    export "$_var=$(cat "/run/secrets/$_var")"
  fi
done
unset _var
if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi
