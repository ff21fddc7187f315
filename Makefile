# spotrain: `make local` runs the rehearsal on the local cloud (deploy, train, spot interruption,
# resume, replica-region restore, report); `make test` runs every test.
# Both install what they need first (pinned), into .venv, .venv-checkov and node_modules.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv

# Keep tools from calling home; silence jsii's banner for the node this project runs on.
export CHECKPOINT_DISABLE := 1
export BC_SKIP_MAPPING := TRUE
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
# Bytecode is compiled on first import and cached (PIP_INSTALL below; git ignores the caches):
# a shell that forbids the caches would have every process compile torch anew.
unexport PYTHONDONTWRITEBYTECODE
# DeepSpeed's CPU Adam (the optimizer offload) is compiled at first use, about three minutes of
# one core: into this checkout's environment, so it is built once for it and never clashes with
# another checkout's build (a build records its sources' paths: the other would rebuild).
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch-extensions

.PHONY: setup prerequisites local down test test-fast lint scan clean

# The three environments are independent and each installer uses one core: they install at once.
setup: prerequisites
	@$(MAKE) --no-print-directory --jobs=3 --output-sync=target \
	  $(VENV)/.installed .venv-checkov/.installed node_modules/.installed

prerequisites:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || \
	  { echo "spotrain needs Python 3.11: install it or run make PYTHON=python3.11"; exit 1; }
	@command -v terraform >/dev/null || \
	  { echo "terraform is not on PATH: install Terraform 1.10+ (https://developer.hashicorp.com/terraform/install)"; exit 1; }
	@command -v npm >/dev/null || { echo "npm is not on PATH: install Node.js 20+"; exit 1; }

# torch goes first and pinned, with pip and its configuration (a wheel mirror, an index): an
# unpinned or later torch requirement would download the CUDA build with gigabytes of
# libraries. Point TORCH_INSTALL_ARGS at another index for a CUDA build (e.g. --index-url
# https://download.pytorch.org/whl/cu128).
TORCH_INSTALL_ARGS ?=
# Bytecode is compiled on first import instead of at install: most installed modules are never
# imported (most of torch; the AWS provider's 2,137 generated bindings, loaded lazily), and
# compiling them all was two thirds of the installation's CPU time.
PIP_INSTALL := pip install --quiet --disable-pip-version-check --no-compile
# Everything else is installed by uv, from PyPI and the same pins: it downloads in parallel
# and unpacks natively, a fifth of pip's time (the project's packages 5 s instead of 60, on a
# 2-core machine with an empty cache), and compiles no bytecode either. Each environment
# gets its own uv from pip first (3 s), apart from torch (TORCH_INSTALL_ARGS may name an
# index that has torch alone). uv reads its own settings, not pip's: UV_DEFAULT_INDEX names
# a package mirror.
UV := uv==0.13.9
UV_INSTALL = $(1)/bin/uv pip install --quiet --python $(1)/bin/python

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/$(PIP_INSTALL) $(UV)
	$(VENV)/bin/$(PIP_INSTALL) $(TORCH_INSTALL_ARGS) torch==2.13.0
	$(call UV_INSTALL,$(VENV)) -c constraints.txt setuptools wheel
	# DeepSpeed builds against the torch above (no isolated build env that would fetch another)
	# and compiles no ops at install; the trainer avoids the ones it would compile at run time.
	DS_BUILD_OPS=0 $(call UV_INSTALL,$(VENV)) \
	  --no-build-isolation -c constraints.txt deepspeed==0.19.8
	$(call UV_INSTALL,$(VENV)) -c constraints.txt \
	  -e '.[training,infrastructure,localcloud,cost,plots,dev]'
	# Caches the bytecode of what every training process, command and local cloud imports, so
	# that running .venv/bin/... directly from a shell that forbids the caches stays quick.
	$(VENV)/bin/python -c 'import torch._dynamo, torch.distributed.run, deepspeed, \
	  deepspeed.runtime.zero.muon.muon_optimizer, spotrain.cli, spotrain.trainer.train, \
	  spotrain.localcloud.server, moto.moto_server.werkzeug_app'
	touch $@

# checkov pins an older boto3 than the project, so it gets a tool environment of its own.
.venv-checkov/.installed: constraints-checkov.txt
	$(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/$(PIP_INSTALL) $(UV)
	$(call UV_INSTALL,.venv-checkov) -c constraints-checkov.txt checkov==3.3.30
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# KEEP=1 leaves the local cloud running afterwards, with the `local` environment deployed.
local: setup
	$(VENV)/bin/spotrain rehearse $(if $(FLEET),--fleet) $(if $(KEEP),--keep-cloud)

down: setup
	$(VENV)/bin/spotrain local down

# Tests share TEST_WORKERS processes (tests/conftest.py says how they are grouped); 0 runs
# them in this one, for a debugger.
TEST_WORKERS ?= 2

test: setup
	$(VENV)/bin/pytest --numprocesses=$(TEST_WORKERS)

test-fast: setup
	$(VENV)/bin/pytest --numprocesses=$(TEST_WORKERS) -m "not integration and not slow"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

scan: setup
	$(VENV)/bin/spotrain scan --synth

clean:
	rm -rf cdktf.out .spotrain .pytest_cache .ruff_cache
