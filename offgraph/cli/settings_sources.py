"""Settings from the environment and a config file, beside the flags, for the commands that run as
services (`offgraph serve`, `offgraph update`; a command opts in with :func:`add_settings_sources`).

The rule, one for every flag of such a command (the flags generated from its settings classes and its
hand-written ones alike; ``--help``, ``--config`` and ``--print-config`` excepted):

* ``--some-flag`` can also be given as the variable ``OFFGRAPH_SOME_FLAG`` (``--memory-mb`` →
  ``OFFGRAPH_MEMORY_MB``, ``--admin-token`` → ``OFFGRAPH_ADMIN_TOKEN``), or as the key ``some-flag`` of a
  YAML file given by ``--config FILE`` or ``OFFGRAPH_CONFIG`` (``memory-mb: 512``);
* precedence: **flags > environment > file > defaults**; an empty variable, and a file key whose value is
  ``null``, ``~`` or empty, count as not given;
* a value is text read as the flag's text is (same parser, same units: ``max-body-mb: 8`` is MiB, same
  checks), whatever YAML would make of it (``prefetch-store: off`` is the text "off");
* a switch is named by its positive name and takes true/false, 1/0, on/off, yes/no: ``--sync`` ↔
  ``OFFGRAPH_SYNC=true``; a ``--no-x`` switch ↔ ``OFFGRAPH_X=false`` / ``x: false``;
* a bad value names where it came from: ``OFFGRAPH_MEMORY_MB='abc': invalid float value``,
  ``config.yaml line 3: memory-mb: '-1': ServerConfig.memory_mb must be greater than 0, got -1.0``;
* names: a file key that is a setting of none of these commands is an error naming it; a key that is a
  setting of another of them (``source:`` read by `serve`) is left to that command, so that one file or
  one ConfigMap serves a pod's server and updater. ``OFFGRAPH_*`` variables are shared with the rest of
  offgraph and its tests (``OFFGRAPH_FEED_SHM``, ``OFFGRAPH_DATA_DIR``, ``OFFGRAPH_REDIS_*``, ...), so an
  unknown one is an error only when it is a near miss of one of this command's names (a typo of
  ``OFFGRAPH_MEMORY_MB``, say); the others are left alone;
* ``--print-config`` prints the effective settings as YAML (a valid config file), each with where it
  came from, secrets redacted (a name with token, password, secret or key in it; a URL's credentials),
  after the settings classes have checked them, and exits 0 without starting anything.

Why not pydantic-settings: its sources name settings by field (``header_timeout_s``, ``max_body_bytes`` in
bytes), not by flag (``--header-timeout``, ``--max-body-mb`` in MiB), its errors name neither the
variable nor the file's line, its YAML source reads YAML 1.1 (``off`` is False) without line numbers, a
``BaseSettings`` reads the environment wherever it is built (every library and test ``ServerConfig``),
and the hand-written flags (``update --models --source``) are settings too. The sources are therefore a
layer over the parser that the settings classes already generate.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from offgraph.cli.settings_flags import GIVEN, RECORD, settings_from_args

ENV_PREFIX = "OFFGRAPH_"
CONFIG_ENV = "OFFGRAPH_CONFIG"
NOT_SOURCED = {"config", "print_config"}  # dests of the sources' own flags
TRUE, FALSE = {"true", "1", "on", "yes"}, {"false", "0", "off", "no"}
NEAR_MISS = 0.85  # difflib ratio of an unknown variable's name to a setting's: a typo, not another variable
SECRET = re.compile(r"token|password|secret|key", re.I)
URL_CREDENTIALS = re.compile(r"(?<=://)([^/@\s:]*)(:[^/@\s]*)?@")

EPILOG = (
    "Every flag can also be given as the variable OFFGRAPH_<FLAG> (--memory-mb: OFFGRAPH_MEMORY_MB) or as a key "
    "of the YAML file given by --config or OFFGRAPH_CONFIG (memory-mb: 512); a switch by its positive name with "
    "true/false (--no-x: OFFGRAPH_X=false). Precedence: flags > environment > file > defaults. --print-config "
    "shows the result and where each value came from."
)


class _NotGiven:
    """The default of every sourced flag in the parse that finds out which flags were given."""


_NOT_GIVEN = _NotGiven()


def add_settings_sources(parser: argparse.ArgumentParser, commands: argparse._SubParsersAction) -> None:
    """Let every flag of ``parser`` (its flags may still be added after this) come from the environment
    and a config file too. ``commands``: the subparsers action holding ``parser`` and the other commands
    that take sources (their names are allowed in a shared file and environment)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"YAML file of settings, keys named as the flags without their dashes (default: ${CONFIG_ENV}, else none)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective settings (YAML, each with where it came from, secrets redacted) and exit",
    )
    parser.epilog = f"{parser.epilog}\n\n{EPILOG}" if parser.epilog else EPILOG
    parser.settings_sources = SettingsSources(commands)  # type: ignore[attr-defined]  # read by Parser.parse_known_args


