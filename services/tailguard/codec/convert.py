"""Record dataclasses <-> Avro datums (the dicts fastavro reads and writes).

The conversion is driven by the dataclass fields and their type hints, so a new record type needs
no code here. It sits on the hot path of every produced and consumed message, hence one pair of
compiled functions per class, built once: fields that Avro represents as they are (str, int,
float, bool, dict[str, str]) are copied as they are, and only enums, nested dataclasses,
optionals of those and tuples go through a per-field function.

Avro mapping: str string, int long, float double, bool boolean, Enum enum (member names are the
symbols), dataclass record, `T | None` ["null", T], `tuple[T, ...]` array, `dict[str, str]` map.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
Conv = Callable[[Any], Any]

_PLAIN = (str, int, float, bool)


@dataclasses.dataclass(frozen=True, slots=True)
class _ClassConverter:
    to_avro: Callable[[Any], dict[str, Any]]
    from_avro: Callable[[dict[str, Any]], Any]


_converters: dict[type, _ClassConverter] = {}


def to_avro(record: Any) -> dict[str, Any]:
    """The Avro datum of a record (or of any dataclass made of the supported types)."""
    conv = _converters.get(type(record)) or _converter(type(record))
    return conv.to_avro(record)


def from_avro(cls: type[T], datum: dict[str, Any]) -> T:
    """The `cls` instance of an Avro datum (as read with `cls`'s schema as reader schema)."""
    conv = _converters.get(cls) or _converter(cls)
    result: T = conv.from_avro(datum)
    return result


def _converter(cls: type) -> _ClassConverter:
    """Compile the two conversion functions of `cls`.

    They are generated as source, one expression per field, because a dict display and a
    keyword call are several times faster than looping over field descriptions at run time.
    Field names are Python identifiers (dataclass fields), so they are safe to splice in.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    namespace: dict[str, Any] = {"_cls": cls}
    to_items: list[str] = []
    from_items: list[str] = []
    for i, f in enumerate(dataclasses.fields(cls)):
        to, back = _field_converters(hints[f.name])
        value = f"o.{f.name}"
        if to is not None:
            namespace[f"_to{i}"] = to
            value = f"_to{i}({value})"
        to_items.append(f"{f.name!r}: {value}")
        value = f"d[{f.name!r}]"
        if back is not None:
            namespace[f"_from{i}"] = back
            value = f"_from{i}({value})"
        from_items.append(f"{f.name}={value}")
    source = (
        f"def to_avro(o):\n    return {{{', '.join(to_items)}}}\n"
        f"def from_avro(d):\n    return _cls({', '.join(from_items)})\n"
    )
    exec(compile(source, f"<avro converters of {cls.__qualname__}>", "exec"), namespace)
    conv = _ClassConverter(to_avro=namespace["to_avro"], from_avro=namespace["from_avro"])
    _converters[cls] = conv
    return conv


def _field_converters(hint: Any) -> tuple[Conv | None, Conv | None]:
    """(to_avro, from_avro) for a value of type `hint`; None for a side stored as it is."""
    if hint in _PLAIN:
        return (None, None)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is types.UnionType or origin is typing.Union:
        inner_types = [a for a in args if a is not type(None)]
        if len(inner_types) != 1 or len(args) != 2:
            raise TypeError(f"only `T | None` unions map to Avro here, not {hint!r}")
        return _optional(*_field_converters(inner_types[0]))
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"only `tuple[T, ...]` maps to an Avro array, not {hint!r}")
        to_item, from_item = _field_converters(args[0])
        # fastavro writes any sequence, so plain items need no copy on the way out.
        to_array = None if to_item is None else _mapped(to_item, list)
        return (to_array, tuple if from_item is None else _mapped(from_item, tuple))
    if origin is dict:
        if args[0] is not str or _field_converters(args[1]) != (None, None):
            raise TypeError(f"only `dict[str, <plain>]` maps to an Avro map, not {hint!r}")
        return (None, None)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        members = dict(hint.__members__)
        return (operator.attrgetter("name"), members.__getitem__)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        nested: type = hint
        return (to_avro, lambda v: from_avro(nested, v))
    raise TypeError(f"no Avro mapping for {hint!r}")


def _optional(to: Conv | None, back: Conv | None) -> tuple[Conv | None, Conv | None]:
    def none_or(conv: Conv | None) -> Conv | None:
        if conv is None:
            return None
        present: Conv = conv
        return lambda v: None if v is None else present(v)

    return (none_or(to), none_or(back))


def _mapped(conv: Conv, container: Callable[[list[Any]], Any]) -> Conv:
    return lambda values: container([conv(v) for v in values])
