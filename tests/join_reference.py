"""The reference a join is checked against: pandas `merge`, with nulls as Spark treats them.

pandas matches a null key with another null key; Spark never matches a null key. So rows with a
null in any key are taken out before `merge` and put back where Spark keeps them: unmatched, in
the outer joins on their own side and in the anti join. Columns come in Spark's order for a
USING join: the keys, the left side's other columns, the right side's (none for semi and anti).

    from tests.join_reference import spark_join
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

_MERGE_HOW = {"inner": "inner", "left": "left", "right": "right", "full": "outer"}


def spark_join(
    left: pd.DataFrame, right: pd.DataFrame, on: Sequence[str], how: str
) -> pd.DataFrame:
    # pandas' merge fails on an empty frame with Arrow-backed strings (pandas 3's default).
    left, right = _plain_strings(left), _plain_strings(right)
    keys = list(on)
    left_rest = [c for c in left.columns if c not in keys]
    right_rest = [c for c in right.columns if c not in keys]
    left_null = left[keys].isna().any(axis=1)
    right_null = right[keys].isna().any(axis=1)
    matchable_left, matchable_right = left[~left_null], right[~right_null]
    if how in ("semi", "anti"):
        found = (
            matchable_left.merge(
                matchable_right[keys].drop_duplicates(), on=keys, how="left", indicator=True
            )["_merge"]
            .eq("both")
            .to_numpy()
        )
        kept = (
            matchable_left[found]
            if how == "semi"
            else pd.concat([matchable_left[~found], left[left_null]])
        )
        return kept[keys + left_rest].reset_index(drop=True)
    parts = [matchable_left.merge(matchable_right, on=keys, how=_MERGE_HOW[how])]
    if how in ("left", "full"):
        parts.append(left[left_null])
    if how in ("right", "full"):
        parts.append(right[right_null])
    joined = pd.concat([p for p in parts if len(p)] or parts[:1], ignore_index=True)
    return joined.reindex(columns=keys + left_rest + right_rest)


def _plain_strings(frame: pd.DataFrame) -> pd.DataFrame:
    text = [c for c in frame.columns if pd.api.types.is_string_dtype(frame[c].dtype)]
    return frame.astype(dict.fromkeys(text, object)) if text else frame
