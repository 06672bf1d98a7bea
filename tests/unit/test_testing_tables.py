"""assert_output_equals: what counts as equal, and the diff a failure shows."""

from __future__ import annotations

import math

import pandas as pd
import pyarrow as pa
import pytest

from tailguard.testing import assert_output_equals

REFERENCE = pd.DataFrame(
    {"region": ["east", "north", "west"], "revenue": [10, 20, 30], "orders": [1, 2, 3]}
)


def output(**columns: list) -> pa.Table:
    return pa.table(columns or {"region": ["east", "north", "west"], "revenue": [10, 20, 30],
                                "orders": [1, 2, 3]})  # fmt: skip


def failure(actual: object, expected: object, **options: object) -> str:
    with pytest.raises(AssertionError) as err:
        assert_output_equals(actual, expected, **options)
    return str(err.value)


def test_equal_tables_pass_whatever_the_column_order_and_string_type() -> None:
    assert_output_equals(output(), REFERENCE)
    reordered = output().select(["orders", "region", "revenue"])
    assert_output_equals(reordered, REFERENCE)
    large = output().cast(
        pa.schema([("region", pa.large_string()), ("revenue", pa.int64()), ("orders", pa.int64())])
    )
    assert_output_equals(large, REFERENCE)
    assert_output_equals(output(), pa.Table.from_pandas(REFERENCE).to_batches()[0])


def test_row_order_matters_unless_ignored() -> None:
    shuffled = output().take([2, 0, 1])
    message = failure(shuffled, REFERENCE)
    assert "row 0: region 'west' in the output, 'east' in the reference" in message
    assert_output_equals(shuffled, REFERENCE, ignore_order=True)


def test_unordered_diff_lists_the_rows_on_each_side() -> None:
    changed = REFERENCE.copy()
    changed.loc[1, "revenue"] = 21
    message = failure(output(), changed, ignore_order=True)
    assert "3 rows in the output, 3 in the reference (row order ignored)" in message
    only_output, only_reference = message.split("rows only in the reference (1):")
    assert "rows only in the output (1):" in only_output and "20" in only_output
    assert "'north'" in only_reference and "21" in only_reference
    assert "east" not in message  # equal rows are not shown


def test_duplicates_count_when_order_is_ignored() -> None:
    twice = pa.concat_tables([output(), output().slice(0, 1)])
    message = failure(twice, REFERENCE, ignore_order=True)
    assert "4 rows in the output, 3 in the reference" in message
    assert "rows only in the output (1):" in message


def test_missing_and_extra_rows_in_order() -> None:
    message = failure(output().slice(0, 2), REFERENCE)
    assert "2 rows in the output, 3 in the reference" in message
    assert "rows missing from the output (the reference's from row 2):" in message
    assert "'west'" in message


def test_columns_and_types_are_named() -> None:
    message = failure(output().drop_columns(["orders"]), REFERENCE)
    assert "columns only in the reference: ['orders']" in message
    as_float = REFERENCE.astype({"revenue": "float64"})
    message = failure(output(), as_float)
    assert "column 'revenue' is int64 in the output, double in the reference" in message
    assert_output_equals(output(), as_float, check_types=False)


def test_nan_and_null_are_one_missing_value_and_floats_can_be_close() -> None:
    nan = pa.table({"k": ["a", "b"], "v": [math.nan, 1.0]})
    assert_output_equals(nan, pd.DataFrame({"k": ["a", "b"], "v": [math.nan, 1.0]}))
    assert_output_equals(nan, pa.table({"k": ["a", "b"], "v": [None, 1.0]}))
    near = pd.DataFrame({"k": ["b", "a"], "v": [1.0 + 1e-12, math.nan]})
    failure(nan, near, ignore_order=True)
    assert_output_equals(nan, near, ignore_order=True, rel_tol=1e-9)


def test_a_named_pandas_index_is_a_column_and_an_unnamed_one_is_not() -> None:
    indexed = REFERENCE.set_index("region")
    assert_output_equals(output(), indexed)
    filtered = REFERENCE[REFERENCE["orders"] > 1]  # index 1, 2: unnamed, dropped
    assert_output_equals(output().slice(1), filtered)


def test_other_inputs_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="the reference must be a pyarrow Table"):
        assert_output_equals(output(), [("east", 10, 1)])
