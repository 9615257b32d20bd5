"""`--columns` (the names of a headerless CSV/TSV file) takes ranges: `label,I1..I13,C1..C26`; a bad range
or a name given twice is a command-line error naming it."""

import argparse
import re
from pathlib import Path

import pytest

from offgraph.cli import build_parser, main
from offgraph.cli.table_args import expand_columns, read_table_args
from offgraph.data.datasets import CRITEO_COLUMNS


def test_ranges_expand_in_order():
    assert expand_columns("label,I1..I13,C1..C26") == CRITEO_COLUMNS
    assert expand_columns(" a , b ") == ["a", "b"]
    assert expand_columns("x7..x7") == ["x7"]
    assert expand_columns("C08..C11") == ["C08", "C09", "C10", "C11"]  # zero-padded names keep their width
    assert expand_columns("f2_1..f2_3") == ["f2_1", "f2_2", "f2_3"]  # the prefix may hold digits


@pytest.mark.parametrize(
    "text, words",
    [
        ("label,I13..I1", "bad range 'I13..I1': it runs backwards (13 > 1); write I1..I13"),
        ("I1..C3", "bad range 'I1..C3': both ends need the same prefix ('I' vs 'C')"),
        ("Ia..Ic", "bad range 'Ia..Ic': a range is <prefix><first>..<prefix><last> with whole numbers"),
        ("I1..", "bad range 'I1..'"),
        ("label,I1,...,I13", "'...' in 'label,I1,...,I13': write a range as I1..I13"),
        ("label,I1..I3,I2", "duplicate column name(s) ['I2']"),
        ("a,,b", "empty column name"),
    ],
)
def test_a_bad_list_is_refused_naming_the_problem(text, words):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        expand_columns(text)
    assert words in str(e.value)


def test_the_command_line_refuses_a_bad_range(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--spec", "s", "--data", "d.tsv", "--out", "o", "--columns", "label,I13..I1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "offgraph train: error: argument --columns: bad range 'I13..I1'" in err, err


def test_the_readme_criteo_columns_read_the_criteo_tsv(tmp_path):
    """The README's --columns line reads a Criteo-shaped headerless TSV (two rows, 40 columns)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    shown = re.findall(r"--columns (label\S*?)`", readme)
    assert shown, "the README shows no --columns"
    tsv = tmp_path / "criteo.tsv"
    tsv.write_text("".join("\t".join(["1"] + [str(i) for i in range(13)] + ["68fd1e64"] * 26) + "\n" for _ in range(2)))
    for columns in shown:
        args = build_parser().parse_args(
            ["train", "--spec", "s", "--data", str(tsv), "--out", "o", "--columns", columns]
        )
        assert read_table_args(args).column_names == CRITEO_COLUMNS, columns
