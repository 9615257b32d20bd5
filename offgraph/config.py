"""The base of every settings class (``ServerConfig``, ``StoreConfig``, ``TrainConfig``, ...): a pydantic
model that checks its fields once, when it is built, and refuses anything else.

    class Settings(ConfigModel):
        threads: int = option(2, ge=1, flag="--threads")

* strict types: ``True`` is not an int, ``"5"`` not a number, ``2.5`` not an int (an int is a float);
  no NaN or infinity;
* unknown settings are refused (``extra="forbid"``);
* a bad value raises :class:`ConfigError` (a ValueError, so the CLI prints ``offgraph CMD: error: ...``
  and exits 2) with one short line per bad field naming the class, the field, its command-line flag
  and the value, e.g. ``HttpLimits.max_connections (--max-connections) must be greater than or equal
  to 1, got 0``;
* a command line is generated from the model (``offgraph.cli.settings_flags``): each field's flag, its
  default, its help (the field's ``description``) and its check exist once, on the field.

Imports pydantic only (no NumPy, no TensorFlow): the CLI's modules import their settings classes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo


class ConfigError(ValueError):
    """A settings class was given a bad value: the message names each bad field."""


def option(
    default: Any = ...,
    *,
    flag: str | None = None,
    shown: str | None = None,
    parse: Callable[[str], Any] | None = None,
    unit: float | None = None,
    **constraints: Any,
) -> Any:
    """A field (``pydantic.Field``; ``description=`` is its flag's help) that knows its command line:

    flag: the flag that sets it (named in errors; default ``--field-name``);
    shown: how ``--help`` states the default when the value alone says little (None: "the share");
    parse: turns the flag's text into the value (default: from the field's type);
    unit: the flag gives the value in these units (``--max-body-mb`` sets bytes).
    """
    cli: dict[str, Any] = {k: v for k, v in {"flag": flag, "shown": shown, "parse": parse, "unit": unit}.items() if v}
    # kept where pydantic keeps a field's extras; a settings class is never written as a JSON schema
    return Field(default, json_schema_extra=cli or None, **constraints)  # type: ignore[arg-type]


def cli_of(info: FieldInfo) -> dict[str, Any]:
    """What :func:`option` recorded about a field's command line (empty for a plain ``Field``)."""
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def default(model: type[BaseModel], name: str) -> Any:
    """The default of ``model``'s field ``name``: what a command line offers when the flag is absent."""
    return model.model_fields[name].get_default(call_default_factory=True)


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(describe(type(self), e)) from None

    def __setattr__(self, name: str, value: Any) -> None:  # validate_assignment of a mutable model
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            raise ConfigError(describe(type(self), e)) from None

    @classmethod
    def from_given(cls, data: Mapping[str, Any], given: Mapping[str, str]):
        """``cls(**data)``, where a bad value's message is led by ``given[field]`` when the field has one: how
        its value was given where not by its flag (``OFFGRAPH_MEMORY_MB='-1'``, a config file's line)."""
        self = cls.__new__(cls)
        try:
            BaseModel.__init__(self, **data)  # not cls.__init__: its ConfigError has lost the errors' fields
        except ValidationError as e:
            raise ConfigError(describe(cls, e, given)) from None
        return self

    def replace(self, **changes: Any):
        """A copy with ``changes``, validated like a new instance (``model_copy`` would not check them)."""
        return type(self)(**{**dict(self), **changes})


def describe(model: type[BaseModel], err: ValidationError, given: Mapping[str, str] | None = None) -> str:
    """One short line per error of ``err``, naming ``model``'s field, its flag and the value given.
    ``given``: how a field's value was given where not by its flag (``OFFGRAPH_X='5'``, a file's line),
    which then leads its line instead of the flag."""
    return "; ".join(_describe_one(model, e, given or {}) for e in err.errors(include_url=False))


def _describe_one(model: type[BaseModel], e: Mapping[str, Any], given: Mapping[str, str]) -> str:
    line = _describe_field(model, e)
    field = str(e["loc"][0]) if e["loc"] else ""
    if field in given:
        return f"{given[field]}: {line.replace(_flag_note(model, field), '', 1)}"
    return line


def _flag_note(model: type[BaseModel], field: str) -> str:
    info = model.model_fields.get(field)
    extra = cli_of(info) if info is not None else {}
    return f" ({extra['flag']})" if extra.get("flag") else ""


def _describe_field(model: type[BaseModel], e: Mapping[str, Any]) -> str:
    name = model.__name__
    if not e["loc"]:  # a model validator's own message
        return f"{name}: {_own_message(e)}"
    field = str(e["loc"][0])
    where = ".".join(str(p) for p in e["loc"])
    flag = _flag_note(model, field)
    if e["type"] == "extra_forbidden":
        return f"{name}: unknown setting {where!r}"
    if e["type"] == "missing":
        return f"{name}: missing setting {where!r}"
    if e["type"] == "frozen_instance":
        return f"{name} is frozen: set {where!r} with .replace({where}=...)"
    if e["type"] == "value_error":
        return f"{name}.{where}{flag}: {_own_message(e)}"
    msg = re.sub(r"^\w+ should ", "must ", e["msg"])  # "Input should be ...", "String should have ..."
    return f"{name}.{where}{flag} {msg}, got {e['input']!r}"


def _own_message(e: Mapping[str, Any]) -> str:
    """A validator's ValueError text without pydantic's "Value error, " prefix."""
    err = e.get("ctx", {}).get("error")
    return str(err) if err is not None else re.sub(r"^Value error, ", "", e["msg"])
