"""Comparing a job's output with a reference table, with a diff a person can read.

Both sides become Arrow tables (a pandas reference keeps a named index as columns and drops an
unnamed one). Then, in this order: the column names, the column types (string and
large_string count as one type, dictionary columns as their values), the row count, the rows.
Rows are compared exactly unless `rel_tol` is given, with NaN and null as one missing value
(pandas has only one, so a pandas reference cannot tell them apart); `ignore_order` compares
them as multisets.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SHOW_ROWS = 10


def as_table(value: Any, what: str) -> Any:
    """`value` (a pyarrow Table or RecordBatch, or a pandas DataFrame) as a pyarrow Table."""
    import pyarrow as pa

    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - the spark extra brings pandas
        pd = None
    if pd is not None and isinstance(value, pd.DataFrame):
        named_index = any(name is not None for name in value.index.names)
        frame = value.reset_index() if named_index else value
        return pa.Table.from_pandas(frame, preserve_index=False)
    raise TypeError(
        f"the {what} must be a pyarrow Table or RecordBatch or a pandas DataFrame "
        f"(or a JobRun for the output), got {type(value).__name__}"
    )


def _plain_type(arrow_type: Any) -> Any:
    """The type compared: large and small variants alike, dictionaries as their values."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        return _plain_type(arrow_type.value_type)
    if pa.types.is_large_string(arrow_type):
        return pa.string()
    if pa.types.is_large_binary(arrow_type):
        return pa.binary()
    if pa.types.is_large_list(arrow_type):
        return pa.list_(_plain_type(arrow_type.value_type))
    return arrow_type


def _value(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None  # pandas has one missing value: its NaN is Arrow's null
    if isinstance(v, list | tuple):
        return tuple(_value(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _value(x)) for k, x in v.items())
    return v


def _rows(table: Any, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    return [tuple(_value(row[c]) for c in columns) for row in table.select(columns).to_pylist()]


def _sort_key(v: Any) -> tuple[Any, ...]:
    if v is None:
        return (0,)
    if isinstance(v, tuple):
        return (1, tuple(_sort_key(x) for x in v))
    return (1, v)


def _close(a: Any, b: Any, rel_tol: float) -> bool:
    if a == b:
        return True
    if isinstance(a, float | int) and isinstance(b, float | int) and rel_tol > 0:
        return math.isclose(a, b, rel_tol=rel_tol)
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return all(_close(x, y, rel_tol) for x, y in zip(a, b, strict=True))
    return False


def format_rows(
    columns: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    counts: Sequence[int] | None = None,
    show: int = SHOW_ROWS,
) -> str:
    """Rows as an aligned text table, at most `show` of them (and how many more)."""
    header = list(columns) + (["count"] if counts is not None else [])
    body = [
        [repr(v) if isinstance(v, str) else str(v) for v in row]
        + ([f"x{counts[i]}"] if counts is not None else [])
        for i, row in enumerate(rows[:show])
    ]
    widths = [max(len(str(cell)) for cell in col) for col in zip(header, *body, strict=True)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *body]
    ]
    if len(rows) > show:
        lines.append(f"... and {len(rows) - show} more")
    return "\n".join("    " + line for line in lines)


@dataclass(frozen=True)
class TableDiff:
    """What differs; empty `problems` when the tables are equal."""

    problems: list[str]

    @property
    def equal(self) -> bool:
        return not self.problems

    def message(self, title: str) -> str:
        return "\n".join([title, *self.problems])


def compare_tables(
    actual: Any,
    expected: Any,
    *,
    ignore_order: bool = False,
    check_types: bool = True,
    rel_tol: float = 0.0,
    show: int = SHOW_ROWS,
    names: tuple[str, str] = ("output", "reference"),
) -> TableDiff:
    """Compare two Arrow tables; the diff names the sides `names` (actual first)."""
    left, right = names
    got, want = set(actual.column_names), set(expected.column_names)
    if got != want:
        problems = []
        if got - want:
            problems.append(f"columns only in the {left}: {sorted(got - want)}")
        if want - got:
            problems.append(f"columns only in the {right}: {sorted(want - got)}")
        problems.append(f"{left} columns: {actual.column_names}; {right}: {expected.column_names}")
        return TableDiff(problems)
    columns = list(actual.column_names)
    if check_types:
        mismatched = [
            f"column {c!r} is {actual.schema.field(c).type} in the {left}, "
            f"{expected.schema.field(c).type} in the {right}"
            for c in columns
            if _plain_type(actual.schema.field(c).type)
            != _plain_type(expected.schema.field(c).type)
        ]
        if mismatched:
            return TableDiff([*mismatched, "(compare values across types with check_types=False)"])
    mine, theirs = _rows(actual, columns), _rows(expected, columns)
    counts = f"{len(mine)} rows in the {left}, {len(theirs)} in the {right}"
    if ignore_order and rel_tol == 0:
        extra = Counter(mine) - Counter(theirs)
        missing = Counter(theirs) - Counter(mine)
        if not extra and not missing:
            return TableDiff([])
        problems = [counts + " (row order ignored)"]
        for label, rows in ((f"only in the {left}", extra), (f"only in the {right}", missing)):
            if rows:
                ordered = sorted(rows, key=lambda row: tuple(_sort_key(v) for v in row))
                repeats = [rows[r] for r in ordered] if max(rows.values()) > 1 else None
                problems.append(f"rows {label} ({sum(rows.values())}):")
                problems.append(format_rows(columns, ordered, repeats, show))
        return TableDiff(problems)
    if ignore_order:
        mine = sorted(mine, key=lambda row: tuple(_sort_key(v) for v in row))
        theirs = sorted(theirs, key=lambda row: tuple(_sort_key(v) for v in row))
    differing = [
        i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if not _close(a, b, rel_tol)
    ]
    if not differing and len(mine) == len(theirs):
        return TableDiff([])
    order = " (both sorted: row order ignored)" if ignore_order else ""
    problems = [counts + order]
    for i in differing[:show]:
        changes = "; ".join(
            f"{c} {a!r} in the {left}, {b!r} in the {right}"
            for c, a, b in zip(columns, mine[i], theirs[i], strict=True)
            if not _close(a, b, rel_tol)
        )
        whole = ", ".join(f"{c}={v!r}" for c, v in zip(columns, mine[i], strict=True))
        problems.append(f"  row {i}: {changes}  ({left} row: {whole})")
    if len(differing) > show:
        problems.append(f"  ... and {len(differing) - show} more differing rows")
    common = min(len(mine), len(theirs))
    if len(mine) > common:
        problems.append(f"rows only in the {left} (from row {common}):")
        problems.append(format_rows(columns, mine[common:], show=show))
    if len(theirs) > common:
        problems.append(f"rows missing from the {left} (the {right}'s from row {common}):")
        problems.append(format_rows(columns, theirs[common:], show=show))
    return TableDiff(problems)
