"""The loop and the result table every systems-in-rounds benchmark shares
(benchmarks/harness.py): a wrong answer must never pass for a right one, nor a wrong
system become the yardstick of the others."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from benchmarks.harness import (
    KSTREAMS_COLUMNS,
    WORKLOAD_COLUMNS,
    Launch,
    WorkloadResult,
    ratio_rows,
    results_table,
    rounds_report,
    run_rounds,
)

#: a process that marks the one partition done, then waits to be stopped
MARKING = (
    "import os, time\n"
    "with open(os.environ['BENCH_MARKS'], 'w') as out:\n"
    "    out.write('FIRST 1.0 0.1\\nPDONE 2.0 0.3 t:0\\nDONE 2.0 0.3\\n')\n"
    "time.sleep(60)\n"
)


def _measured(system: str, cpu: float, rss: float, correct: bool = True) -> WorkloadResult:
    return WorkloadResult(
        system=system,
        status="ok" if correct else "wrong",
        version="1",
        events=100,
        startup_seconds=0.5,
        seconds=2.0,
        events_per_s=50.0,
        cpu_seconds=cpu,
        cpu_us_per_event=cpu * 10_000,
        peak_rss_mb=rss,
        correct=correct,
        check={"expected": 100, "missing": 0 if correct else 3},
    )


def test_ratios_are_only_against_a_correct_reference_of_the_same_kind() -> None:
    results = [
        _measured("streamjoin", 1.0, 50.0),
        _measured("kstreams", 4.0, 200.0),
        _measured("streamjoin-close", 1.0, 50.0),
        _measured("kstreams-close", 2.0, 100.0, correct=False),
    ]
    rows = ratio_rows(
        results,
        KSTREAMS_COLUMNS,
        lambda s: "kstreams-close" if s.endswith("-close") else "kstreams",
    )
    cpu_x, rss_x, verdict = (
        KSTREAMS_COLUMNS.index(c) for c in ("cpu x KS", "RSS x KS", "correct?")
    )
    assert [(row[cpu_x], row[rss_x]) for row in rows[1:]] == [
        ("0.25", "0.25"),
        ("", ""),  # (not against itself)
        ("", ""),  # (its reference is wrong)
        ("", ""),
    ]
    assert [row[verdict] for row in rows[1:]] == ["yes", "yes", "yes", "NO: 3 missing"]


def test_the_workload_table_marks_a_wrong_ratio_and_keeps_a_failed_runs_labels() -> None:
    failed = WorkloadResult(system="faust", status="failed", version="0.11", processes=1)
    failed.detail = "exited with 1:\nTraceback"
    runs = [
        _measured("streamjoin", 1.0, 50.0),
        _measured("quix", 3.0, 90.0, correct=False),
        failed,
    ]
    report = rounds_report("cmd", "HEAD", 1, runs)
    text = results_table(report, WORKLOAD_COLUMNS, lambda _: "streamjoin")
    lines = text.splitlines()
    assert lines[0] == "HEAD"
    quix = next(line for line in lines if line.startswith("quix"))
    assert "(3.00x)" in quix and "NO: 3 missing" in quix
    faust = next(line for line in lines if line.startswith("faust "))
    assert faust.split() == ["faust", "0.11", "1", "failed"]
    assert lines[-1] == "faust round 0: failed: exited with 1:"


async def test_run_rounds_skips_runs_checks_and_judges_every_round(tmp_path: Path) -> None:
    checked: list[list[str]] = []
    answers = iter([{"expected": 5, "missing": 0}, {"expected": 5, "optional": 2, "wrong": 1}])

    def launch(system: str, r: int, name: str) -> Launch:
        async def check(marks: list[Path]) -> dict[str, int]:
            checked.append([m.name for m in marks])
            return next(answers)

        return Launch([([sys.executable, "-c", MARKING], {})], check)

    results = await run_rounds(
        SimpleNamespace(repeat=2, timeout=30),
        ["a", "gone"],
        {"a": ("1.2", ""), "gone": ("", "no venv")},
        launch,
        10,
        {("t", 0): 0},
        tmp_path,
        lambda _: None,
    )
    assert [(r.system, r.round, r.status) for r in results] == [
        ("a", 0, "ok"),
        ("gone", 0, "skipped"),
        ("a", 1, "wrong"),
        ("gone", 1, "skipped"),
    ]
    assert checked == [["a-0-0.marks"], ["a-1-0.marks"]]
    first = results[0]
    assert first.version == "1.2" and first.seconds == 1.0
    assert first.cpu_us_per_event is not None and round(first.cpu_us_per_event) == 20_000
    assert results[1].detail == "no venv"
    assert asdict(results[2])["correct"] is False


def test_the_kafka_streams_side_of_a_workload_gets_its_topics_and_the_commit_interval(
    tmp_path: Path,
) -> None:
    from benchmarks.harness import Topics, WorkloadSpec, kstreams_workload_command

    async def no_check(*_: object) -> dict[str, int]:
        return {}

    spec = WorkloadSpec(
        bench="enrichment",
        workload="enrich",
        records=[],
        head="",
        check=no_check,
        kstreams_app="TableJoins",
        kstreams_params={"workload": "enrich"},
    )
    args = SimpleNamespace(kstreams_commit_ms=1000, kstreams_java_options="-Xmx1g -XX:+UseG1GC")
    command, env = kstreams_workload_command(
        args, spec, "cp.jar", "127.0.0.1:9", "g-1", Topics("events", "users", None), tmp_path
    )
    assert command[:5] == ["java", "-Xmx1g", "-XX:+UseG1GC", "-cp", "cp.jar"]
    assert command[5] == "streamjoin.bench.TableJoins"
    options = dict(zip(command[6::2], command[7::2], strict=True))
    assert options == {
        "--bootstrap": "127.0.0.1:9",
        "--app-id": "g-1",
        "--input": "events",
        "--table": "users",  # (no output topic: none is passed)
        "--state-dir": str(tmp_path),
        "--commit-ms": "1000",
        "--workload": "enrich",
    }
    assert "PYTHONPATH" not in env
