# Two entry points: `make demo` (the main job on a built-in default) and `make test`.
# Each creates .venv/ with the pinned versions of requirements/ci.txt when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint bench clean-venv

$(STAMP): requirements/ci.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements/ci.txt
	$(BIN)/pip install --disable-pip-version-check -q --no-deps -e .
	touch $(STAMP)

# Until the simulator lands, the main job is capture: ResNet-50 measured on this machine, one op
# per block, then the description of what was captured.
demo: $(STAMP)
	$(BIN)/trainsched profile resnet50 --batch-size 8 --granularity module --module-depth 2 -o demo-graph.json
	$(BIN)/trainsched show demo-graph.json

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python benchmarks/capture_zoo.py

clean-venv:
	rm -rf $(VENV)
