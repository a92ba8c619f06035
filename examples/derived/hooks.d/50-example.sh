# shellcheck shell=bash
# An example start-up hook: sourced as root by the entrypoint (log.sh's log_info and user.sh's
# as_nb_user are there). A failing command stops the container, naming this hook: better than
# half-applied setup. Python runs as dev (as_nb_user): the venv is dev's to write, and root
# runs none of it (python refuses root here; docs/security.md).
log_info "example hook: $(jq --version) and tabulate $(as_nb_user python -c 'import tabulate; print(tabulate.__version__)') are installed"
