"""OpenTelemetry export (the ``streamjoin[otel]`` extra): the worker's metrics as
observable instruments of a MeterProvider you configure.

    from opentelemetry.sdk.metrics import MeterProvider
    from streamjoin.otel import instrument

    instrument(app.metrics, meter_provider)

Each metric of ``docs/operations.md`` becomes an instrument of the same name:
counters are observable counters, gauges observable gauges, and each histogram
two observable counters, ``<name>_count`` and ``<name>_sum`` (OpenTelemetry has
no observable histogram). The values are read from one snapshot per collection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from streamjoin.errors import ConfigurationError
from streamjoin.runtime.metrics import METRICS, histograms, samples

__all__ = ["instrument"]

#: snapshots younger than this are reused: one collection calls every instrument's callback
_REUSE_SECONDS = 0.5


def instrument(
    source: Callable[[], Mapping[str, Any]], meter_provider: Any, *, name: str = "streamjoin"
) -> None:
    """Register observable instruments reading ``source()`` (e.g. ``app.metrics``) with
    ``meter_provider``'s meter ``name``."""
    try:
        from opentelemetry.metrics import CallbackOptions, Observation
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigurationError(
            "OpenTelemetry export needs the otel extra: pip install 'streamjoin[otel]'"
        ) from exc
    meter = meter_provider.get_meter(name)
    cache: list[Any] = [0.0, None]

    def snapshot() -> Mapping[str, Any]:
        now = time.monotonic()
        if cache[1] is None or now - cache[0] > _REUSE_SECONDS:
            cache[0], cache[1] = now, source()
        found: Mapping[str, Any] = cache[1]
        return found

    def plain(spec_name: str, labels: tuple[str, ...]) -> Callable[[CallbackOptions], Any]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for values, value in samples(snapshot())[spec_name]:
                yield Observation(value, dict(zip(labels, values, strict=True)))

        return callback

    def part(spec_name: str, labels: tuple[str, ...], key: str) -> Callable[[CallbackOptions], Any]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for values, h in histograms(snapshot()).get(spec_name, []):
                yield Observation(h[key], dict(zip(labels, values, strict=True)))

        return callback

    for spec in METRICS:
        if spec.kind == "histogram":
            for key in ("count", "sum"):
                meter.create_observable_counter(
                    f"{spec.name}_{key}",
                    callbacks=[part(spec.name, spec.labels, key)],
                    description=f"{spec.help} ({key})",
                )
        elif spec.kind == "counter":
            meter.create_observable_counter(
                spec.name, callbacks=[plain(spec.name, spec.labels)], description=spec.help
            )
        else:
            meter.create_observable_gauge(
                spec.name, callbacks=[plain(spec.name, spec.labels)], description=spec.help
            )
