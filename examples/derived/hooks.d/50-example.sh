# shellcheck shell=bash
# An example start-up hook: sourced as root by the entrypoint (log.sh's log_info is there). A
# failing command stops the container, naming this hook: better than half-applied setup.
log_info "example hook: $(jq --version) and tabulate $(python -c 'import tabulate; print(tabulate.__version__)') are installed"
