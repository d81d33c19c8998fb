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

# The main job: ResNet-50 captured with roofline costs for a V100, every strategy simulated on
# one AWS p3.16xlarge node, ranked; traces, chart and table land in demo-out/.
demo: $(STAMP)
	$(BIN)/trainsched compare resnet50 --batch-size 32 --cluster p3.16xlarge --out-dir demo-out

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q --durations=25

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python benchmarks/capture_zoo.py

clean-venv:
	rm -rf $(VENV)
