# layerbatch: two commands for a newcomer, `make demo` and `make test`.
# Both start from nothing: `make setup` creates .venv and installs the project (idempotent).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# Torch is installed first, pinned to the release these machines serve from local disk.
# Override on other machines, e.g. `make setup TORCH_PIN="torch==2.9.1 torchvision==0.24.1"` on aarch64.
TORCH_PIN ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck pytest bench bench-peers clean

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
	$(BIN)/mypy --strict -p scheduler -p sim -p traces -p layerexec -p server -p client -p bench -m layerbatch

pytest: setup
	$(BIN)/python -m pytest

test: lint typecheck pytest

bench: setup
	$(BIN)/python bench/scheduler_overhead.py
	$(BIN)/python bench/sim_speed.py
	$(BIN)/python bench/layerexec_overhead.py
	$(BIN)/python bench/server_vs_sim.py
	$(BIN)/python bench/server_capacity.py

# issue 9: layerbatch against Triton (PyTriton), Ray Serve and TorchServe, the full run (hours);
# the peers live in their own venv, never in .venv; `make bench-peers PEERS_ARGS=--quick` for a quick one
PEERS_VENV ?= .venv-peers
PEERS_ARGS ?=
bench-peers: setup $(PEERS_VENV)/.installed
	$(PEERS_VENV)/bin/python bench/peers.py $(PEERS_ARGS)

$(PEERS_VENV)/.installed: bench/requirements-peers.txt
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet $(TORCH_PIN)
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/requirements-peers.txt
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
