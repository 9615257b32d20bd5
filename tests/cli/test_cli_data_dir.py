"""`offgraph data NAME` reads `--source DIR`, else `$OFFGRAPH_DATA_DIR/NAME`, else `<repo>/../shared/data/NAME`;
a dataset not found is an error naming the folder it looked in and both ways to point at the files."""

import pyarrow.parquet as pq
import pytest

from offgraph.cli import main
from offgraph.data.data_dir import DATA_DIR_ENV, data_root


def _criteo_tsv(folder):
    folder.mkdir(parents=True)
    row = "\t".join(["1"] + [str(i) for i in range(13)] + ["68fd1e64"] * 26) + "\n"
    (folder / "criteo_10k.tsv").write_text(row * 3)


def test_the_environment_variable_names_the_datasets_folder(tmp_path, monkeypatch, capsys):
    _criteo_tsv(tmp_path / "data" / "criteo-10k")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    assert main(["data", "criteo-10k", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert pq.read_metadata(tmp_path / "out" / "criteo.parquet").num_rows == 3
    assert data_root() == (tmp_path / "data", f"${DATA_DIR_ENV}")


def test_source_wins_over_the_environment(tmp_path, monkeypatch, capsys):
    _criteo_tsv(tmp_path / "mine")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "empty"))
    assert main(["data", "criteo-10k", "--out", str(tmp_path / "out"), "--source", str(tmp_path / "mine")]) == 0


@pytest.mark.parametrize("name, file", [("criteo-10k", "criteo_10k.tsv"), ("frappe-86k", "frappe_nfm_valtest_86k.csv")])
def test_not_found_names_the_path_source_and_the_variable(tmp_path, monkeypatch, capsys, name, file):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nowhere"))
    assert main(["data", name, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nowhere' / name / file} not found" in err, err
    assert f"from ${DATA_DIR_ENV}" in err and "--source DIR" in err and f"set {DATA_DIR_ENV}" in err, err
    monkeypatch.delenv(DATA_DIR_ENV)
    assert main(["data", name, "--out", str(tmp_path / "out"), "--source", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'no' / file} not found (looked in {tmp_path / 'no'}, from --source)" in err, err
    assert DATA_DIR_ENV in err, err


def test_without_the_variable_the_default_is_next_to_the_repository(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    root, why = data_root()
    assert root.parts[-2:] == ("shared", "data") and "default" in why


def test_movielens_not_found_names_the_variable(tmp_path, capsys):
    assert main(["data", "movielens-100k", "--out", str(tmp_path / "out"), "--source", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'no'} (from --source) lacks some of" in err and DATA_DIR_ENV in err, err
