"""Hypothesis strategies for the records of `tailguard.model.records`.

Built from the dataclass fields and type hints, so a new record type or field is covered without
touching this file. Ids are short text, `ts`-like fields non-negative int64, other ints any
int64, floats finite, enums sampled, optional fields sometimes None.

    from tests.strategies import record_of, records
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, TypeVar

from hypothesis import strategies as st

from tailguard.model.records import RECORD_TYPES, Record

T = TypeVar("T")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Field names whose values are ids: short, printable, like the real ones.
_ID_FIELDS = frozenset({"id", "job_id", "command_id", "caused_by"})

short_ids = st.text(
    alphabet=st.characters(codec="ascii", categories=("L", "N", "Pd")), min_size=1, max_size=12
)
timestamps = st.integers(min_value=0, max_value=INT64_MAX)
int64s = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
texts = st.text(max_size=20)


def _for_hint(hint: Any, field_name: str) -> st.SearchStrategy[Any]:
    if hint is str:
        return short_ids if field_name in _ID_FIELDS else texts
    if hint is bool:
        return st.booleans()
    if hint is int:
        return timestamps if field_name == "ts" or field_name.endswith("_ts") else int64s
    if hint is float:
        return finite_floats
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is types.UnionType or origin is typing.Union:
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | _for_hint(inner, field_name)
    if origin is tuple:
        return st.lists(_for_hint(args[0], field_name), max_size=4).map(tuple)
    if origin is dict:
        return st.dictionaries(texts, _for_hint(args[1], field_name), max_size=4)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return record_of(hint)
    raise TypeError(f"no strategy for {hint!r} (field {field_name})")


@functools.cache
def record_of(cls: type[T]) -> st.SearchStrategy[T]:
    """Instances of the dataclass `cls` (a record type or a nested value type)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: _for_hint(hints[f.name], f.name) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return st.builds(cls, **fields)


def records() -> st.SearchStrategy[Record]:
    """Any record of any type."""
    return st.one_of([record_of(cls) for cls in RECORD_TYPES])
