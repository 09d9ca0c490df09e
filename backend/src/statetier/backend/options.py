"""Command-line options declared on a settings dataclass, for the services' commands.

The backend's settings are one schema (:mod:`statetier.backend.config`) read from code, Spark
conf and the environment. The compaction service and the operator are configured on their
command line instead, and follow the same style: a frozen dataclass per component declares each
setting once, with its type, default, help and (in ``__post_init__``) its validation; the
command's flags are made from those fields (:func:`add_options`) and turned back into the
dataclass (:func:`from_options`), so a default or a help text is written in one place and the
flag can never disagree with the settings the code runs with.

A field becomes ``--field-name`` unless :func:`option` names another flag. Its type picks the
kind of flag: ``bool`` a switch (``--x`` for a default of False; a default of True needs a
``--no-x`` flag name, which clears it), ``tuple[str, ...]`` a repeatable flag, ``int``, ``float``
and ``str`` (or ``... | None``) a value, parsed by ``parse`` when given (sizes such as ``4g``).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Collection
from typing import Any, TypeVar

__all__ = ["add_options", "from_options", "option"]

T = TypeVar("T")

_HELP = "statetier.help"
_FLAG = "statetier.flag"
_PARSE = "statetier.parse"
_CHOICES = "statetier.choices"


def option(
    default: Any,
    help: str,
    *,
    flag: str | tuple[str, ...] | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: Collection[str] | None = None,
) -> Any:
    """A settings field that is also a command-line option (see the module's docstring).

    ``default`` :data:`dataclasses.MISSING` makes a required field and a required flag;
    ``flag`` may name several (``("--namespace", "-n")``)."""
    metadata = {_HELP: help, _FLAG: flag, _PARSE: parse, _CHOICES: choices}
    return dataclasses.field(default=default, metadata=metadata)


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` with its ValueError turned into argparse's one-line usage error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None

    return convert


def _options(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if _HELP in f.metadata]


def _flags(field: dataclasses.Field[Any]) -> tuple[str, ...]:
    named = field.metadata[_FLAG] or "--" + field.name.replace("_", "-")
    return (named,) if isinstance(named, str) else tuple(named)


def _value_options(field: dataclasses.Field[Any], kind: Any, flag: str) -> dict[str, Any]:
    """argparse's options for a flag that takes a value."""
    meta = field.metadata
    required = field.default is dataclasses.MISSING
    shown = "" if field.default in (None, dataclasses.MISSING) else " (default %(default)s)"
    return {
        "type": _argument_type(meta[_PARSE] or (typing.get_args(kind) or (kind,))[0]),
        "default": None if required else field.default,
        "required": required,
        "choices": meta[_CHOICES],
        "metavar": None if meta[_CHOICES] else flag.lstrip("-").upper().replace("-", "_"),
        "help": meta[_HELP] + shown,
    }


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type[Any],
) -> None:
    """Add a flag for every :func:`option` field of the dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    for field in _options(cls):
        flags, kind = _flags(field), hints[field.name]
        if kind is bool:
            negative = flags[0].startswith("--no-")
            if field.default is not negative:
                raise TypeError(f"{cls.__name__}.{field.name}: {flags[0]} contradicts its default")
            action = "store_false" if negative else "store_true"
            parser.add_argument(*flags, dest=field.name, action=action, help=field.metadata[_HELP])
        elif typing.get_origin(kind) is tuple:
            # default None, not the field's: argparse would append to a default list
            metavar = flags[0].lstrip("-").upper().replace("-", "_")
            parser.add_argument(
                *flags,
                dest=field.name,
                action="append",
                metavar=metavar,
                help=field.metadata[_HELP],
            )
        else:
            parser.add_argument(*flags, dest=field.name, **_value_options(field, kind, flags[0]))


def from_options(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """The dataclass ``cls`` from parsed flags; ``given`` fills fields that are no flags."""
    values: dict[str, Any] = dict(given)
    hints = typing.get_type_hints(cls)
    for field in _options(cls):
        value = getattr(args, field.name)
        if typing.get_origin(hints[field.name]) is tuple:
            value = field.default if value is None else tuple(value)
        values[field.name] = value
    return cls(**values)