@dataclass(frozen=True)
class Setting:
    """A flag as a setting: its positive name (the file key), variable, and how a switch maps to its dest."""

    action: argparse.Action
    name: str
    switch: bool
    inverted: bool  # a switch whose dest is False when the setting is on (--no-x)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper().replace("-", "_")

    @property
    def listed(self) -> bool:
        return self.action.nargs not in (None, "?", 0)


def settings_of(parser: argparse.ArgumentParser) -> list[Setting]:
    """The flags of ``parser`` that the sources may give, as settings."""
    out = []
    for a in parser._actions:
        long = next((s for s in a.option_strings if s.startswith("--")), None)
        if long is None or a.dest in NOT_SOURCED or a.dest is argparse.SUPPRESS:
            continue
        if isinstance(a, argparse.BooleanOptionalAction):
            out.append(Setting(a, long[2:], True, False))
        elif isinstance(a, argparse._StoreTrueAction | argparse._StoreFalseAction):
            negative = long.startswith("--no-")
            name = long[5:] if negative else long[2:]
            out.append(Setting(a, name, True, negative != isinstance(a, argparse._StoreFalseAction)))
        elif type(a) is argparse._StoreAction:
            out.append(Setting(a, long[2:], False, False))
    return out


@dataclass(frozen=True)
class _FileValue:
    text: str | list[str]
    line: int


class SettingsSources:
    def __init__(self, commands: argparse._SubParsersAction):
        self.commands = commands

    def parse(
        self,
        parser: argparse.ArgumentParser,
        parse: Callable[..., tuple[argparse.Namespace, list[str]]],
        args: Sequence[str] | None,
        namespace: argparse.Namespace | None,
    ) -> tuple[argparse.Namespace, list[str]]:
        settings = settings_of(parser)
        required = [s for s in settings if s.action.required]
        for s in required:  # given by a variable or the file, too: checked below
            s.action.required = False
        try:
            # as argparse parses (help, a bad flag's error), then again with every default a marker: which
            # flags were given on the command line (a flag given its default value included)
            ns, rest = parse(args, namespace)
            defaults = [s.action.default for s in settings]
            for s in settings:
                s.action.default = _NOT_GIVEN
            try:
                probe, _ = parse(args, None)
            finally:
                for s, d in zip(settings, defaults):
                    s.action.default = d
        finally:
            for s in required:
                s.action.required = True
        given = {s.action.dest for s in settings if getattr(probe, s.action.dest) is not _NOT_GIVEN}
        _Resolver(parser, self, settings, given).resolve(ns, required)
        return ns, rest

    def names_elsewhere(self, parser: argparse.ArgumentParser) -> set[str]:
        """The settings' names of the other commands that take sources."""
        return {
            s.name
            for p in self.commands.choices.values()
            if p is not parser and getattr(p, "settings_sources", None) is not None
            for s in settings_of(p)
        }


