# offgraph: `make demo` runs the end-to-end job on real data, `make test` the test suite.
# Both set up .venv/ themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO   ?= out/demo

.PHONY: setup demo test clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

demo: setup
	$(VENV)/bin/offgraph data movielens-100k --out $(DEMO)/data
	$(VENV)/bin/offgraph train --spec examples/movielens.yaml --data $(DEMO)/data/movielens.parquet --out $(DEMO)/run --split per-key-time

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) out
