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
if [ -n "${PYPI_AS_OF:-}" ]; then
  export PIP_UPLOADED_PRIOR_TO="$PYPI_AS_OF"
  if [ -n "${PIP_INDEX_URL:-}${PIP_EXTRA_INDEX_URL:-}" ]; then
    echo "pip-env: packages uploaded before $PYPI_AS_OF only. An index that gives no upload times" \
      "fails with 'does not provide upload-time metadata': then build with PYPI_AS_OF= (the newest)" >&2
  fi
fi

# upgrade_pip VENV: pip itself, also as of PYPI_AS_OF. The venv's own pip (python3-venv's) is too
# old to read that option and takes the newest; the new one then reinstalls the newest pip
# uploaded before that time, which must read the option too.
upgrade_pip() {
  "$1/bin/pip" install --upgrade pip || return
  [ -n "${PYPI_AS_OF:-}" ] || return 0
  "$1/bin/pip" install --force-reinstall --no-deps pip || return
  "$1/bin/pip" install --help | grep -q -- --uploaded-prior-to || {
    echo "pip-env: ERROR: the newest pip before PYPI_AS_OF=$PYPI_AS_OF ignores --uploaded-prior-to:" \
      "move pypi_as_of in versions.json forward (or build with PYPI_AS_OF=)" >&2
    return 1
  }
}
