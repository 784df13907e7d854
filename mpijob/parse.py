"""Mapping (parsed YAML) -> typed dataclasses, rejecting unknown fields.

The MPIJob CRD has no ``additionalProperties: false``, so the API server
silently drops a misspelled field (``slotPerWorker: 4`` becomes the default 1).
Job-spec files are therefore read strictly: every key must be a field of the
model, every value of its type (one of the listed values for ``Literal``
types); all problems are collected as field errors with their paths. A field
whose value is refused keeps its default, so the rules can still check the rest
and every error is reported at once.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from hvdk8s.common.fields import FieldError, invalid, join, not_supported, required, value_kind

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
_MISSING = dataclasses.MISSING


def camel(name: str) -> str:
    """``slots_per_worker`` -> ``slotsPerWorker`` (the YAML key of a field)."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def from_mapping(cls: type[T], data: Any, errors: list[FieldError], path: str = "") -> T | None:
    """Build ``cls`` from ``data``; append a FieldError per problem to ``errors``.

    Returns None when ``data`` is unusable at this level (errors say why).
    Missing optional fields, and fields whose value was refused, take the
    dataclass defaults.
    """
    if not isinstance(data, Mapping):
        errors.append(invalid(path or "<top level>", f"must be a mapping, got {value_kind(data)}"))
        return None
    fields = {camel(f.name): f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, raw in data.items():
        where = join(path, str(key))
        f = fields.get(key) if isinstance(key, str) else None
        if f is None:
            errors.append(FieldError("NotSupported", where, f"unknown field{_suggest(key, fields)}"))
            continue
        before = len(errors)
        value = _convert(hints[f.name], raw, errors, where)
        if len(errors) == before:
            values[f.name] = value
    needed = {key: f for key, f in fields.items() if f.default is _MISSING and f.default_factory is _MISSING}
    errors.extend(required(join(path, key)) for key in needed if key not in data)
    if any(f.name not in values for f in needed.values()):
        return None
    return cls(**values)


def _convert(tp: Any, raw: Any, errors: list[FieldError], where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:  # a plain Kubernetes object, checked by the API server's schema
        return raw
    if origin is Literal:
        if raw not in args or not isinstance(raw, str):
            errors.append(not_supported(where, raw, args))
        return raw
    if origin in (typing.Union, types.UnionType):
        if raw is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, raw, errors, where)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_mapping(tp, raw, errors, where)
    if origin is tuple:
        if not isinstance(raw, list):
            errors.append(type_error(where, "a list", raw))
            return None
        return tuple(_convert(args[0], item, errors, join(where, i)) for i, item in enumerate(raw))
    if origin is dict:
        if not isinstance(raw, Mapping):
            errors.append(type_error(where, "a mapping", raw))
            return None
        return {str(k): _convert(args[1], v, errors, join(where, str(k))) for k, v in raw.items()}
    return _scalar(tp, raw, errors, where)


def _scalar(tp: type, raw: Any, errors: list[FieldError], where: str) -> Any:
    # YAML's true/false are ints to Python: never accept them as numbers or text.
    if tp is bool:
        if isinstance(raw, bool):
            return raw
    elif tp is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
    elif tp is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
    elif tp is str:
        if isinstance(raw, str):
            return raw
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return str(raw)  # `--epochs, 5` and `cpu: 2` mean the text
    else:  # pragma: no cover - the model only uses the types above
        raise TypeError(f"unsupported field type {tp!r}")
    hint = " (quote it)" if tp is str and isinstance(raw, bool) else ""
    errors.append(type_error(where, _NAMES[tp], raw, hint))
    return None


def type_error(where: str, expected: str, raw: Any, hint: str = "") -> FieldError:
    """A field of the wrong type, in the words the strict reader and the manifest shape check share."""
    return FieldError("TypeInvalid", where, f"must be {expected}, got {value_kind(raw)}{hint}")


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _suggest(key: Any, fields: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(fields))})"
