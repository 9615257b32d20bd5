"""bench.scale runs an old checkout's own ``offgraph`` (before and after the one-package layout), never
this checkout's installed package under the old one's name."""

import pytest

from bench.lib.server import cli_module


def test_an_old_layout_checkout_runs_its_top_level_cli(tmp_path):
    (tmp_path / "offgraph_cli.py").write_text("")
    assert cli_module(tmp_path) == "offgraph_cli"


def test_a_package_layout_checkout_runs_its_package_cli(tmp_path):
    (tmp_path / "offgraph" / "cli").mkdir(parents=True)
    assert cli_module(tmp_path) == "offgraph.cli"


def test_a_folder_with_neither_entry_point_ends_the_run_naming_it(tmp_path):
    with pytest.raises(SystemExit, match=str(tmp_path)):
        cli_module(tmp_path)


def test_this_checkout_is_the_package():
    assert cli_module(None) == "offgraph.cli"
