"""Small line charts as inline SVG, drawn on the server (pure: numbers in, markup out).

No script and no external asset: the status page stays readable on an isolated
network and in any browser. Each chart has a title with the current value and its
unit, a y axis from zero with three labelled grid lines, and a time axis that ends
at "now".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["line_chart", "nice_ceiling"]

WIDTH, HEIGHT = 296, 140
_LEFT, _RIGHT, _TOP, _BOTTOM = 52, 12, 26, 22
#: the shortest time axis, so that the first samples are not one vertical smear
_MIN_SPAN_SECONDS = 60.0


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value`` (1 for 0)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * power >= value * (1 - 1e-9):
            return step * power
    return 10.0 * power


def _number(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:,.1f}" if value >= 1 else f"{value:.2g}"


def _ago(seconds: float) -> str:
    return f"-{seconds / 60:.0f} min" if seconds >= 120 else f"-{seconds:.0f} s"


def line_chart(
    chart_id: str,
    title: str,
    unit: str,
    points: Sequence[tuple[float, float | None]],
    now: float,
) -> str:
    """An SVG chart of ``points`` (wall-clock seconds, value; None is a gap), oldest first."""
    known = [(t, v) for t, v in points if v is not None]
    current = f"{_number(known[-1][1])} {unit}" if known else "no data yet"
    span = max(_MIN_SPAN_SECONDS, now - points[0][0] if points else 0.0)
    top = nice_ceiling(max((v for _, v in known), default=0.0))
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + plot_w * min(1.0, max(0.0, 1 - (now - t) / span))

    def y(v: float) -> float:
        return _TOP + plot_h * (1 - v / top)

    parts = [
        f'<svg class="chart" id="{escape(chart_id)}" data-points="{len(known)}" '
        f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}: {escape(current)}">',
        f'<text x="4" y="15" class="ct">{escape(title)} ({escape(unit)})</text>',
        f'<text x="{WIDTH - 4}" y="15" class="cv" text-anchor="end">{escape(current)}</text>',
    ]
    for fraction in (0.0, 0.5, 1.0):
        gy = y(top * fraction)
        parts.append(
            f'<line x1="{_LEFT}" y1="{gy:.1f}" x2="{WIDTH - _RIGHT}" y2="{gy:.1f}" '
            f'class="{"axis" if fraction == 0 else "grid"}"/>'
            f'<text x="{_LEFT - 4}" y="{gy + 4:.1f}" text-anchor="end" class="cl">'
            f"{escape(_number(top * fraction))}</text>"
        )
    parts.append(
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{HEIGHT - _BOTTOM}" class="axis"/>'
        f'<text x="{_LEFT}" y="{HEIGHT - 6}" class="cl">{escape(_ago(span))}</text>'
        f'<text x="{WIDTH - _RIGHT}" y="{HEIGHT - 6}" text-anchor="end" class="cl">now</text>'
    )
    for run in _runs(points):
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in run)
        if len(run) == 1:
            parts.append(
                f'<circle cx="{x(run[0][0]):.1f}" cy="{y(run[0][1]):.1f}" r="2" class="pt"/>'
            )
        else:
            parts.append(f'<polyline points="{coords}" class="line"/>')
    if known:
        t, v = known[-1]
        parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3" class="pt"/>')
    parts.append("</svg>")
    return "".join(parts)


def _runs(points: Sequence[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """The stretches of ``points`` without a gap."""
    runs: list[list[tuple[float, float]]] = [[]]
    for t, v in points:
        if v is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((t, v))
    return [run for run in runs if run]
