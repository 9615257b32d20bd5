"""The command line's flags come from the settings classes (``offgraph.cli.settings_flags``): each setting has
one flag, every flag's help states its default, a bad value is refused naming its flag, and `offgraph
--version` names the installed version."""

import argparse
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from offgraph.cli import build_parser, main
from offgraph.cli.settings_flags import RECORD, flag_name
from offgraph.config import cli_of

REPO = Path(__file__).resolve().parents[2]


def _subcommands(parser: argparse.ArgumentParser, prefix: str = ""):
    """(name, parser) of every subcommand, nested ones (`features load`) too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{prefix}{name} ")
                if not any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield f"{prefix}{name}", sub


SUBCOMMANDS = dict(_subcommands(build_parser()))


def _help_of_each_flag(text: str) -> dict[str, str]:
    """--help text of each flag, by its first option string."""
    blocks: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        m = re.match(r"^  (-[-\w]+)", line)
        if m:
            flag = m[1]
            blocks[flag] = line
        elif flag and line.startswith("    "):
            blocks[flag] += " " + line.strip()
        else:
            flag = None
    return blocks


def test_the_subcommands_are_all_there():
    assert set(SUBCOMMANDS) == {
        "data",
        "train",
        "export",
        "check",
        "import",
        "synth",
        "features load",
        "spec check",
        "spec schema",
        "serve",
        "plan",
        "update",
        "stream-train",
        "prune",
        "experiment set",
        "experiment show",
        "experiment clear",
        "experiment report",
    }


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_flag_shows_its_default_or_is_required(name):
    parser = SUBCOMMANDS[name]
    blocks = _help_of_each_flag(parser.format_help())
    missing = []
    for action in parser._actions:
        if not action.option_strings or action.help is argparse.SUPPRESS or action.default is argparse.SUPPRESS:
            continue  # positionals, --help
        text = blocks[action.option_strings[0]]
        if not action.required and "default" not in text:
            missing.append(text)
    assert not missing, f"offgraph {name} --help states no default for:\n" + "\n".join(missing)


def test_each_setting_has_exactly_one_flag():
    flagged: dict[type, set[str]] = {}
    for name, parser in SUBCOMMANDS.items():
        flags = [s for a in parser._actions for s in a.option_strings]
        assert len(flags) == len(set(flags)), name
        for model, fields in (parser.get_default(RECORD) or {}).items():
            flagged.setdefault(model, set()).update(fields)
            for field in fields:
                flag = flag_name(field, model.model_fields[field])
                assert flags.count(flag) == 1, (name, model.__name__, field, flag)
    assert {m.__name__ for m in flagged} == {
        "ServerConfig",
        "HttpLimits",
        "ListenConfig",
        "UpdaterConfig",
        "StreamTrainConfig",
        "TrainConfig",
        "SynthConfig",
    }
    for model, fields in flagged.items():
        for field, info in model.model_fields.items():
            declared = cli_of(info).get("flag")
            # a field that names a flag is on a command line; one that is not names none (library-only)
            assert (field in fields) == (declared is not None), (model.__name__, field)
            if field in fields:
                assert info.description, f"{model.__name__}.{field}: no description (the flag's help)"


def test_version_prints_the_installed_version():
    r = subprocess.run(
        [sys.executable, "-m", "offgraph.cli", "--version"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"offgraph {version('offgraph')}"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["serve", "--port", "70000"], "offgraph serve: error: ListenConfig.port (--port) must be less than or equal"),
        (["serve", "--workers", "0"], "offgraph serve: error: ListenConfig.workers (--workers) must be greater than"),
        (["serve", "--log-level", "loud"], "offgraph serve: error: ListenConfig.log_level (--log-level) must be"),
        (["serve", "--max-body-mb", "0"], "offgraph serve: error: ServerConfig.max_body_bytes (--max-body-mb) must"),
        (["update", "--model", "ml", "--source", "spool:s", "--durability", "x"], "(--durability) must be 'flush'"),
        (["synth", "--out", "o", "--rows", "1e9", "--quant", "int4"], "SynthConfig.quant (--quant) must be 'int8'"),
        (["train", "--spec", "s", "--data", "d", "--out", "o", "--optimizer", "sgd"], "(--optimizer) must be 'adam'"),
    ],
)
def test_a_bad_value_is_refused_naming_its_flag(tmp_path, capsys, argv, words):
    argv = [*argv[:1], "--models", str(tmp_path), *argv[1:]] if argv[0] in ("serve", "update") else argv
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_switches_keep_their_forms():
    """A setting that is on by default is turned off by its --no- flag; one that is off, on by its flag."""
    from offgraph.cli.settings_flags import settings_from_args
    from offgraph.model.train_config import TrainConfig
    from offgraph.streaming.updater_config import UpdaterConfig

    train = SUBCOMMANDS["train"]
    base = ["--spec", "s", "--data", "d", "--out", "o"]
    assert settings_from_args(TrainConfig, train.parse_args(base)).refit is True
    assert settings_from_args(TrainConfig, train.parse_args([*base, "--no-refit"])).refit is False
    update = SUBCOMMANDS["update"]
    base = ["--models", "m", "--model", "ml", "--source", "spool:s"]
    assert settings_from_args(UpdaterConfig, update.parse_args(base)).sync is False
    assert settings_from_args(UpdaterConfig, update.parse_args([*base, "--sync"])).sync is True
