"""The kill -9 soak at a large size: exactly-once must stay exact, at-least-once shows the cost.

    .venv/bin/python -m benchmarks.eos_soak                       # starts a local broker
    .venv/bin/python -m benchmarks.eos_soak --scale 8 --guarantee both --bootstrap HOST:PORT

The scenario is the suite's (tests/integration/test_exactly_once.py, ``run_soak``): three
worker processes of tests/integration/apps/eos_app.py (a stream-stream join and a counting
table), one killed with SIGKILL every 1.5-4.5 s and restarted with the same instance id,
while ad traffic and counted events are produced; then a ``read_committed`` reader counts
missing and duplicate joins and checks every key's count updates are exactly 1..n.
``--scale`` multiplies the suite's 25 s of traffic. Exit status 1 if exactly-once was not
exact.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.broker import broker
from tests.integration.test_exactly_once import (
    AT_LEAST_ONCE,
    EXACTLY_ONCE,
    SoakOutcome,
    run_soak,
    soak_size,
)


def say(message: str) -> None:
    print(f"[eos-soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def soak(
    bootstrap: str, guarantees: list[str], scale: float, workdir: Path
) -> list[SoakOutcome]:
    run_id = uuid.uuid4().hex[:8]
    counter = itertools.count()
    outcomes = []
    for guarantee in guarantees:

        def unique_topic(prefix: str = "t") -> str:
            return f"soak-{run_id}-{prefix}-{next(counter)}"

        say(f"{guarantee}: {soak_size(scale).seconds:.0f}s of traffic, one kill -9 every ~3 s")
        outcome = await run_soak(
            bootstrap, unique_topic, workdir / guarantee, guarantee, soak_size(scale)
        )
        say(str(outcome))
        outcomes.append(outcome)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=8.0, help="x the suite's 25 s of traffic")
    parser.add_argument(
        "--guarantee", choices=(EXACTLY_ONCE, AT_LEAST_ONCE, "both"), default="both"
    )
    parser.add_argument("--bootstrap", help="reuse a running loopback broker (HOST:PORT)")
    args = parser.parse_args(argv)
    guarantees = [EXACTLY_ONCE, AT_LEAST_ONCE] if args.guarantee == "both" else [args.guarantee]
    with (
        tempfile.TemporaryDirectory(prefix="streamjoin-eos-soak-") as tmp,
        broker(args.bootstrap, say) as bootstrap,
    ):
        outcomes = asyncio.run(soak(bootstrap, guarantees, args.scale, Path(tmp)))
    for outcome in outcomes:
        print(outcome)
    return 0 if all(o.exact for o in outcomes if o.guarantee == EXACTLY_ONCE) else 1


if __name__ == "__main__":
    raise SystemExit(main())
