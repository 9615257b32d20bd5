"""Every setting of `offgraph serve` and `offgraph update` from its three sources (``offgraph.cli.settings_sources``):
a flag, an ``OFFGRAPH_*`` variable and a ``--config`` YAML file give the same value; flags > environment > file >
defaults; a bad value names its source; unknown names; ``--print-config``; and a real server started from
variables alone runs with the settings it runs with from flags.

The settings are enumerated from the commands' parsers (every long flag but --help, --config, --print-config),
so a setting added to a settings class or by hand is covered without a change here."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from offgraph.cli import build_parser
from offgraph.cli.settings_flags import RECORD, settings_from_args
from offgraph.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
PARSER = build_parser()
COMMANDS = {
    name: p
    for a in PARSER._actions
    if isinstance(a, argparse._SubParsersAction)
    for name, p in a.choices.items()
    if name in ("serve", "update")
}
NOT_SETTINGS = {"help", "config", "print_config"}
# settings the generic values below do not suit: (two values as text, the flags they need beside them)
SPECIAL = {
    "served-log-rate": (("0.5", "0.25"), ["--served-log-dir", "served"]),  # a share; a rate needs a sink
    "served-log-kafka": (("kafka://127.0.0.1:9092/a", "kafka://127.0.0.1:9092/b"), []),
}
RULE = "flags > environment > file > defaults"


@dataclass(frozen=True)
class Setting:
    command: str
    action: argparse.Action
    flag: str  # the long flag
    name: str  # the positive name: file key, and OFFGRAPH_ + upper snake case

    @property
    def env(self) -> str:
        return "OFFGRAPH_" + self.name.upper().replace("-", "_")

    @property
    def switch(self) -> bool:
        return self.action.nargs == 0

    @property
    def choices(self) -> list | None:
        """The flag's choices, or its settings field's ``Literal`` names."""
        if self.action.choices is not None:
            return list(self.action.choices)
        for model, fields in COMMANDS[self.command].get_default(RECORD).items():
            for field, dest in fields.items():
                t = model.model_fields[field].annotation
                if dest == self.action.dest and typing.get_origin(t) is typing.Literal:
                    return list(typing.get_args(t))
        return None

    def texts(self, tmp: Path) -> tuple[str, str]:
        """Two values as text, the first never the default (a switch: the flag's, then the other)."""
        a = self.action
        if self.name in SPECIAL:
            return SPECIAL[self.name][0]
        if self.switch:
            on = not a.default if isinstance(a, argparse.BooleanOptionalAction) else self.flag == "--" + self.name
            return ("true", "false") if on else ("false", "true")
        if self.choices is not None:
            other = [str(c) for c in self.choices if c != a.default]
            return (other[0], other[1] if len(other) > 1 else str(a.default))
        if a.type in (int, float):
            d = a.default or 1
            return str(a.type(d * 2)), str(a.type(d * 3))
        dirs = tmp / f"{self.name}-a", tmp / f"{self.name}-b"  # text: directories (--models must be one)
        for d in dirs:
            d.mkdir(exist_ok=True)
        return str(dirs[0]), str(dirs[1])

    def flag_argv(self, text: str) -> list[str]:
        if isinstance(self.action, argparse.BooleanOptionalAction):
            return [f"--{self.name}" if text == "true" else f"--no-{self.name}"]
        return [self.flag] if self.switch else [self.flag, text]


def settings_of(command: str) -> list[Setting]:
    out = []
    for a in COMMANDS[command]._actions:
        long = [s for s in a.option_strings if s.startswith("--")]
        if not long or a.dest in NOT_SETTINGS:
            continue
        flag = long[0]
        name = flag[5:] if a.nargs == 0 and flag.startswith("--no-") else flag[2:]
        out.append(Setting(command, a, flag, name))
    return out


SETTINGS = [s for c in COMMANDS for s in settings_of(c)]
IDS = [f"{s.command}:{s.name}" for s in SETTINGS]


@pytest.fixture
def clean_env(monkeypatch):
    """No OFFGRAPH_* variable of the caller's reaches the parse."""
    for k in list(os.environ):
        if k.startswith("OFFGRAPH_"):
            monkeypatch.delenv(k)
    return monkeypatch


class Run:
    """Parses a command line with variables and a config file, as `offgraph` does; builds its settings classes."""

    def __init__(self, tmp: Path, monkeypatch):
        self.tmp, self.mp = tmp, monkeypatch

    def base(self, s: Setting) -> list[str]:
        """Flags for the command's required settings but ``s``."""
        argv = list(SPECIAL.get(s.name, ((), []))[1])
        for o in settings_of(s.command):
            if o.action.required and o.name != s.name:
                argv += [o.flag, o.texts(self.tmp)[0]]
        return argv

    def parse(self, s: Setting, argv=(), env=None, file=None) -> argparse.Namespace:
        for k in [k for k in os.environ if k.startswith("OFFGRAPH_")]:
            self.mp.delenv(k)
        for k, v in (env or {}).items():
            self.mp.setenv(k, v)
        extra = []
        if file is not None:
            path = self.tmp / "settings.yaml"
            path.write_text(yaml.safe_dump(file, sort_keys=False))
            extra = ["--config", str(path)]
        return PARSER.parse_args([s.command, *self.base(s), *argv, *extra])

    @staticmethod
    def built(ns: argparse.Namespace) -> dict:
        record = getattr(ns, RECORD)
        nested = {f.annotation for m in record for f in m.model_fields.values()}
        return {m.__name__: settings_from_args(m, ns).model_dump() for m in record if m not in nested}


@pytest.fixture
def run(tmp_path, clean_env):
    return Run(tmp_path, clean_env)


def test_every_setting_class_field_of_the_commands_is_a_setting_here():
    """The enumeration above is the parsers' own: every flag of a settings class is in it."""
    for command, parser in COMMANDS.items():
        names = {s.action.dest for s in settings_of(command)}
        recorded = {dest for fields in parser.get_default(RECORD).values() for dest in fields.values()}
        assert recorded and recorded <= names, command
    assert {"memory-mb", "header-timeout", "admin-token", "models", "port"} <= {s.name for s in SETTINGS}
    assert {"models", "model", "source", "sync", "durability"} <= {s.name for s in SETTINGS if s.command == "update"}


@pytest.mark.parametrize("s", SETTINGS, ids=IDS)
def test_a_flag_a_variable_and_the_file_give_the_same_value(s, run):
    text, _ = s.texts(run.tmp)
    by_flag = run.parse(s, s.flag_argv(text))
    by_env = run.parse(s, env={s.env: text})
    by_file = run.parse(s, file={s.name: text})
    value = getattr(by_flag, s.action.dest)
    assert value != s.action.default, "the test's value must not be the default"
    assert getattr(by_env, s.action.dest) == value
    assert getattr(by_file, s.action.dest) == value
    assert Run.built(by_env) == Run.built(by_flag) == Run.built(by_file)


@pytest.mark.parametrize("s", SETTINGS, ids=IDS)
def test_flags_beat_the_environment_beats_the_file_beats_the_default(s, run):
    a, b = s.texts(run.tmp)
    value_a = getattr(run.parse(s, s.flag_argv(a)), s.action.dest)
    value_b = getattr(run.parse(s, env={s.env: b}), s.action.dest)
    assert value_a != value_b
    assert getattr(run.parse(s, s.flag_argv(a), env={s.env: b}), s.action.dest) == value_a
    assert getattr(run.parse(s, s.flag_argv(a), file={s.name: b}), s.action.dest) == value_a
    assert getattr(run.parse(s, env={s.env: a}, file={s.name: b}), s.action.dest) == value_a
    assert getattr(run.parse(s, env={s.env: b}, file={s.name: a}), s.action.dest) == value_b
    assert getattr(run.parse(s, file={s.name: a}), s.action.dest) == value_a != s.action.default
    if not s.action.required:
        assert getattr(run.parse(s), s.action.dest) == s.action.default


def _refusal(call, capsys) -> str | None:
    """The error ``call()`` is refused with (the parser's exit or the settings class's), or None."""
    try:
        call()
    except SystemExit as e:
        assert e.code == 2
        return capsys.readouterr().err.strip()
    except ConfigError as e:
        return str(e)
    return None


CHECKED = [s for s in SETTINGS if s.switch or s.choices is not None or s.action.type in (int, float)]


@pytest.mark.parametrize("s", CHECKED, ids=[f"{s.command}:{s.name}" for s in CHECKED])
def test_a_bad_value_names_its_source(s, run, capsys):
    refused = 0
    for bad in ("abc", "-5", "maybe"):
        if not s.switch:
            by_flag = _refusal(lambda: Run.built(run.parse(s, [s.flag, bad])), capsys)
            if by_flag is None:
                continue  # a good value for this setting
            assert s.flag in by_flag, by_flag
        refused += 1
        by_env = _refusal(lambda: Run.built(run.parse(s, env={s.env: bad})), capsys)
        assert by_env is not None and f"{s.env}='{bad}': " in by_env, by_env
        by_file = _refusal(lambda: Run.built(run.parse(s, file={s.name: bad})), capsys)
        assert by_file is not None and re.search(rf"settings\.yaml line 1: {s.name}: '{bad}': ", by_file), by_file
        assert len(by_env.splitlines()) == len(by_file.splitlines()) == 1
    assert refused, "no bad value found"


def test_a_value_checked_by_its_settings_class_names_its_source(run, capsys):
    """A value the parser takes and the settings class refuses (a --models that is no directory)."""
    s = next(s for s in SETTINGS if s.command == "serve" and s.name == "models")
    missing = str(run.tmp / "missing")
    err = _refusal(lambda: Run.built(run.parse(s, env={s.env: missing})), capsys)
    assert err == f"{s.env}={missing!r}: ServerConfig.models_dir: {missing}: not a directory"
    err = _refusal(lambda: Run.built(run.parse(s, file={"models": missing})), capsys)
    assert err.startswith(f"{run.tmp / 'settings.yaml'} line 1: models: {missing!r}: ServerConfig.models_dir")


def test_a_required_setting_missing_everywhere_names_its_three_forms(run, capsys):
    s = next(s for s in SETTINGS if s.command == "update" and s.name == "source")
    err = _refusal(lambda: run.parse(s), capsys)
    assert "the following arguments are required: --source (or OFFGRAPH_SOURCE, or source: in --config)" in err


def test_an_unknown_key_in_the_file_is_an_error_naming_it(run, capsys):
    s = next(s for s in SETTINGS if s.command == "serve" and s.name == "memory-mb")
    err = _refusal(lambda: run.parse(s, file={"port": "9000", "memory_mb": "512"}), capsys)
    assert re.search(
        r"settings\.yaml line 2: memory_mb: not a setting of offgraph serve \(did you mean memory-mb\?\)", err
    )
    # a setting of the other command is that command's: one file serves a pod's server and updater
    ns = run.parse(s, file={"source": "spool:/x", "memory-mb": "512"})
    assert ns.memory_mb == 512.0


def test_a_near_miss_variable_is_an_error_and_the_others_are_left_alone(run, capsys):
    s = next(s for s in SETTINGS if s.command == "serve" and s.name == "memory-mb")
    err = _refusal(lambda: run.parse(s, env={"OFFGRAPH_MEMORYMB": "512"}), capsys)
    assert err.endswith("OFFGRAPH_MEMORYMB: not a setting of offgraph serve (did you mean OFFGRAPH_MEMORY_MB?)")
    # every other OFFGRAPH_* variable offgraph, its tests, benches and deployment files name
    names = set()
    for top in ("offgraph", "tests", "bench", "deploy", "docs", "README.md", "Makefile", ".ci"):
        for path in [REPO / top] if (REPO / top).is_file() else (REPO / top).rglob("*"):
            if path.is_file() and path.suffix not in (".pyc", ".parquet") and path != Path(__file__).resolve():
                names |= set(re.findall(r"\bOFFGRAPH_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    ours = {x.env for x in SETTINGS} | {"OFFGRAPH_CONFIG"}
    others = {n: "x" for n in names - ours}
    assert "OFFGRAPH_FEED_SHM" in others and "OFFGRAPH_DATA_DIR" in others
    for command in COMMANDS:
        t = next(x for x in SETTINGS if x.command == command and not x.action.required)
        run.parse(t, env=others)  # no error


def _print_config(run, s: Setting, argv=(), env=None, file=None, capsys=None) -> str:
    with pytest.raises(SystemExit) as e:
        run.parse(s, [*argv, "--print-config"], env=env, file=file)
    assert e.value.code == 0
    return capsys.readouterr().out


def test_print_config_shows_where_each_value_came_from_redacts_secrets_and_reads_back(run, capsys):
    serve = next(s for s in SETTINGS if s.command == "serve" and s.name == "memory-mb")
    out = _print_config(
        run,
        serve,
        ["--header-timeout", "3"],
        env={"OFFGRAPH_ADMIN_TOKEN": "s3cr3t-value"},
        file={"port": "9001"},
        capsys=capsys,
    )
    assert "s3cr3t-value" not in out
    lines = {line.split(":")[0]: line for line in out.splitlines() if not line.startswith("#")}
    assert lines["admin-token"] == "admin-token: '***'  # OFFGRAPH_ADMIN_TOKEN"
    assert lines["header-timeout"] == "header-timeout: 3.0  # --header-timeout"
    assert re.fullmatch(r"port: 9001  # .*settings\.yaml line 1", lines["port"])
    assert lines["memory-mb"].endswith("# default")
    assert {x.name for x in SETTINGS if x.command == "serve"} == set(lines)
    assert RULE in out

    update = next(s for s in SETTINGS if s.command == "update" and s.name == "source")
    out = _print_config(
        run, update, env={"OFFGRAPH_SOURCE": "kafka://alice:pa55word@broker:9092/deltas"}, capsys=capsys
    )
    assert "pa55word" not in out and "source: 'kafka://alice:***@broker:9092/deltas'  # OFFGRAPH_SOURCE" in out

    # what it prints is a config file that gives the same settings (the token left out: it is shown redacted)
    printed = _print_config(run, serve, ["--header-timeout", "3"], file={"port": "9001"}, capsys=capsys)
    as_file = {
        k: (v if v is None or isinstance(v, str) else yaml.safe_dump(v).split("\n")[0])
        for k, v in yaml.safe_load(printed).items()
    }
    again = _print_config(run, serve, file={k: v for k, v in as_file.items() if v is not None}, capsys=capsys)
    assert yaml.safe_load(again) == yaml.safe_load(printed)


def test_the_rule_is_stated_in_the_help_and_the_module():
    import offgraph.cli.settings_sources as sources

    assert RULE in " ".join(sources.__doc__.split())
    for parser in COMMANDS.values():
        assert RULE.replace("flags", "Precedence: flags") in " ".join(parser.format_help().split())


def test_a_file_value_is_the_flags_text_whatever_yaml_would_make_of_it(run):
    """YAML 1.1 reads ``off`` as false and ``1e3`` as text: the file's values are read as the flags' text is."""
    s = next(s for s in SETTINGS if s.command == "serve" and s.name == "prefetch-store")
    path = run.tmp / "plain.yaml"
    path.write_text("prefetch-store: off\nmemory-mb: 1e3\ncache-mb:\n# a comment\nmax-body-mb: 16\n")
    ns = run.parse(s, ["--config", str(path)])
    built = Run.built(ns)["ServerConfig"]
    assert (built["prefetch_store"], built["memory_mb"], built["max_body_bytes"]) == ("off", 1000.0, 16 << 20)
    assert built["cache_mb"] is None  # an empty value: not given


# -- a real server from variables alone ------------------------------------------------------------------------


def _observe(url: str, requests_) -> dict:
    """What a running server shows of its settings: its model's memory split, its memory budget metrics, where
    it refuses candidates, and whether the admin token opens the admin routes."""
    import httpx
    from server_helpers import TOKEN, score

    req, cands = next((r, c) for r, c in requests_ if len(c) >= 4)
    with httpx.Client(base_url=url, timeout=30) as c:
        loaded = c.get("/v1/models/ml").json()["loaded"]
        metrics = sorted(
            line for line in c.get("/metrics").text.splitlines() if line.startswith("offgraph_memory_budget")
        )
        return {
            "memory split": loaded["memory"]["split"],
            "row cache mb": loaded["row_cache_mb"],
            "metrics": metrics,
            "score 3": score(c, {"request": req, "candidates": cands[:3]}).status_code,
            "score 4": score(c, {"request": req, "candidates": cands[:4]}).status_code,
            "admin without token": c.post("/v1/models/ml:rollback").status_code,
            "admin with token": c.post(
                "/v1/models/ml:rollback", headers={"authorization": f"Bearer {TOKEN}"}
            ).status_code,
        }


def test_a_server_started_from_variables_alone_runs_as_one_started_from_flags(tiny_model, requests_, tmp_path):
    from server_helpers import TOKEN, copy_models

    from offgraph.testing.harness import ServerProcess, free_port

    models = copy_models(tiny_model[0], tmp_path / "models")
    port = free_port()
    settings = {
        "models": str(models),
        "port": str(port),
        "memory-mb": "200",
        "cache-mb": "24",
        "max-candidates": "3",
        "poll-seconds": "0.5",
        "header-timeout": "4",
        "warmup-rows": "0",
        "hot-set-seconds": "0",
        "prefetch-store": "off",
        "admin-token": TOKEN,
        "log-level": "warning",
    }
    flags = [x for k, v in settings.items() for x in (f"--{k}", v)]
    variables = {"OFFGRAPH_" + k.upper().replace("-", "_"): v for k, v in settings.items()}
    # neither run sees a setting of the test process's environment
    unset = {k: None for k in os.environ if k.startswith("OFFGRAPH_") and k != "OFFGRAPH_FEED_SHM"}
    command = [sys.executable, "-m", "offgraph.cli", "serve"]
    seen = {}
    for how, argv, env in (("flags", flags, {}), ("variables", [], variables)):
        printed = subprocess.run(
            [*command, *argv, "--print-config"],
            env={**os.environ, **{k: v for k, v in env.items()}, **{k: "" for k in unset}},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert printed.returncode == 0, printed.stderr
        server = ServerProcess([*command, *argv], port, tmp_path / f"{how}.log", cwd=REPO, env={**unset, **env})
        try:
            server.wait_ready(180)
            seen[how] = {"printed": yaml.safe_load(printed.stdout), **_observe(server.url, requests_)}
        finally:
            assert server.stop() == 0
    assert seen["variables"] == seen["flags"]
    flags_seen = seen["flags"]
    assert flags_seen["printed"]["memory-mb"] == 200.0 and flags_seen["printed"]["admin-token"] == "***"
    assert flags_seen["memory split"]["memory_mb"] == 200.0 and flags_seen["row cache mb"] == 24.0  # --cache-mb 24
    assert (flags_seen["score 3"], flags_seen["score 4"]) == (200, 422)  # --max-candidates 3
    assert flags_seen["admin without token"] == 401 and flags_seen["admin with token"] not in (401, 403)
