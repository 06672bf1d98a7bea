"""One step of a chain: a user operator's function and how it wants its data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class OperatorStep:
    name: str
    fn: Callable[..., Any]
    # "arrow": fn gets pyarrow Tables; "pandas": fn gets pandas DataFrames.
    style: Literal["arrow", "pandas"] = "arrow"
