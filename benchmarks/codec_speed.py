"""CPU per record of each codec, without Kafka: decode and encode of one typical event.

    .venv/bin/python -m benchmarks.codec_speed
    .venv/bin/python -m benchmarks.codec_speed --records 20000 --repeat 7
    .venv/bin/python -m benchmarks.codec_speed --baseline-tree ../old-tree   # the JSON codec only

The event is an order of nine fields (ids, an amount, a flag, a timestamp, a list of two
lines), as plain JSON (the ``json`` codec, dicts out), as a dataclass, a
``msgspec.Struct`` and a pydantic model (``resolve_codec`` of the type), and in Faust's
record format over each (``FaustRecord``; reading a record Faust wrote, with its
``__faust`` key). Each figure is the best of ``--repeat`` passes over ``--records``
distinct payloads, in process CPU time. ``--baseline-tree`` times the built-in ``json``,
``str`` and ``raw`` codecs in another source tree too (a copy of an older commit),
alternating with this one, to check a change did not slow the hot paths.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

try:
    import pydantic
except ImportError:  # the optional extra
    pydantic = None

ROOT = Path(__file__).resolve().parents[1]


def _plain(i: int) -> dict[str, Any]:
    return {
        "id": f"order-{i}",
        "customer": f"customer-{i % 977}",
        "amount": 10.25 + i % 100,
        "quantity": i % 7 + 1,
        "paid": i % 2 == 0,
        "created": (dt.datetime(2026, 11, 27, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i))
        .isoformat()
        .replace("+00:00", "Z"),
        "channel": "web",
        "note": "",
        "lines": [{"sku": f"sku-{i % 31}", "qty": 1}, {"sku": f"sku-{i % 17}", "qty": 2}],
    }


def _time(fn: Callable[[Any], Any], items: list[Any], repeat: int) -> float:
    """Best-of-``repeat`` CPU nanoseconds per call of ``fn`` over ``items``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time_ns()
        for item in items:
            fn(item)
        best = min(best, (time.process_time_ns() - start) / len(items))
    return best


@dataclasses.dataclass
class DcLine:
    sku: str
    qty: int


@dataclasses.dataclass
class DcOrder:
    id: str
    customer: str
    amount: float
    quantity: int
    paid: bool
    created: dt.datetime
    channel: str
    note: str
    lines: list[DcLine]


class SLine(msgspec.Struct):
    sku: str
    qty: int


class SOrder(msgspec.Struct):
    id: str
    customer: str
    amount: float
    quantity: int
    paid: bool
    created: dt.datetime
    channel: str
    note: str
    lines: list[SLine]


class SOrderStrict(SOrder, forbid_unknown_fields=True):
    """Refuses unknown fields: Faust's records take the second pass."""


if pydantic is not None:

    class PLine(pydantic.BaseModel):
        sku: str
        qty: int

    class POrder(pydantic.BaseModel):
        id: str
        customer: str
        amount: float
        quantity: int
        paid: bool
        created: dt.datetime
        channel: str
        note: str
        lines: list[PLine]


def _dataclass(d: dict[str, Any]) -> DcOrder:
    created = dt.datetime.fromisoformat(d["created"].replace("Z", "+00:00"))
    lines = [DcLine(**x) for x in d["lines"]]
    return DcOrder(**{**d, "created": created, "lines": lines})


def _struct(d: dict[str, Any]) -> SOrder:
    return msgspec.convert(d, SOrder)


