"""Command-line flags generated from the settings classes (``offgraph.config.ConfigModel``): a setting's
flag, default, help and check are written once, on its field (``offgraph.config.option``).

    add_settings_flags(p, UpdaterConfig, exclude={"version_check_s"})
    ...
    config = settings_from_args(UpdaterConfig, args)

Each field gets one flag: its ``flag`` (or ``--field-name``), the type's parser (int, float, text), the
field's description as help with "(default: X)" appended, the names of a ``Literal`` type as its
metavar; a bool is a switch (``--x`` sets True, ``--no-x`` sets False, both forms when it defaults to
True). The values are checked once, by the model, when :func:`settings_from_args` builds it: a bad one
is a ``ConfigError`` naming the flag, which ``offgraph.cli.main`` prints as ``offgraph CMD: error: ...``
with exit status 2. A field whose type is itself a settings class (``ServerConfig.http``) gets its
fields' flags.
"""

from __future__ import annotations

import argparse
import copy
import types
import typing
from typing import Any, Literal

from pydantic.fields import FieldInfo

from offgraph.config import ConfigModel, cli_of

# the parser's record of the settings flags it has: {settings class: {field: dest}}, read back by
# settings_from_args (and the tests): a field left out is not guessed from a like-named argument
RECORD = "_settings_flags"
# {dest: how its value was given} of the values that came from the environment or a config file
# (offgraph.cli.settings_sources), so that a bad one is named by its variable or file line, not its flag
GIVEN = "_settings_given"


def flag_name(name: str, info: FieldInfo) -> str:
    return cli_of(info).get("flag") or "--" + name.replace("_", "-")


def _sub_settings(info: FieldInfo) -> type[ConfigModel] | None:
    t = info.annotation
    return t if isinstance(t, type) and issubclass(t, ConfigModel) else None


def _value_type(info: FieldInfo) -> Any:
    """The field's type without ``| None``."""
    t = info.annotation
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(t) if a is not type(None)]
        t = rest[0] if len(rest) == 1 else str
    return t


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def add_settings_flags(
    parser: argparse.ArgumentParser,
    model: type[ConfigModel],
    *,
    exclude: set[str] | frozenset[str] = frozenset(),
    defaults: dict[str, Any] | None = None,
    kwargs: dict[str, dict[str, Any]] | None = None,
) -> None:
    """One flag per field of ``model`` but those in ``exclude``. ``defaults``: the command line's own
    default of a field, where it differs from the library's (in the flag's units); ``kwargs``: more
    ``add_argument`` arguments of a field's flag (e.g. ``choices`` read lazily)."""
    record = {k: dict(v) for k, v in (parser.get_default(RECORD) or {}).items()}
    for name, info in model.model_fields.items():
        if name in exclude:
            continue
        sub = _sub_settings(info)
        if sub is not None:
            add_settings_flags(parser, sub)
            record.update(parser.get_default(RECORD))
            continue
        action = _add_flag(parser, name, info, (defaults or {}).get(name), (kwargs or {}).get(name, {}))
        record.setdefault(model, {})[name] = action.dest
    parser.set_defaults(**{RECORD: record})


def _add_flag(parser, name: str, info: FieldInfo, cli_default: Any, more: dict[str, Any]) -> argparse.Action:
    cli, flag = cli_of(info), flag_name(name, info)
    kw: dict[str, Any] = {}
    if info.is_required():
        kw["required"], default = True, None
    else:
        default = info.get_default(call_default_factory=True)
        if cli.get("unit") and default is not None:
            default = default / cli["unit"]
            if _value_type(info) is int and default == int(default):  # 8 (MiB), as --max-body-mb is given
                default = int(default)
        if cli_default is not None:
            default = cli_default
    t = _value_type(info)
    if t is bool:
        if flag.startswith("--no-"):  # the switch turns the setting off: on by default
            kw["action"], default = "store_true", not default
        elif default:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["action"] = "store_true"
    else:
        kw["type"] = cli.get("parse") or (t if t in (int, float) else str)
        if typing.get_origin(t) is Literal:
            kw["metavar"] = "{" + ",".join(map(str, typing.get_args(t))) + "}"
    kw.update(more)
    help_text = (info.description or "").replace("%", "%%")
    if "choices" in more and "metavar" in more:  # the metavar hides them: the help lists them
        help_text += ": %(choices)s"
    if not kw.get("required"):
        help_text += f" (default: {(cli.get('shown') or _shown(default)).replace('%', '%%')})"
    return parser.add_argument(flag, default=default, help=help_text.strip(), **kw)


def settings_from_args(model: type[ConfigModel], args: argparse.Namespace, **extra: Any):
    """``model`` built from the flags :func:`add_settings_flags` added for it, and ``extra``: checked
    once, by the model; a bad value is named by its flag, or by its variable or file line when it came
    from one (``offgraph.cli.settings_sources``)."""
    record = getattr(args, RECORD, {})
    labels = getattr(args, GIVEN, {})
    values: dict[str, Any] = {}
    given: dict[str, str] = {}
    for name, info in model.model_fields.items():
        if name in extra:
            continue
        sub = _sub_settings(info)
        if sub is not None and sub in record:
            values[name] = settings_from_args(sub, args)
        elif name in record.get(model, {}):
            values[name] = _setting(info, getattr(args, record[model][name]))
            if record[model][name] in labels:
                given[name] = labels[record[model][name]]
    return model.from_given({**values, **extra}, given)


def _setting(info: FieldInfo, value: Any) -> Any:
    """A flag's value as the field's value: in the field's units, a ``--no-x`` switch inverted."""
    cli = cli_of(info)
    if _value_type(info) is bool and cli.get("flag", "").startswith("--no-"):
        return not value
    if cli.get("unit") and value is not None:
        value = value * cli["unit"]
        return int(value) if _value_type(info) is int else value
    return value


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every optional flag's help states its default: a hand-written flag whose help does not gets
    "(default: X)" appended (a switch's is "off")."""

    def _format_action(self, action: argparse.Action) -> str:
        if action.option_strings and not action.required and action.help is not argparse.SUPPRESS:
            text = action.help or ""
            if "default" not in text and action.default is not argparse.SUPPRESS:
                action = copy.copy(action)
                shown = "off" if action.nargs == 0 and action.default in (False, None) else _shown(action.default)
                action.help = f"{text} (default: {shown.replace('%', '%%')})".strip()
        return super()._format_action(action)


class Parser(argparse.ArgumentParser):
    """argparse's parser whose help states each flag's default (its subcommands' parsers too)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(**kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        # a command that takes its settings from the environment and a file too (offgraph.cli.settings_sources)
        sources = getattr(self, "settings_sources", None)
        if sources is None:
            return super().parse_known_args(args, namespace)
        return sources.parse(self, super().parse_known_args, args, namespace)
