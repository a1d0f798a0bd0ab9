# The README's commands. Each target creates .venv and installs what it needs, so a fresh
# clone on a machine with only Python 3.11+ works.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run demo test lint typecheck bench-commit bench-assign bench-client bench-spark bench-handoff bench-stall bench-workers bench-streams bench-scale bench chaos clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing keyrange and its dev dependencies into $(VENV) (first run takes a few minutes)"
	@$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	@$(PY) -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/keyrange serve

demo: $(STAMP)
	$(PY) -m examples.demo

test: $(STAMP)
	$(VENV)/bin/ruff check coordinator client migrations tests bench examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check coordinator client migrations tests bench examples
	$(VENV)/bin/ruff format --check coordinator client migrations tests bench examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

bench-commit: $(STAMP)
	$(PY) -m bench.commit

bench-assign: $(STAMP)
	$(PY) -m bench.assign

bench-client: $(STAMP)
	$(PY) -m bench.consumer

bench-spark: $(STAMP)
	$(PY) -m bench.spark

bench-handoff: $(STAMP)
	$(PY) -m bench.handoff

bench-stall: $(STAMP)
	$(PY) -m bench.commit_stall

bench-workers: $(STAMP)
	$(PY) -m bench.workers

bench-streams: $(STAMP)
	$(PY) -m bench.streams

bench-scale: $(STAMP)
	$(PY) -m bench.scale

bench: bench-commit bench-assign bench-client bench-spark bench-handoff bench-stall bench-workers bench-streams bench-scale

# Fault injection (tests/chaos, docs/guarantees.md): SEED=7 DURATION=300 make chaos
# Two runs of DURATION seconds per runtime, one runtime after another.
SEED ?= 1
DURATION ?= 180
RUNTIMES ?= run,worker-threads,worker-processes,streams,streams-windowed
chaos: $(STAMP)
	$(PY) -m tests.chaos --seed $(SEED) --duration $(DURATION) --runtimes $(RUNTIMES)

clean:
	rm -rf $(VENV) .keyrange .pytest_cache .mypy_cache .ruff_cache
