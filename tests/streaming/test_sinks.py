"""The sink registry: backends opened by URL scheme, built-ins loaded on use, another one registered."""

import subprocess
import sys

import numpy as np
import pytest

from offgraph.streaming import deltas
from offgraph.streaming.sinks import SINKS, DeltaSink, open_sink, register_sink
from offgraph.streaming.spool.sink import SpoolSink

FORMS = "expected spool:DIR or kafka://HOST:PORT/TOPIC"


def _delta(k=3, dim=4):
    return dict(
        model="ml",
        model_version=1,
        table_ids=np.zeros(k, np.uint32),
        rows=np.arange(k),
        vectors=np.ones((k, dim), np.float32),
        first_order=np.zeros(k, np.float32),
        seqs=np.arange(k),
        event_time_ms=5,
    )


def test_spool_sink_by_url_publishes_a_readable_file(tmp_path):
    with open_sink(f"spool:{tmp_path / 'spool'}") as sink:
        assert isinstance(sink, SpoolSink) and sink.describe() == f"spool:{tmp_path / 'spool'}"
        path = sink.emit(_delta())
    batch = deltas.read(path)
    assert isinstance(batch, deltas.DeltaBatch) and len(batch) == 3


@pytest.mark.parametrize("url", ["spool:", "kafka:/tmp/x", "kafka:", "nope:x", "nocolon", ""])
def test_malformed_or_unknown_urls_name_the_forms(url):
    with pytest.raises(ValueError, match=f"delta sink {url!r}: {FORMS}$"):
        open_sink(url)


def test_a_registered_backend_opens_by_its_scheme_and_joins_the_message(tmp_path):
    class MemorySink(DeltaSink):
        scheme = "mem"
        form = "mem:NAME"

        def __init__(self, name: str) -> None:
            self.name, self.got = name, []

        def emit(self, delta: dict) -> str:
            self.got.append(delta)
            return f"mem:{self.name}"

    register_sink(MemorySink)
    try:
        sink = open_sink("mem:a")
        assert isinstance(sink, MemorySink) and sink.name == "a" and sink.emit(_delta()) == "mem:a"
        with pytest.raises(ValueError, match=f"{FORMS} or mem:NAME$"):
            open_sink("mem:")
    finally:
        del SINKS["mem"]
    with pytest.raises(ValueError, match="not usable"):
        register_sink(type("Bad", (MemorySink,), {"form": "other:NAME"}))


def test_the_registry_imports_no_backend_until_one_is_opened(tmp_path):
    code = (
        "import sys; import offgraph.streaming.sinks as s; "
        "assert not {'offgraph.streaming.kafka.sink', 'offgraph.streaming.spool.sink'} & set(sys.modules); "
        "s.open_sink(sys.argv[1]); "
        "assert 'offgraph.streaming.spool.sink' in sys.modules and 'offgraph.streaming.kafka.sink' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code, f"spool:{tmp_path}"], check=True)
