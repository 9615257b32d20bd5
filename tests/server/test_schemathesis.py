"""Schemathesis, every check, against a real uvicorn on 127.0.0.1 serving the tiny real model: 0 failures.

Two passes over every operation: without the admin token (admin calls must be 401s, status and errors
must match the schema) and with it (:load, :unload and :rollback really run, in stateful sequences too).
The size is ``OFFGRAPH_SCHEMATHESIS_EXAMPLES`` examples per operation and phase (CI default: small; ``make
schemathesis`` runs a bigger one with a random seed, see offgraph/server/README.md); the seed is
``OFFGRAPH_SCHEMATHESIS_SEED`` (default fixed, so CI is reproducible).
"""

import os
import re
import subprocess
import sys

import pytest
from server_helpers import TOKEN, ThreadServer, copy_models, server_config

EXAMPLES = int(os.environ.get("OFFGRAPH_SCHEMATHESIS_EXAMPLES", "40"))
SEED = os.environ.get("OFFGRAPH_SCHEMATHESIS_SEED", "20261130")
MIN_CASES = 1000
"""Cases both passes must generate together at the CI size (a smaller run would test too little)."""


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    models = copy_models(tiny_model[0], tmp_path_factory.mktemp("schemathesis") / "models")
    srv = ThreadServer(server_config(models, max_candidates=20))
    yield srv
    srv.stop()


# Model names drawn from the pattern are almost never 'ml' (404s that test routing only): most cases get the
# served model's name, so scoring and the admin actions run for real; likewise the served version and a label.
CONFIG = """
[dictionaries.models]
values = ["ml"]

[dictionaries.versions]
values = ["1"]

[dictionaries.labels]
values = ["canary"]

[parameters]
"path.name" = { dictionary = "models", probability = 0.8 }
"path.version" = { dictionary = "versions", probability = 0.8 }
"path.label" = { dictionary = "labels", probability = 0.8 }

# Named tensors and columns (KServe v2's infer, TF Serving's columnar :predict): which names a model takes and that
# every input has one element per candidate are the model's (its metadata), which a JSON Schema cannot say. A
# schema-valid body may name an input the model lacks or give inputs of two lengths: its answer is the documented
# 400 (KServe) or 422 (TF Serving) naming the input, not a 2xx. Every other check holds for them as for any route.
[[operations]]
include-path-regex = "/infer$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404", "503"]

[[operations]]
include-path-regex = ":predict$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "404", "422", "503"]

# An experiment's weights must sum to 1 and its arms must serve now, which a JSON Schema cannot say: a schema-valid
# body is then the documented 422 (the sum, an arm twice) or 409 (an arm not served) naming the problem (and, as for
# every admin call, 401 without the token).
[[operations]]
include-path-regex = "/experiment$"
include-method = "PUT"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "404", "409", "422"]
"""
OPERATIONS = 31
"""Every operation of /openapi.json: offgraph's own, TensorFlow Serving's and KServe v2's."""


def _run(url: str, cwd, *extra: str) -> tuple[str, int]:
    """One ``st run`` with every check; its output and the number of cases it generated."""
    (cwd / "schemathesis.toml").write_text(CONFIG)
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(cwd / "schemathesis.toml"),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(EXAMPLES),
        "--generation-database",
        "none",
        "--no-color",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        *extra,
    ]
    if SEED:
        cmd += ["--seed", SEED]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    m = re.search(r"(\d+) generated, (\d+) passed", out)  # every generated case passed every check
    assert proc.returncode == 0 and m and m.group(1) == m.group(2), out[-8000:]
    return out, int(m.group(1))


def test_schemathesis_all_checks_without_and_with_the_admin_token(server, tmp_path):
    anon, n_anon = _run(server.url, tmp_path)
    admin, n_admin = _run(server.url, tmp_path, "--header", f"Authorization: Bearer {TOKEN}")
    print(f"schemathesis: {n_anon} cases without the token, {n_admin} with it, 0 failures")
    for out in (anon, admin):
        assert f"Tested: {OPERATIONS}" in out, out[-3000:]  # every operation
    if EXAMPLES >= 40:
        assert n_anon + n_admin >= MIN_CASES, (n_anon, n_admin)
