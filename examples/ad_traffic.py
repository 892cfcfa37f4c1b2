"""Realistic, reproducible ad traffic for the join demo, tests and benchmarks (pure).

Impressions and clicks keyed by auction id, after KIP-315's canonical example:
about a third of the impressions get a click within the join window, a few get
a click after the window (never joined), some clicks have no impression at all,
and events arrive out of order (each delayed by up to ``max_delay_ms``, which
stays below the join's grace period, so arrival order cannot change the result).
``expected_joins`` is the exact set of (auction id, impression id, click id)
an inner join with ``window_ms`` must produce.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

#: 2026-01-01T00:00:00Z: fixed, so every run produces identical records
EPOCH_MS = 1_767_225_600_000
WINDOW_MS = 10 * 60_000
GRACE_MS = 30_000


@dataclass(frozen=True)
class TrafficRecord:
    topic: str  # "impressions" or "clicks"
    key: str  # auction id
    value: dict[str, Any]
    timestamp_ms: int  # event time


@dataclass
class Traffic:
    records: list[TrafficRecord] = field(default_factory=list)  # in arrival order
    expected_joins: set[tuple[str, str, str]] = field(default_factory=set)
    clicks_outside_window: int = 0
    orphan_clicks: int = 0

    @property
    def impressions(self) -> int:
        return sum(1 for r in self.records if r.topic == "impressions")

    @property
    def clicks(self) -> int:
        return sum(1 for r in self.records if r.topic == "clicks")


def generate(
    auctions: int,
    *,
    seed: int = 7,
    click_rate: float = 0.35,
    late_click_rate: float = 0.03,
    orphan_click_rate: float = 0.05,
    spacing_ms: int = 200,
    max_delay_ms: int = 20_000,
    window_ms: int = WINDOW_MS,
) -> Traffic:
    """``auctions`` impressions and their clicks, in a shuffled-but-bounded arrival order."""
    if max_delay_ms >= GRACE_MS:
        raise ValueError("max_delay_ms must stay below the grace period for exact expectations")
    rng = random.Random(seed)
    campaigns = [f"campaign-{i}" for i in range(12)]
    events: list[tuple[int, TrafficRecord]] = []
    traffic = Traffic()
    click_no = 0
    for n in range(auctions):
        auction = f"auction-{n:07d}"
        ts = EPOCH_MS + n * spacing_ms
        impression = {
            "impression_id": f"imp-{n}",
            "auction_id": auction,
            "ad_id": f"ad-{rng.randrange(500)}",
            "campaign": rng.choice(campaigns),
            "bid_micros": rng.randrange(100, 5_000),
        }
        events.append((ts, TrafficRecord("impressions", auction, impression, ts)))
        roll = rng.random()
        if roll < click_rate:
            delay = rng.randrange(1_000, window_ms)  # within the window: joins
        elif roll < click_rate + late_click_rate:
            delay = rng.randrange(window_ms + 1, window_ms + 5 * 60_000)  # after it: no join
            traffic.clicks_outside_window += 1
        else:
            delay = None
        if delay is not None:
            click_no += 1
            click = {
                "click_id": f"click-{click_no}",
                "auction_id": auction,
                "user": f"u{rng.randrange(10_000)}",
            }
            events.append((ts + delay, TrafficRecord("clicks", auction, click, ts + delay)))
            if delay <= window_ms:
                traffic.expected_joins.add(
                    (auction, impression["impression_id"], click["click_id"])
                )
        if rng.random() < orphan_click_rate:
            click_no += 1
            ghost = f"ghost-{n:07d}"
            click = {"click_id": f"click-{click_no}", "auction_id": ghost, "user": "u0"}
            events.append((ts + 500, TrafficRecord("clicks", ghost, click, ts + 500)))
            traffic.orphan_clicks += 1
    # arrival order: event time plus a bounded random delay (out of order, within grace)
    arrivals = sorted(
        ((ts + rng.randrange(max_delay_ms + 1), i, rec) for i, (ts, rec) in enumerate(events)),
        key=lambda a: (a[0], a[1]),
    )
    traffic.records = [rec for _, _, rec in arrivals]
    return traffic
