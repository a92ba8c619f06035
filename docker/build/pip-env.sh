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

# PyPI as it was at a time (the build arg PYPI_AS_OF: versions.json's pypi_as_of): pip ignores
# every file uploaded later, so two builds of one commit install the same versions however far
# apart they run, and their Python layers are the same (docs/building.md). Empty: the newest.
# Not with a pip mirror: many give no upload times, and pip then stops with "does not provide
# upload-time metadata"; such a build takes the mirror's newest, and says so.
if [ -n "${PYPI_AS_OF:-}" ]; then
  if [ -n "${PIP_INDEX_URL:-}${PIP_EXTRA_INDEX_URL:-}" ]; then
    echo "pip-env: a pip mirror is set: PYPI_AS_OF=$PYPI_AS_OF is not applied (mirrors often give" \
      "no upload times), so this build installs the mirror's newest versions" >&2
  else
    export PIP_UPLOADED_PRIOR_TO="$PYPI_AS_OF"
  fi
fi

# upgrade_pip VENV: pip itself, also as of that time. The venv's own pip (python3-venv's) is too
# old to read the option and takes the newest; the new one then reinstalls the newest pip
# uploaded before that time, which must read the option too.
upgrade_pip() {
  "$1/bin/pip" install --upgrade pip || return
  [ -n "${PIP_UPLOADED_PRIOR_TO:-}" ] || return 0
  "$1/bin/pip" install --force-reinstall --no-deps pip || return
  "$1/bin/pip" install --help | grep -q -- --uploaded-prior-to || {
    echo "pip-env: ERROR: the newest pip before PYPI_AS_OF=$PYPI_AS_OF ignores --uploaded-prior-to:" \
      "move pypi_as_of in versions.json forward (or build with PYPI_AS_OF=)" >&2
    return 1
  }
}
