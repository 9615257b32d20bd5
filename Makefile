# offgraph: `make demo` runs the end-to-end job on real data, `make test` the test suite,
# `make test-fast` its fast tier (the edit loop). All set up .venv/ themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO   ?= out/demo

.PHONY: setup lint demo demo-experiment test test-fast schemathesis bench-scale image clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py offgraph/server/api/_wire_keys.c offgraph/server/grpc/tfserving-api.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[server,test,lint]'
	$(VENV)/bin/pip install -q --no-deps -r offgraph/server/grpc/tfserving-api.txt  # why: that file
	touch $@

demo: setup
	$(VENV)/bin/offgraph data movielens-100k --out $(DEMO)/data
	$(VENV)/bin/offgraph train --spec examples/movielens.yaml --data $(DEMO)/data/movielens.parquet --out $(DEMO)/run --split per-key-time
	rm -rf $(DEMO)/models
	$(VENV)/bin/offgraph export --run $(DEMO)/run --out $(DEMO)/models/movielens/1 --quant fp32 --shards 4 \
	    --feature-data $(DEMO)/data/movielens.parquet --feature-rows all
	$(VENV)/bin/offgraph check --model $(DEMO)/models/movielens/1 --run $(DEMO)/run --data $(DEMO)/data/movielens.parquet --limit 20000 --ids-only
	$(VENV)/bin/offgraph export --run $(DEMO)/run --out $(DEMO)/models/movielens/2 --quant int8 --shards 4 \
	    --hot-set-data $(DEMO)/data/movielens.parquet
	$(VENV)/bin/offgraph check --model $(DEMO)/models/movielens/2 --run $(DEMO)/run --data $(DEMO)/data/movielens.parquet --limit 20000
	$(PY) examples/demo_request.py --models $(DEMO)/models --data $(DEMO)/data/movielens.parquet
	$(PY) examples/demo_freshness_auc.py --out $(DEMO)/stream

# An online experiment replayed on MovieLens-100k's held-out user-days (examples/experiment_replay.py): a pointwise and
# a listwise model exported as two versions, served with the served log, three arms sticky by user (the items' prior
# order, pointwise, listwise), one request per user-day, outcomes from the ratings, `offgraph experiment report`.
# 272 s on the 2 idle cores (up to 8 min while other jobs load them); a second run reuses the models. Figures: README "Experiments", bench/results/experiment-replay/
EXPERIMENT ?= out/demo-experiment
EXPERIMENT_ARGS ?=
demo-experiment: setup
	$(PY) examples/experiment_replay.py --out $(EXPERIMENT) $(EXPERIMENT_ARGS)

# lint and format (ruff), the package's layers and no import cycles (import-linter), types (mypy): pyproject.toml
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# every test; pytest-timeout stops any one test after 300 s (pyproject.toml). tests/parts.py first installs
# the system programs the tests need (as root, apt-get), fetches MovieLens, or stops naming what it could not get;
# OFFGRAPH_TEST_WITHOUT=part,... runs a reduced tier without those parts (their tests skip, saying so)
test: setup
	$(PY) tests/parts.py
	$(PY) -m pytest -q

# unit tests only: no model training, no subprocesses or servers (tests/tiers.py marks the rest slow)
test-fast: setup
	$(PY) -m pytest -q -m "not slow" --timeout 60

# the HTTP contract at a bigger size than CI's: every check, with and without the admin token, a random seed
EXAMPLES ?= 400
schemathesis: setup
	OFFGRAPH_SCHEMATHESIS_EXAMPLES=$(EXAMPLES) OFFGRAPH_SCHEMATHESIS_SEED= $(PY) -m pytest -q -s --timeout 0 tests/server/test_schemathesis.py

# Tables beyond RAM: synthetic models of 10^7..10^9 rows served (10^9's Zipf cell 3 times), swapped under load
# at 2x10^8, the 10^7 and 10^8 cells alternated with the code of BASELINE (bench/README.md). Versions are kept
# and reused (--keep) under SCALE_WORK; it prints the disk it needs first (the disk and time a run takes:
# bench/results/scale/README.md).
# BASELINE= (empty) skips the old code.
SIZES ?= 1e7,1e8,2e8,1e9
SCALE_WORK ?= out/scale-models
SCALE_OUT ?= bench/results/scale
BASELINE ?= bfc68cc
SCALE_ARGS ?=
bench-scale: setup
	$(VENV)/bin/pip install -q -e '.[scale]'
	$(if $(BASELINE),rm -rf $(SCALE_WORK)/baseline-src && mkdir -p $(SCALE_WORK)/baseline-src && \
		git archive $(BASELINE) | tar -x -C $(SCALE_WORK)/baseline-src)
	$(PY) -m bench.scale --sizes $(SIZES) --workdir $(SCALE_WORK) --out $(SCALE_OUT) --keep \
		$(if $(BASELINE),--baseline-repo $(SCALE_WORK)/baseline-src) $(SCALE_ARGS)

# The image localhost/offgraph:<version> from the Containerfile (buildah, as root; `IMAGE=name:tag make image`).
# Where no registry answers, its base is made from Debian's packages first (deploy/image/base-offline.sh).
# About 3 min the first time and after a pyproject.toml change, under a minute after a code change (README.md)
image:
	deploy/image/build.sh

clean:
	rm -rf $(VENV) out
