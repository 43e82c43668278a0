# The two commands a newcomer needs:  make repro  (the whole pipeline, CPU)   make test  (every test)
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)

.PHONY: setup repro test test-frameworks test-cross lint locks clean-envs

# The orchestrator's environment (DVC, test tools): no framework in it.
$(VENV)/.installed: requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	touch $@

# Orchestrator plus the four isolated environments (torch, tf, jax, validation), each from its own lock.
setup: $(VENV)/.installed
	python -m pipelines.runner --setup

repro: setup
	dvc repro

# Each framework's tests run inside that framework's environment; cross-cutting tests run last.
test-frameworks: setup
	python -m pipelines.runner torch -- python -m pytest -q packages/torch_impl/tests
	python -m pipelines.runner tf -- python -m pytest -q packages/tf_impl/tests
	python -m pipelines.runner jax -- python -m pytest -q packages/jax_impl/tests

test-cross: setup
	python -m pytest -q

test: test-frameworks test-cross

lint: $(VENV)/.installed
	ruff check .

locks: $(VENV)/.installed
	python -m uv pip compile pyproject.toml --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --no-header --no-annotate --quiet -o requirements.lock
	python -m pipelines.lock

clean-envs:
	rm -rf .envs
