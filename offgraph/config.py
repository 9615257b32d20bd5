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
* a command line takes its defaults from the model (:func:`default`): one definition, so the library
  and the CLI agree.

Imports pydantic only (no NumPy, no TensorFlow): the CLI's modules import their settings classes.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ConfigError(ValueError):
    """A settings class was given a bad value: the message names each bad field."""


def option(default: Any = ..., *, flag: str | None = None, **constraints: Any) -> Any:
    """A field (``pydantic.Field``) that knows the command-line flag which sets it (named in errors)."""
    return Field(default, json_schema_extra={"flag": flag} if flag else None, **constraints)


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

    def replace(self, **changes: Any):
        """A copy with ``changes``, validated like a new instance (``model_copy`` would not check them)."""
        return type(self)(**{**dict(self), **changes})


def describe(model: type[BaseModel], err: ValidationError) -> str:
    """One short line per error of ``err``, naming ``model``'s field, its flag and the value given."""
    return "; ".join(_describe_one(model, e) for e in err.errors(include_url=False))


def _describe_one(model: type[BaseModel], e: dict) -> str:
    name = model.__name__
    if not e["loc"]:  # a model validator's own message
        return f"{name}: {_own_message(e)}"
    field = str(e["loc"][0])
    where = ".".join(str(p) for p in e["loc"])
    info = model.model_fields.get(field)
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    flag = f" ({extra['flag']})" if extra.get("flag") else ""
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


def _own_message(e: dict) -> str:
    """A validator's ValueError text without pydantic's "Value error, " prefix."""
    err = e.get("ctx", {}).get("error")
    return str(err) if err is not None else re.sub(r"^Value error, ", "", e["msg"])
