# layerbatch: two commands for a newcomer, `make demo` and `make test`.
# Both start from nothing: `make setup` creates .venv and installs the project (idempotent).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# Torch is installed first, pinned to the release these machines serve from local disk.
# Override on other machines, e.g. `make setup TORCH_PIN="torch==2.9.1 torchvision==0.24.1"` on aarch64.
TORCH_PIN ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck pytest bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_PIN)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/layerbatch demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy --strict scheduler sim
	$(BIN)/mypy traces layerexec server client layerbatch.py

pytest: setup
	$(BIN)/python -m pytest

test: lint typecheck pytest

bench: setup
	$(BIN)/python bench/scheduler_overhead.py
	$(BIN)/python bench/sim_speed.py
	$(BIN)/python bench/layerexec_overhead.py
	$(BIN)/python bench/server_vs_sim.py
	$(BIN)/python bench/server_capacity.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
