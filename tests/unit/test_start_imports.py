"""What a process pays at start for tailguard's imports: observe mode's relay starts with every
observed application, and the agent's Kafka adapter and the codec with every job and service.
Their imports must not pull in the executor's dataframe stack or the schema registry client,
which they do not use (measured: the relay's CPU fell from ~1.1 s to ~0.55 s without them).

In a fresh interpreter each: sys.modules here is shared with the rest of the suite."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pandas", "pyarrow.dataset", "confluent_kafka.schema_registry")


@pytest.mark.parametrize(
    "module",
    ["tailguard.observer.publisher", "tailguard.agent.adapters.kafka",
     "tailguard.codec"],
)  # fmt: skip
def test_a_module_imports_none_of_the_heavy_ones_it_does_not_use(module: str) -> None:
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []
