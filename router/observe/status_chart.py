"""The status page's find_tool latency chart: one inline SVG, drawn on the server, no script.

One bar per slice of the window for the median, a line over the slices for the 95th percentile,
and the scale's top on the left. Each bar has a `<title>` (a browser shows it on hover) with the
slice's count and figures, and the chart an `aria-label` that says the same for the last slice.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

WIDTH, HEIGHT = 640, 180
LEFT, BOTTOM, TOP = 56, 22, 10  # margins for the scale and the time labels


_LEGEND = (
    '<p><span style="color:#4a78c2">■</span> median <span style="color:#b3261e">—</span> 95th percentile</p>'
)


def _scale_top(highest: float) -> float:
    """A round number at or above `highest` (1, 2 or 5 times a power of ten), at least 1 ms."""
    magnitude = 1.0
    while True:
        for step in (1, 2, 5):
            if magnitude * step >= highest:
                return magnitude * step
        magnitude *= 10


def latency_chart(buckets: Sequence[Mapping[str, Any]], bucket_seconds: float) -> str:
    """The chart of `buckets` (oldest first), or a line saying there was nothing to chart."""
    answered = [b for b in buckets if b["calls"]]
    if not answered:
        return "<p id=latency-empty>no find_tool calls in this window</p>"
    top = _scale_top(max(b["p95_ms"] for b in answered))
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - TOP - BOTTOM
    slot = plot_w / len(buckets)

    def y(ms: float) -> float:
        return TOP + plot_h * (1 - min(ms, top) / top)

    shapes = []
    line = []
    for index, bucket in enumerate(buckets):
        if not bucket["calls"]:
            continue
        x = LEFT + index * slot
        tip = (
            f"{bucket['calls']} calls: median {bucket['p50_ms']:.1f} ms, p95 {bucket['p95_ms']:.1f} ms, "
            f"max {bucket['max_ms']:.1f} ms"
        )
        bar_top = y(bucket["p50_ms"])
        shapes.append(
            f'<rect class="p50" x="{x + 1:.1f}" y="{bar_top:.1f}" width="{max(slot - 2, 1):.1f}" '
            f'height="{TOP + plot_h - bar_top:.1f}" fill="#4a78c2"><title>{html.escape(tip)}</title></rect>'
        )
        line.append(f"{x + slot / 2:.1f},{y(bucket['p95_ms']):.1f}")
    last = answered[-1]
    label = (
        f"find_tool latency: {len(answered)} of {len(buckets)} slices of {bucket_seconds:g}s had calls; "
        f"the last: median {last['p50_ms']:.1f} ms, p95 {last['p95_ms']:.1f} ms"
    )
    minutes = len(buckets) * bucket_seconds / 60
    axis = TOP + plot_h
    return (
        f'<svg id="latency-chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(label)}">'
        f'<line x1="{LEFT}" y1="{axis}" x2="{WIDTH - 8}" y2="{axis}" stroke="#999"/>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{axis}" stroke="#999"/>'
        f'<text x="{LEFT - 6}" y="{TOP + 10}" text-anchor="end" font-size="11">{top:g} ms</text>'
        f'<text x="{LEFT - 6}" y="{axis}" text-anchor="end" font-size="11">0</text>'
        f'<text x="{LEFT}" y="{HEIGHT - 6}" font-size="11">-{minutes:g} min</text>'
        f'<text x="{WIDTH - 8}" y="{HEIGHT - 6}" text-anchor="end" font-size="11">now</text>'
        + "".join(shapes)
        + f'<polyline class="p95" points="{" ".join(line)}" fill="none" stroke="#b3261e" stroke-width="1.5"/>'
        + "</svg>"
        + _LEGEND
    )