def typed_codecs() -> list[tuple[str, Any, Callable[[dict[str, Any]], Any]]]:
    """(label, codec, make an instance from the plain dict) of each codec compared."""
    from streamjoin.codecs import JSON, resolve_codec
    from streamjoin.faust_records import FaustRecord

    out: list[tuple[str, Any, Callable[[dict[str, Any]], Any]]] = [
        ("json (dict)", JSON, lambda d: d),
        ("dataclass", resolve_codec(DcOrder), _dataclass),
        ("msgspec.Struct", resolve_codec(SOrder), _struct),
    ]
    if pydantic is not None:
        out.append(("pydantic", resolve_codec(POrder), POrder.model_validate))
    out += [
        ("faust[dataclass]", FaustRecord(DcOrder), _dataclass),
        ("faust[msgspec.Struct]", FaustRecord(SOrder), _struct),
        (
            "faust[Struct, forbidding]",
            FaustRecord(SOrderStrict),
            lambda d: msgspec.convert(d, SOrderStrict),
        ),
    ]
    if pydantic is not None:
        out.append(("faust[pydantic]", FaustRecord(POrder), POrder.model_validate))
    return out


def measure_typed(records: int, repeat: int) -> list[tuple[str, float, float]]:
    """(codec, decode ns, encode ns) per record."""
    plain = [_plain(i) for i in range(records)]
    rows = []
    for label, codec, make in typed_codecs():
        if label.startswith("faust"):  # as a Faust producer writes it
            payloads = [json.dumps({**d, "__faust": {"ns": "shop.Order"}}).encode() for d in plain]
        else:
            payloads = [codec.dumps(make(d)) for d in plain]
        objects = [make(d) for d in plain]
        assert codec.loads(payloads[0]) == objects[0], label
        rows.append(
            (label, _time(codec.loads, payloads, repeat), _time(codec.dumps, objects, repeat))
        )
    return rows


def measure_builtins(records: int, repeat: int) -> dict[str, float]:
    """ns per record of the built-in codecs' hot paths, in the ``streamjoin`` importable here."""
    from streamjoin.codecs import JSON, RAW, STR

    plain = [_plain(i) for i in range(records)]
    flat = [{k: v for k, v in d.items() if k != "lines"} for d in plain]
    payloads = [JSON.dumps(d) for d in plain]
    keys = [f"customer-{i}" for i in range(records)]
    raw_keys = [k.encode() for k in keys]
    return {
        "json.loads (event)": _time(JSON.loads, payloads, repeat),
        "json.dumps (flat dict)": _time(JSON.dumps, flat, repeat),
        "json.dumps (nested dict)": _time(JSON.dumps, plain, repeat),
        "json.dumps (int)": _time(JSON.dumps, list(range(records)), repeat),
        "str.loads": _time(STR.loads, raw_keys, repeat),
        "str.dumps": _time(STR.dumps, keys, repeat),
        "raw.loads": _time(RAW.loads, raw_keys, repeat),
    }


def _builtins_in(tree: Path, records: int, repeat: int) -> dict[str, float]:
    """:func:`measure_builtins` in a process that imports ``streamjoin`` from ``tree``
    (this file loaded by path: the tree may have no such benchmark)."""
    code = (
        "import importlib.util, json, sys\n"
        f"sys.path.insert(0, {str(tree)!r})\n"
        f"spec = importlib.util.spec_from_file_location('codec_speed', {__file__!r})\n"
        "module = sys.modules['codec_speed'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        f"print(json.dumps(module.measure_builtins({records}, {repeat})))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, check=True
    )
    return dict(json.loads(result.stdout))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline-tree", type=Path, help="time the built-ins there too")
    parser.add_argument("--rounds", type=int, default=3, help="alternations with the baseline")
    args = parser.parse_args(argv)

    print(f"{'codec':<24}{'decode ns':>12}{'encode ns':>12}")
    for label, decode, encode in measure_typed(args.records, args.repeat):
        print(f"{label:<24}{decode:>12.0f}{encode:>12.0f}")
    if args.baseline_tree is None:
        return
    this: dict[str, list[float]] = {}
    base: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for tree, into in ((args.baseline_tree, base), (ROOT, this)):
            for name, ns in _builtins_in(tree, args.records, args.repeat).items():
                into.setdefault(name, []).append(ns)
    print(f"\n{'built-in hot path':<26}{'baseline ns':>12}{'this tree ns':>14}")
    for name in this:
        print(f"{name:<26}{min(base[name]):>12.0f}{min(this[name]):>14.0f}")


if __name__ == "__main__":
    main()
