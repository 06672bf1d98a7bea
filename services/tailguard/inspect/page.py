"""The timeline as one self-contained HTML page: inline CSS, inline script, the data as JSON.

The page draws itself (assets/timeline.js) from the embedded data, so it opens from a file on
a machine with no network, and a headless browser can check what it draws.
"""

from __future__ import annotations

import html
import json
from importlib import resources

from tailguard.inspect.timeline import Outcome, Timeline, as_data

_LEGEND = (
    ("sw-won", Outcome.WON.value),
    ("sw-lost", Outcome.LOST_RACE.value),
    ("sw-failed", Outcome.FAILED.value),
    ("sw-cancelled", Outcome.CANCELED.value),
    ("sw-running", Outcome.RUNNING.value),
    ("sw-speculative", "speculative attempt"),
    ("sw-block", "host blocked"),
    ("sw-absent", "host gone"),
    ("sw-phase", "vertex running"),
)


def _asset(name: str) -> str:
    return resources.files("tailguard.inspect").joinpath("assets", name).read_text("utf-8")


def _script_json(value: object) -> str:
    """JSON safe inside a <script> element: `</` cannot end it early."""
    return json.dumps(value, ensure_ascii=True).replace("</", "<\\/")


def render_page(timeline: Timeline) -> str:
    title = html.escape(f"tailguard timeline: {timeline.name}")
    legend = "".join(
        f'<span><i class="{cls}"></i>{html.escape(label)}</span>' for cls, label in _LEGEND
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
{_asset("timeline.css")}</style>
</head>
<body>
<h1>{title}</h1>
<div id="summary">{html.escape(timeline.job_id)}</div>
<div class="legend">{legend}</div>
<div id="chart"></div>
<div id="tip" hidden></div>
<script type="application/json" id="timeline-data">{_script_json(as_data(timeline))}</script>
<script>
{_asset("timeline.js")}</script>
</body>
</html>
"""
