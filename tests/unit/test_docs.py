"""The configuration reference lists every setting the code knows."""

from pathlib import Path

from tailguard.model.config import DEFAULTS
from tailguard.settings_file import SHELL_DEFAULTS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_setting_is_documented() -> None:
    text = (DOCS / "configuration.md").read_text()
    missing = [k for k in (*DEFAULTS, *SHELL_DEFAULTS) if f"`{k}`" not in text]
    assert not missing, f"add these keys to docs/configuration.md: {missing}"