class _Resolver:
    def __init__(self, parser: argparse.ArgumentParser, sources: SettingsSources, settings: list[Setting], given):
        self.parser, self.sources, self.settings, self.given = parser, sources, settings, given

    def fail(self, message: str) -> NoReturn:
        # one line, as the CLI's other errors (offgraph.cli.main): the usage would bury it
        self.parser.exit(2, f"{self.parser.prog}: error: {message}\n")

    def resolve(self, ns: argparse.Namespace, required: list[Setting]) -> None:
        path, path_origin = (ns.config, "--config") if ns.config else (os.environ.get(CONFIG_ENV) or None, CONFIG_ENV)
        file = self.read_file(path, path_origin) if path else {}
        self.check_names(file, path)
        labels: dict[str, str] = {}  # dest: how its value was given, where not by its flag (errors name it)
        origins: dict[str, str] = {}  # dest: where its value came from (--print-config)
        for s in self.settings:
            dest = s.action.dest
            text = os.environ.get(s.env)
            if dest in self.given:
                origins[dest] = next(o for o in s.action.option_strings if o.startswith("--"))
            elif text:
                labels[dest] = f"{s.env}={text!r}"
                origins[dest] = s.env
                setattr(ns, dest, self.convert(s, text.split() if s.listed else text, labels[dest]))
            elif s.name in file:
                fv = file[s.name]
                labels[dest] = f"{path} line {fv.line}: {s.name}: {fv.text!r}"
                origins[dest] = f"{path} line {fv.line}"
                setattr(ns, dest, self.convert(s, fv.text, labels[dest]))
            else:
                origins[dest] = "default"
        missing = [s for s in required if origins[s.action.dest] == "default"]
        if missing:
            self.fail(
                "the following arguments are required: "
                + ", ".join(
                    f"{'/'.join(s.action.option_strings)} (or {s.env}, or {s.name}: in --config)" for s in missing
                )
            )
        setattr(ns, GIVEN, labels)
        if ns.print_config:
            self.print_config(ns, origins)

    def read_file(self, path: str, origin: str) -> dict[str, _FileValue]:
        import yaml

        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            self.fail(f"{origin} {path}: {getattr(e, 'strerror', None) or e}")
        try:
            # BaseLoader: every scalar stays text, parsed below as the flag's text would be
            node = yaml.compose(text, Loader=yaml.BaseLoader)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            self.fail(f"{path}{where}: not YAML: {getattr(e, 'problem', None) or e}")
        if node is None:
            return {}
        if not isinstance(node, yaml.MappingNode):
            self.fail(f"{path} line {node.start_mark.line + 1}: a mapping of settings expected (memory-mb: 512)")
        out: dict[str, _FileValue] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if not isinstance(key, yaml.ScalarNode):
                self.fail(f"{path} line {line}: a setting's name expected")
            if key.value in out:
                self.fail(f"{path} line {line}: {key.value} given twice (first on line {out[key.value].line})")
            if isinstance(value, yaml.ScalarNode):
                if value.style is None and value.value in ("", "~", "null", "Null", "NULL"):
                    continue  # YAML's null: not given
                out[key.value] = _FileValue(value.value, line)
            elif isinstance(value, yaml.SequenceNode) and all(isinstance(v, yaml.ScalarNode) for v in value.value):
                out[key.value] = _FileValue([v.value for v in value.value], line)
            else:
                self.fail(f"{path} line {line}: {key.value}: a value expected, not a {value.id}")
        return out

    def check_names(self, file: dict[str, _FileValue], path: str | None) -> None:
        ours = {s.name for s in self.settings}
        known = ours | self.sources.names_elsewhere(self.parser)
        for key, fv in file.items():
            if key not in known:
                self.fail(
                    f"{path} line {fv.line}: {key}: not a setting of {self.parser.prog}{_did_you_mean(key, ours)}"
                )
        by_env = {s.env[len(ENV_PREFIX) :]: s for s in self.settings}
        known_env = {ENV_PREFIX + n.upper().replace("-", "_") for n in known} | {CONFIG_ENV}
        for var in sorted(os.environ):
            if var.startswith(ENV_PREFIX) and var not in known_env:
                near = difflib.get_close_matches(var[len(ENV_PREFIX) :], by_env, n=1, cutoff=NEAR_MISS)
                if near:
                    self.fail(f"{var}: not a setting of {self.parser.prog} (did you mean {by_env[near[0]].env}?)")

    def convert(self, s: Setting, text: str | list[str], label: str) -> Any:
        a = s.action
        if s.switch:
            word = text.lower() if isinstance(text, str) else None
            if word not in TRUE | FALSE:
                self.fail(f"{label}: a switch takes true/false, 1/0, on/off or yes/no")
            return (word in TRUE) != s.inverted
        if s.listed:
            items = text.split() if isinstance(text, str) else text
            return [self.convert_one(a, t, label) for t in items]
        if not isinstance(text, str):
            self.fail(f"{label}: one value expected, not a list")
        return self.convert_one(a, text, label)

    def convert_one(self, a: argparse.Action, text: str, label: str) -> Any:
        parse = a.type if callable(a.type) else str
        try:
            value = parse(text)
        except argparse.ArgumentTypeError as e:
            self.fail(f"{label}: {e}")
        except (TypeError, ValueError):
            self.fail(f"{label}: invalid {getattr(parse, '__name__', repr(parse))} value")
        if a.choices is not None and value not in a.choices:
            self.fail(f"{label}: invalid choice (choose from {', '.join(map(repr, a.choices))})")
        return value

    def print_config(self, ns: argparse.Namespace, origins: dict[str, str]) -> None:
        """The effective settings, checked by their settings classes first, then exit 0."""
        import yaml

        record = getattr(ns, RECORD, {})
        nested = {f.annotation for m in record for f in m.model_fields.values()}
        try:
            for model in record:
                if model not in nested:
                    settings_from_args(model, ns)
        except ValueError as e:
            self.fail(str(e))
        lines = [f"# {self.parser.prog}: effective settings (flags > environment > file > defaults)"]
        for s in self.settings:
            value = getattr(ns, s.action.dest)
            if s.switch:
                value = bool(value) != s.inverted
            value = redacted(s.name, value)
            dumped = yaml.safe_dump({s.name: value}, default_flow_style=True, sort_keys=False, width=1 << 16)
            lines.append(f"{dumped.strip()[1:-1]}  # {origins[s.action.dest]}")
        print("\n".join(lines), flush=True)
        sys.stdout.flush()
        self.parser.exit(0)


def redacted(name: str, value: Any) -> Any:
    """``value`` of the setting ``name`` as it may be shown: a secret's as ``***``, a URL's credentials too."""
    if value is None:
        return None
    if SECRET.search(name):
        return "***"
    if isinstance(value, list):
        return [redacted(name, v) for v in value]
    if isinstance(value, str):
        return URL_CREDENTIALS.sub(lambda m: (m[1] + ":***@") if m[2] else "***@", value)
    if not isinstance(value, bool | int | float):
        return str(value)
    return value


def _did_you_mean(name: str, names: set[str]) -> str:
    near = difflib.get_close_matches(name.strip("-").replace("_", "-"), names, n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""
