"""A path naming a scheme offgraph does not support is refused naming the scheme, by export, synth and
serve, before anything is written: never taken as a local folder (issue 50: `offgraph export --out
s3://...` used to write a folder named `s3:`)."""

import pytest

from offgraph.cli import main

BAD = ["gs://bucket/models/ml/1", "http://host/models/ml/1", "foo://x/ml/1"]


@pytest.mark.parametrize("uri", BAD)
@pytest.mark.parametrize(
    "argv",
    [
        lambda uri: ["export", "--run", "no-such-run", "--out", uri],
        lambda uri: ["synth", "--out", uri, "--rows", "1000"],
        lambda uri: ["serve", "--models", uri.rsplit("/", 2)[0]],
    ],
    ids=["export", "synth", "serve"],
)
def test_unsupported_scheme_is_refused_naming_it(argv, uri, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scheme = uri.split("://")[0]
    assert main(argv(uri)) == 2
    err = capsys.readouterr().err
    assert f"unsupported scheme '{scheme}://'" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err  # one line, `offgraph CMD: error: ...`
    assert err.startswith(f"offgraph {argv(uri)[0]}: error: ")
    assert list(tmp_path.iterdir()) == []  # no folder named after the scheme, nothing at all
