"""Recovery benchmark: changelog restore rate of streamjoin and of faust-streaming.

Run from the repository root::

    .venv/bin/python -m benchmarks.recovery [--records 1000000] [--partitions 4]
        [--bootstrap 127.0.0.1:PORT] [--repeat 3] [--no-faust] [--json]

1. Starts a local broker (``streamjoin.local_kafka.LocalKafka``), or uses the
   loopback broker given with ``--bootstrap``.
2. Creates one changelog topic ``<app id>-<table>-changelog`` (compacted, like a
   real one) and produces ``--records`` records to it once: 16-byte keys drawn from
   ``--keys`` distinct keys, partitioned like Kafka's Java producer, and JSON values
   of about ``--value-size`` bytes. Every record stays in the partition's active
   segment (1 GiB by default), which the log cleaner never compacts, so both systems
   read all of them; the benchmark checks that each one read every record.
3. **streamjoin**: builds an ``App`` with that table, ``TableStores`` on a fresh
   temporary state directory (RocksDB) and a started ``StateService``, calls
   ``set_assignment`` with every partition active and times until ``on_ready`` has
   fired for every partition: planning, seeking, fetching and writing into RocksDB.
   The service's start (its consumer's bootstrap) is not timed. ``--repeat`` runs,
   each on a new state directory; the median is reported.
4. **faust-streaming**: installs faust-streaming and rocksdict into their own
   virtual environment (``--faust-venv``; reused when present) and runs
   ``benchmarks/faust_recovery_app.py`` there: a Faust app with the same app id,
   table and partition count, store ``rocksdb://`` (rocksdict) by default, on a
   fresh data directory. Its restore time runs from the start of Faust's recovery
   round to the moment every active changelog partition is restored (Faust's own
   ``_set_recovery_started`` / ``_set_recovery_ended`` calls, recorded in the
   subprocess); worker start-up and the group join are excluded and shown apart.
5. Prints records/s for both and the ratio streamjoin / Faust against the targets
   (>= 10x Faust, >= 300,000 records/s), or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.broker import broker

TARGET_RATE = 300_000
TARGET_RATIO = 10.0
FAUST_REQUIREMENTS = ("faust-streaming", "rocksdict")
FAUST_APP = Path(__file__).with_name("faust_recovery_app.py")
TABLE = "restore"


def default_faust_venv() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "streamjoin" / "bench" / "faust-venv"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- data


@dataclass(frozen=True)
class DataSpec:
    records: int
    partitions: int
    keys: int
    value_size: int
    seed: int = 5


@dataclass
class Produced:
    topic: str
    app_id: str
    records: int
    per_partition: dict[int, int]
    distinct_keys: int
    distinct_per_partition: dict[int, int]
    key_bytes: int
    value_bytes: int
    seconds: float


def make_key(k: int) -> bytes:
    return b"user:%011d" % k  # 16 bytes


def make_value(rng: random.Random, n: int, size: int) -> bytes:
    body = b'{"n":%d,"amount":%d.%02d,"status":"%s","region":"%s","pad":"' % (
        n,
        rng.randrange(100_000),
        rng.randrange(100),
        rng.choice((b"open", b"paid", b"shipped", b"closed")),
        rng.choice((b"eu-west-1", b"us-east-1", b"ap-south-1")),
    )
    pad = max(0, size - len(body) - 2)
    return body + b"x" * pad + b'"}'


async def produce(bootstrap: str, spec: DataSpec, app_id: str) -> Produced:
    from aiokafka import AIOKafkaProducer

    from streamjoin.partitioner import partition_for_key
    from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

    topic = f"{app_id}-{TABLE}-changelog"
    await ensure_topics(
        bootstrap,
        [TopicSpec(topic, spec.partitions, config={"cleanup.policy": "compact"})],
    )
    rng = random.Random(spec.seed)
    keys = [make_key(k) for k in range(spec.keys)]
    key_partition = [partition_for_key(k, spec.partitions) for k in keys]
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=20,
        max_batch_size=1024 * 1024,
        max_request_size=8 * 1024 * 1024,
        compression_type=None,
    )
    await producer.start()
    started = time.monotonic()
    per_partition = {p: 0 for p in range(spec.partitions)}
    seen: set[int] = set()
    key_bytes = value_bytes = 0
    try:
        batches = {p: producer.create_batch() for p in range(spec.partitions)}
        pending: list[asyncio.Future[Any]] = []
        last_report = started
        for n in range(spec.records):
            k = rng.randrange(spec.keys)
            seen.add(k)
            key = keys[k]
            value = make_value(rng, n, spec.value_size)
            p = key_partition[k]
            key_bytes += len(key)
            value_bytes += len(value)
            batch = batches[p]
            if batch.append(key=key, value=value, timestamp=None) is None:
                pending.append(await producer.send_batch(batch, topic, partition=p))
                batch = batches[p] = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None) is None:
                    raise RuntimeError("a single record does not fit into an empty batch")
            per_partition[p] += 1
            if len(pending) >= 64:
                await asyncio.gather(*pending)
                pending.clear()
            now = time.monotonic()
            if now - last_report >= 2.0:
                log(f"  produced {n + 1:,} / {spec.records:,} ({(n + 1) / (now - started):,.0f}/s)")
                last_report = now
        for p, batch in batches.items():
            if batch.record_count():
                pending.append(await producer.send_batch(batch, topic, partition=p))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    seconds = time.monotonic() - started
    distinct_per_partition = {p: 0 for p in range(spec.partitions)}
    for k in seen:
        distinct_per_partition[key_partition[k]] += 1
    return Produced(
        topic=topic,
        app_id=app_id,
        records=spec.records,
        per_partition=per_partition,
        distinct_keys=len(seen),
        distinct_per_partition=distinct_per_partition,
        key_bytes=key_bytes,
        value_bytes=value_bytes,
        seconds=seconds,
    )


# ---------------------------------------------------------------------------- streamjoin


@dataclass
class Run:
    seconds: float
    records: int
    keys: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("nan")


async def restore_streamjoin(
    bootstrap: str, data: Produced, partitions: int, state_root: Path, count_keys: bool = True
) -> Run:
    from streamjoin.app import App
    from streamjoin.runtime.table_state.service import StateService, TableStores

    state_dir = Path(tempfile.mkdtemp(prefix="sj-restore-", dir=state_root))
    try:
        app = App(data.app_id, broker=f"kafka://{bootstrap}", state_dir=state_dir)
        app.table(TABLE, partitions=partitions)
        table = app.tables[TABLE]
        if table.changelog.name != data.topic:
            raise RuntimeError(f"changelog {table.changelog.name!r} != topic {data.topic!r}")
        stores = TableStores(app.tables, app.config.state_path)
        ready: set[int] = set()
        all_ready = asyncio.Event()

        def on_ready(name: str, partition: int, store: Any) -> None:
            ready.add(partition)
            if len(ready) == partitions:
                all_ready.set()

        service = StateService(
            stores, bootstrap_servers=app.config.broker, client_options={}, on_ready=on_ready
        )
        await service.start()
        try:
            started = time.monotonic()
            cpu_started = time.process_time()
            service.set_assignment({TABLE: set(range(partitions))}, {})
            await all_ready.wait()
            seconds = time.monotonic() - started
            cpu_seconds = time.process_time() - cpu_started
            restored = service.restored_records
            keys = None
            if count_keys:
                keys = sum(
                    sum(1 for _ in store.items())
                    for key in stores.open_keys()
                    if (store := stores.get(*key)) is not None
                )
        finally:
            await service.stop()
        return Run(seconds, restored, keys, {"cpu_seconds": cpu_seconds})
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


# ---------------------------------------------------------------------------- faust


class FaustUnavailable(RuntimeError):
    """faust-streaming could not be installed or run here; the message says why."""


def ensure_faust_venv(venv: Path, timeout: float) -> Path:
    python = venv / "bin" / "python"
    if python.exists():
        probe = subprocess.run(
            [str(python), "-c", "import faust, rocksdict; print(faust.__version__)"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if probe.returncode == 0:
            return python
        log(f"  the Faust venv at {venv} is unusable; recreating it")
        shutil.rmtree(venv, ignore_errors=True)
    log(f"  creating a virtual environment for faust-streaming at {venv}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    base = shutil.which("python3.11") or sys.executable
    steps = [
        [base, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", *FAUST_REQUIREMENTS],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise FaustUnavailable(f"{' '.join(step)} timed out after {timeout:.0f}s") from exc
        if done.returncode != 0:
            raise FaustUnavailable(
                f"{' '.join(step)} failed ({done.returncode}): "
                + (done.stderr or done.stdout).strip()[-2000:]
            )
    return python


def restore_faust(
    python: Path,
    bootstrap: str,
    data: Produced,
    partitions: int,
    state_root: Path,
    store: str,
    timeout: float,
    keep_log: Path | None = None,
) -> Run:
    datadir = Path(tempfile.mkdtemp(prefix="faust-restore-", dir=state_root))
    log_path = state_root / f"faust-{uuid.uuid4().hex[:8]}.log"
    result_path = log_path.with_suffix(".json")
    cmd = [
        str(python),
        str(FAUST_APP),
        "--bootstrap",
        bootstrap,
        "--app-id",
        data.app_id,
        "--table",
        TABLE,
        "--partitions",
        str(partitions),
        "--datadir",
        str(datadir),
        "--store",
        store,
        "--result-file",
        str(result_path),
        "--loglevel",
        "info",
    ]
    try:
        with log_path.open("w+") as err:
            proc = subprocess.Popen(
                cmd,
                stdout=err,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                cwd=datadir,
            )
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                _kill_group(proc)
                raise FaustUnavailable(
                    f"the Faust worker did not finish restoring within {timeout:.0f}s; "
                    f"log tail: {_tail(log_path)}"
                ) from exc
            finally:
                if proc.poll() is None:
                    _kill_group(proc)
        result = json.loads(result_path.read_text()) if result_path.exists() else None
        if result is None:
            raise FaustUnavailable(
                f"the Faust worker exited ({proc.returncode}) without a result; "
                f"log tail: {_tail(log_path)}"
            )
        if result.get("restore_seconds") is None:
            raise FaustUnavailable(f"the Faust worker reported no recovery: {result}")
        # Offsets are the last offset applied per partition; highwaters the last offset.
        restored = sum(int(o) + 1 for o in result["offsets"].values())
        return Run(result["restore_seconds"], restored, result.get("keys"), result)
    finally:
        shutil.rmtree(datadir, ignore_errors=True)
        if keep_log is not None and log_path.exists():
            shutil.copyfile(log_path, keep_log)
        log_path.unlink(missing_ok=True)
        result_path.unlink(missing_ok=True)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------------------- report


def summarize(runs: list[Run]) -> dict[str, Any]:
    seconds = statistics.median(r.seconds for r in runs)
    records = runs[0].records
    return {
        "records": records,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "runs_seconds": [round(r.seconds, 4) for r in runs],
        "runs_cpu_seconds": [
            round(r.extra["cpu_seconds"], 4) for r in runs if "cpu_seconds" in r.extra
        ],
        "keys": runs[0].keys,
    }


def render_table(result: dict[str, Any]) -> str:
    rows = [("system", "records", "seconds", "records/s", "ratio")]
    sj = result["streamjoin"]
    fa = result.get("faust")
    rows.append(
        (
            "streamjoin",
            f"{sj['records']:,}",
            f"{sj['seconds']:.2f}",
            f"{sj['records_per_s']:,.0f}",
            f"{result['ratio']:.1f}x" if result.get("ratio") else "",
        )
    )
    if fa is not None:
        rows.append(
            (
                f"faust-streaming {fa['version']} ({fa['store']})",
                f"{fa['records']:,}",
                f"{fa['seconds']:.2f}",
                f"{fa['records_per_s']:,.0f}",
                "1.0x",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(w) if j == 0 else cell.rjust(w)
                for j, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    targets = result["targets"]
    lines.append("")
    cpu = sj.get("runs_cpu_seconds")
    if cpu:
        lines.append(
            f"streamjoin runs: {', '.join(f'{x:.2f}' for x in sj['runs_seconds'])} s wall, "
            f"{', '.join(f'{x:.2f}' for x in cpu)} s process CPU"
        )
    if fa is not None:
        lines.append(
            f"faust: start-up {', '.join(f'{x:.1f}' for x in fa['startup_seconds'])} s "
            "(not counted); read+apply only "
            f"{', '.join(f'{x:.2f}' for x in fa['read_apply_seconds'])} s"
        )
    lines.append(f"load average at end: {result['machine']['loadavg_at_end']}")
    lines.append(
        f"target >= {TARGET_RATE:,} records/s: " + ("met" if targets["rate_met"] else "NOT met")
    )
    if targets["ratio_met"] is None:
        lines.append(f"target >= {TARGET_RATIO:.0f}x Faust: not measured ({result['faust_error']})")
    else:
        lines.append(
            f"target >= {TARGET_RATIO:.0f}x Faust: "
            + ("met" if targets["ratio_met"] else "NOT met")
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main


async def _run(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    spec = DataSpec(args.records, args.partitions, args.keys, args.value_size)
    app_id = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    state_root = Path(tempfile.mkdtemp(prefix="streamjoin-recovery-bench-"))
    try:
        log(
            f"producing {spec.records:,} records to {app_id}-{TABLE}-changelog "
            f"({spec.partitions} partitions, {spec.keys:,} keys)"
        )
        data = await produce(bootstrap, spec, app_id)
        log(
            f"  produced in {data.seconds:.1f}s ({data.records / data.seconds:,.0f}/s), "
            f"{data.distinct_keys:,} distinct keys, "
            f"{(data.key_bytes + data.value_bytes) / data.records:.0f} B/record"
        )

        sj_runs: list[Run] = []
        for i in range(args.repeat):
            run = await restore_streamjoin(bootstrap, data, spec.partitions, state_root)
            log(
                f"  streamjoin run {i + 1}: {run.seconds:.2f}s, {run.rate:,.0f} records/s "
                f"(process CPU {run.extra['cpu_seconds']:.2f}s)"
            )
            _check(run, data, "streamjoin")
            sj_runs.append(run)

        faust: dict[str, Any] | None = None
        faust_error = None
        if args.faust:
            try:
                python = await asyncio.to_thread(
                    ensure_faust_venv, args.faust_venv, args.install_timeout
                )
                fa_runs: list[Run] = []
                for i in range(args.faust_repeat):
                    run = await asyncio.to_thread(
                        restore_faust,
                        python,
                        bootstrap,
                        data,
                        spec.partitions,
                        state_root,
                        args.faust_store,
                        args.faust_timeout,
                        args.faust_log,
                    )
                    log(
                        f"  faust run {i + 1}: {run.seconds:.2f}s, {run.rate:,.0f} records/s "
                        f"(start-up {run.extra['startup_seconds']:.1f}s not counted; "
                        f"read+apply only {run.extra['read_apply_seconds']:.2f}s)"
                    )
                    _check(run, data, "faust")
                    fa_runs.append(run)
                faust = summarize(fa_runs)
                faust.update(
                    version=fa_runs[0].extra["faust_version"],
                    store=fa_runs[0].extra["store"],
                    python=fa_runs[0].extra["python"],
                    startup_seconds=[round(r.extra["startup_seconds"], 2) for r in fa_runs],
                    read_apply_seconds=[round(r.extra["read_apply_seconds"], 4) for r in fa_runs],
                    recovery_events=[r.extra.get("events") for r in fa_runs],
                )
            except FaustUnavailable as exc:
                faust_error = str(exc)
                log(f"  faust-streaming could not be measured: {faust_error}")

        sj = summarize(sj_runs)
        ratio = sj["records_per_s"] / faust["records_per_s"] if faust else None
        return {
            "benchmark": "recovery",
            "machine": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                # Other work on the machine skews wall times: record how busy it was.
                "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            },
            "data": {
                **asdict(spec),
                "topic": data.topic,
                "distinct_keys": data.distinct_keys,
                "bytes_per_record": (data.key_bytes + data.value_bytes) / data.records,
                "per_partition": data.per_partition,
                "produce_seconds": round(data.seconds, 2),
            },
            "streamjoin": sj,
            "faust": faust,
            "faust_error": faust_error,
            "ratio": ratio,
            "targets": {
                "rate": TARGET_RATE,
                "ratio": TARGET_RATIO,
                "rate_met": sj["records_per_s"] >= TARGET_RATE,
                "ratio_met": None if ratio is None else ratio >= TARGET_RATIO,
            },
        }
    finally:
        shutil.rmtree(state_root, ignore_errors=True)


def _check(run: Run, data: Produced, who: str) -> None:
    if run.records != data.records:
        raise RuntimeError(f"{who} restored {run.records:,} records, expected {data.records:,}")
    if run.keys is not None and run.keys != data.distinct_keys:
        raise RuntimeError(f"{who} holds {run.keys:,} keys, expected {data.distinct_keys:,}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.recovery", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--keys", type=int, default=200_000, help="distinct keys")
    parser.add_argument("--value-size", type=int, default=80, help="approximate value bytes")
    parser.add_argument(
        "--bootstrap", help="use this loopback broker (host:port) instead of starting one"
    )
    parser.add_argument("--repeat", type=int, default=3, help="streamjoin runs (median)")
    parser.add_argument("--faust-repeat", type=int, default=1, help="Faust runs (median)")
    parser.add_argument("--no-faust", dest="faust", action="store_false")
    parser.add_argument("--faust-store", default="rocksdb://", help="rocksdb:// or memory://")
    parser.add_argument("--faust-venv", type=Path, default=default_faust_venv())
    parser.add_argument("--faust-timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--faust-log", type=Path, help="keep the Faust worker's log here")
    parser.add_argument("--install-timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    if args.records < 1 or args.partitions < 1 or args.keys < 1:
        parser.error("--records, --partitions and --keys must be positive")
    if args.repeat < 1 or args.faust_repeat < 1:
        parser.error("--repeat and --faust-repeat must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with broker(args.bootstrap, log) as bootstrap:
        result = asyncio.run(_run(args, bootstrap))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
