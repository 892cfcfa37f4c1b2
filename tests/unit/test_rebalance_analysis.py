"""The rebalance trace analysis on synthetic traces (benchmarks/rebalance_analysis.py)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from benchmarks.rebalance_analysis import (
    Processed,
    Spread,
    analyze_event,
    by_partition,
    count_errors,
    describe_rebalances,
    duplicates,
    gaps,
    handover,
    largest_gap,
    log_events,
    missing,
    overlaps,
    percentile,
    read_trace_dir,
    read_worker_log,
    rebalances,
    resume_after_stall,
    runs,
    summarize_logs,
)

T = "events"


def rec(
    worker: str, partition: int, offset: int, at: float, pid: int = 1, count: int = 1
) -> Processed:
    return Processed(worker, pid, T, partition, offset, at, f"k{partition}", count)


def steady(
    worker: str, partition: int, offsets: range, start: float, every: float, pid: int = 1
) -> list[Processed]:
    return [rec(worker, partition, o, start + i * every, pid) for i, o in enumerate(offsets)]


# --------------------------------------------------------------------------- trace format


def test_a_record_survives_its_line_and_a_cut_last_line_is_skipped(tmp_path: Path) -> None:
    r = Processed("w1", 42, "topic-a", 3, 17, 1_700_000_000.123456, "key-9", 5)
    assert Processed.from_line(r.to_line()) == r
    (tmp_path / "w1.42.trace").write_text(r.to_line() + r.to_line()[:10])
    (tmp_path / "other.txt").write_text("not a trace\n")
    assert read_trace_dir(tmp_path) == [r]


# --------------------------------------------------------------------------- runs, overlaps


def test_a_run_continues_across_a_pause_and_ends_at_a_seek() -> None:
    records = [
        *steady("w1", 0, range(0, 5), 0.0, 0.1),
        # paused 2 s (an eager rebalance that kept the partition): same run
        *steady("w1", 0, range(5, 8), 2.5, 0.1),
        # a seek back (the partition came back after a crash): a new run
        *steady("w1", 0, range(6, 9), 5.0, 0.1),
    ]
    (first, second) = runs(records)[(T, 0)]
    assert (first.first_offset, first.last_offset, first.records) == (0, 7, 8)
    assert first.start == 0.0 and first.end == pytest.approx(2.7)
    assert (second.first_offset, second.last_offset, second.start) == (6, 8, 5.0)
    assert overlaps(runs(records)) == []  # one member never overlaps itself


def test_a_clean_handover_does_not_overlap_even_when_the_runs_touch() -> None:
    records = [*steady("w1", 0, range(0, 10), 0.0, 0.1), *steady("w2", 0, range(10, 20), 0.9, 0.1)]
    assert overlaps(runs(records)) == []


def test_two_members_processing_one_partition_at_once_overlap_by_the_shared_span() -> None:
    records = [
        *steady("w1", 0, range(0, 10), 0.0, 0.1),  # 0.0 .. 0.9
        *steady("w2", 0, range(5, 15), 0.5, 0.1),  # 0.5 .. 1.4: replays 5..9 meanwhile
        *steady("w3", 1, range(0, 10), 0.0, 0.1),  # another partition: not involved
    ]
    (found,) = overlaps(runs(records))
    assert found.tp == (T, 0)
    assert (found.a.member, found.b.member) == (("w1", 1), ("w2", 1))
    assert found.seconds == pytest.approx(0.4)


def test_a_single_record_inside_another_members_run_is_an_overlap_of_zero_seconds() -> None:
    records = [*steady("w1", 0, range(0, 10), 0.0, 0.1), rec("w2", 0, 4, 0.45)]
    (found,) = overlaps(runs(records))
    assert found.seconds == 0.0
    assert found.b.records == 1


def test_a_restarted_process_of_the_same_worker_is_another_member() -> None:
    records = [
        *steady("w1", 0, range(0, 10), 0.0, 0.1, pid=1),
        *steady("w1", 0, range(8, 12), 0.85, 0.01, pid=2),  # the old process not dead yet
    ]
    (found,) = overlaps(runs(records))
    assert {found.a.member, found.b.member} == {("w1", 1), ("w1", 2)}


def test_overlaps_within_the_clock_resolution_are_not_reported() -> None:
    records = [*steady("w1", 0, range(0, 3), 0.0, 0.1), rec("w2", 0, 3, 0.2 - 5e-7)]
    assert overlaps(runs(records)) == []
    assert len(overlaps(runs(records), resolution=0.0)) == 1


# --------------------------------------------------------------------------- gaps


def test_gaps_inside_and_across_the_window_edges_count_whole() -> None:
    times = [0.0, 1.0, 1.5, 4.0, 4.2]
    assert [(g.start, g.end) for g in gaps((T, 0), times, 1.2, 3.0)] == [(1.0, 1.5), (1.5, 4.0)]
    biggest = largest_gap((T, 0), times, 1.2, 3.0)
    assert biggest is not None and biggest.seconds == 2.5


def test_a_partition_silent_until_the_window_ends_has_an_open_gap() -> None:
    (g,) = gaps((T, 0), [0.0, 1.0], 2.0, 5.0)
    assert (g.start, g.end, g.open) == (1.0, 5.0, True)
    assert gaps((T, 0), [], 0.0, 5.0) == []
    assert largest_gap((T, 0), [], 0.0, 5.0) is None


def test_resume_after_stall_is_the_end_of_the_last_long_gap() -> None:
    times = [0.0, 0.1, 0.2, 1.2, 1.3, 1.4, 2.0, 2.1]
    assert resume_after_stall((T, 0), times, 0.0, 2.2, threshold=0.5) == 2.0
    assert resume_after_stall((T, 0), times, 0.0, 2.2, threshold=1.5) is None
    assert resume_after_stall((T, 0), [0.0, 0.1], 0.0, 3.0, threshold=0.5) == math.inf
    # only stalls that began by the cutoff count: the one from 1.4 to 2.0 does not
    assert resume_after_stall((T, 0), times, 0.0, 2.2, threshold=0.5, began_by=1.0) == 1.2


# --------------------------------------------------------------------------- correctness


def test_duplicates_list_every_processing_of_an_offset_in_time_order() -> None:
    records = [
        rec("w1", 0, 0, 0.0),
        rec("w1", 0, 1, 0.1),
        rec("w2", 0, 1, 0.5),
        rec("w2", 0, 2, 0.6),
    ]
    (dup,) = duplicates(records)
    assert (dup.tp, dup.offset, dup.times, dup.members) == (
        (T, 0),
        1,
        (0.1, 0.5),
        (("w1", 1), ("w2", 1)),
    )


def test_missing_counts_produced_offsets_nobody_processed() -> None:
    records = [rec("w1", 0, o, o) for o in (0, 1, 3)] + [rec("w1", 1, 0, 0.0)]
    produced = {(T, 0): (0, 5), (T, 1): (0, 1), (T, 2): (0, 2)}
    assert missing(records, produced) == {(T, 0): 2, (T, 2): 2}


def test_count_errors_flag_a_double_count_and_a_lost_count_but_not_a_replay() -> None:
    def key(k: str, offset: int, count: int) -> Processed:
        return Processed("w1", 1, T, 0, offset, float(offset), k, count)

    records = [
        key("replayed", 0, 1),
        key("replayed", 1, 2),
        key("replayed", 1, 2),  # restored, redone
        key("twice", 2, 1),
        key("twice", 3, 2),
        key("twice", 3, 3),  # counted again
        key("lost", 4, 1),
        key("lost", 5, 1),  # a count lost
    ]
    assert count_errors(records) == {"lost": (1, 2), "twice": (3, 2)}


# --------------------------------------------------------------------------- statistics


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    assert math.isnan(percentile([], 50))
    assert Spread.of([0.2, 0.1, 0.4]) == Spread(0.2, 0.4, 0.4, 3)


# --------------------------------------------------------------------------- events


def eager_join_trace() -> list[Processed]:
    """Three partitions at 10 events/s each; at t=10 a worker joins, every partition stops
    1 s (an eager rebalance) and partition 2 moves from w2 to w3 (and stops 1.5 s)."""
    out: list[Processed] = []
    for p, before, after, stop in (
        (0, "w1", "w1", 11.0),
        (1, "w2", "w2", 11.0),
        (2, "w2", "w3", 11.5),
    ):
        out += steady(before, p, range(0, 101), 0.0, 0.1)  # 0.0 .. 10.0
        out += steady(after, p, range(101, 191), stop, 0.1)
    return out


def test_an_eager_join_stalls_every_partition_and_moves_one() -> None:
    stats = analyze_event(by_partition(eager_join_trace()), t=10.05, end=18.0, quiet=5.0)
    assert stats.normal.max == pytest.approx(0.1)
    assert stats.threshold == pytest.approx(0.2)
    assert (stats.stayed, stats.moved, stats.restarted) == ([(T, 0), (T, 1)], [(T, 2)], [])
    assert stats.stalled == [(T, 0), (T, 1), (T, 2)]
    assert stats.latency == pytest.approx(11.5 - 10.05)
    assert stats.stayed_gap.max == pytest.approx(1.0)
    assert stats.stayed_normal.max == pytest.approx(0.1)
    assert stats.handover == {(T, 2): pytest.approx(1.5)}
    assert stats.duplicates == 0
    assert stats.unprocessed == []


def test_one_hiccup_in_the_quiet_window_does_not_hide_the_rebalance() -> None:
    records = eager_join_trace()
    # partition 1 paused 0.8 s at 7.0, before the event: the normal gap is still 0.1 s
    records = [
        r if r.partition != 1 or r.time < 7.0 else Processed(**{**r.__dict__, "time": r.time + 0.8})
        for r in records
    ]
    stats = analyze_event(by_partition(records), t=10.05, end=18.0, quiet=5.0)
    assert stats.normal.max == pytest.approx(0.9)
    assert stats.threshold == pytest.approx(0.2)
    assert stats.stalled == [(T, 0), (T, 1), (T, 2)]


def test_a_kill_and_restart_replays_uncommitted_offsets_on_a_new_process() -> None:
    records = [
        *steady("w1", 0, range(0, 101), 0.0, 0.1, pid=10),
        # killed at 10.0 having committed offset 95; restarted, back at 13.0, replays 95..100
        *steady("w1", 0, range(95, 200), 13.0, 0.1, pid=11),
        *steady("w2", 1, range(0, 250), 0.0, 0.1),
    ]
    stats = analyze_event(by_partition(records), t=10.02, end=20.0, quiet=5.0)
    assert stats.restarted == [(T, 0)] and stats.stayed == [(T, 1)] and stats.moved == []
    assert stats.stalled == [(T, 0)]
    assert stats.latency == pytest.approx(13.0 - 10.02)
    assert stats.handover[(T, 0)] == pytest.approx(3.0)
    assert stats.duplicates == 6
    assert stats.stayed_gap.max == pytest.approx(0.1)


def test_a_hiccup_after_the_rebalance_ended_is_not_its_latency() -> None:
    records = eager_join_trace()
    # partition 0 pauses 0.5 s at 15.0 (the machine was busy), long after the rebalance
    records = [
        r
        if r.partition != 0 or r.time < 15.0
        else Processed(**{**r.__dict__, "time": r.time + 0.5})
        for r in records
    ]
    parts = by_partition(records)
    assert analyze_event(parts, t=10.05, end=18.0, quiet=5.0).latency == pytest.approx(15.5 - 10.05)
    stats = analyze_event(parts, t=10.05, end=18.0, quiet=5.0, cutoff=12.0)
    assert stats.latency == pytest.approx(11.5 - 10.05)
    assert stats.stalled == [(T, 0), (T, 1), (T, 2)]


def test_a_partition_nobody_processes_after_the_event_is_reported() -> None:
    records = steady("w1", 0, range(0, 101), 0.0, 0.1) + steady("w2", 1, range(0, 200), 0.0, 0.1)
    stats = analyze_event(by_partition(records), t=10.05, end=15.0, quiet=5.0)
    assert stats.unprocessed == [(T, 0)]
    assert stats.latency == math.inf


# --------------------------------------------------------------------------- worker logs


def stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f",{int(at % 1 * 1000):03d}"


def test_logs_give_assignments_and_restores_in_the_window() -> None:
    base = float(int(time.time()))
    text = "\n".join(
        [
            f"[{stamp(base)}] INFO streamjoin.consumer: assigned 4 partitions: e[0], e[1]",
            f"[{stamp(base + 1)}] INFO streamjoin.assignor: assignment epoch 7 for 3 members: "
            "12 tasks, 0 moved (minimum 0)",
            "worker for app 'x' running; Ctrl-C to stop",
            f"[{stamp(base + 1.25)}] INFO streamjoin.state: restoring counts[3]: "
            "120 changelog records to replay",
            f"[{stamp(base + 1.5)}] INFO streamjoin.state: restored counts[3]: "
            "120 records in 0.25s (480 records/s)",
            f"[{stamp(base + 2.0)}] INFO streamjoin.consumer: assigned 3 partitions: e[0]",
        ]
    )
    events = list(log_events("w1", text))
    kinds = ["assigned", "assignment", "restoring", "restored", "assigned"]
    assert [e.kind for e in events] == kinds
    assert events[0].time == base and events[3].time == base + 1.5
    assert (events[1].partition, events[1].records) == (7, 3)
    summary = summarize_logs(events, base + 0.5, base + 10)
    assert summary.last_assigned == pytest.approx(1.5)
    assert (summary.assignments, summary.rebalances) == (1, 1)
    assert (summary.restores_planned, summary.restored) == (120, 120)
    assert summary.restore_seconds == 0.25
    assert handover([], ("a", 1), ("b", 1), 0.0) is None


# ------------------------------------------------------------------ handovers, from the logs

BASE = float(int(time.time()))


def log(*lines: tuple[int, str, str]) -> str:
    """A worker's log: (milliseconds after BASE, logger, message) per line."""
    return "\n".join(
        f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(BASE + ms // 1000))},"
        f"{ms % 1000:03d}] INFO streamjoin.{logger}: {message}"
        for ms, logger, message in lines
    )


def done(
    ms: int, generation: int, how: str, took: float, added: int, revoked: int
) -> tuple[int, str, str]:
    return (
        ms,
        "membership",
        f"rebalance done: generation {generation} ({how}) in {took:.3f}s: {added} partitions "
        f"assigned, {revoked} revoked, 9 owned",
    )


def assigned(ms: int, *tps: str) -> tuple[int, str, str]:
    return (ms, "consumer", f"assigned {len(tps)} partitions: {', '.join(tps)} (owning 9)")


def restored(ms: int, partition: int, seconds: float) -> tuple[int, str, str]:
    return (
        ms,
        "state",
        f"restored counts[{partition}]: 40 records in {seconds:.2f}s (200 records/s)",
    )


def test_a_cooperative_rebalance_revokes_then_assigns_in_two_generations() -> None:
    w1 = log(
        assigned(0, "a[0]", "a[1]", "b[0]", "b[1]"),
        done(1, 1, "cooperative, leader", 0.05, 4, 0),
        (10_300, "assignor", "assignment epoch 1 for 2 members: 2 tasks, 1 moved (minimum 1)"),
        (10_400, "membership", "rejoining group g: partitions revoked for their new owner"),
        done(10_400, 2, "cooperative, leader", 0.4, 0, 2),  # the revoke round
        done(10_700, 3, "cooperative, leader", 0.3, 0, 0),
    )
    w2 = log(
        done(10_350, 2, "cooperative", 0.1, 0, 0),
        assigned(10_690, "a[1]", "b[1]"),  # the assign round
        done(10_690, 3, "cooperative", 0.2, 2, 0),
        (10_750, "state", "restoring counts[1]: 40 changelog records to replay"),
        restored(10_900, 1, 0.2),
    )
    first, second = rebalances([read_worker_log("w1", w1), read_worker_log("w2", w2)])
    assert (first.generations, first.joined, len(first.started), first.moved) == (
        (1,),
        ("w1",),
        4,
        [],
    )
    assert (second.generations, second.cooperative) == ((2, 3), True)
    assert (second.members, second.joined, second.stopped) == (("w1", "w2"), ("w2",), ())
    moved = second.moved
    assert sorted(h.tp for h in moved) == [("a", 1), ("b", 1)]
    for h in moved:
        assert (h.old, h.new, h.why) == ("w1", "w2", "revoked")
        # from the end of w1's revocation to the end of w2's restore
        assert h.paused == pytest.approx(0.5)
        assert h.restore_seconds == 0.2
    assert second.never_paused == 2  # a[0] and b[0] stayed on w1, processing throughout
    assert second.notes == ()
    assert describe_rebalances([first, second]) == [
        "generation 1, cooperative, 1 member (w1 joined): 2 tasks started (w1 2)",
        "generations 2-3, cooperative in 2 rounds (revoke, then assign), 2 members (w2 joined): "
        "1 task moved, 2 partitions never paused",
        "  a+b[1]: w1 -> w2, paused 0.50 s (restore 0.20 s)",
    ]


def test_a_logged_revocation_start_counts_the_revocations_own_time() -> None:
    # "revoking ..." is logged when the revocation starts (before the flush and commit of
    # what moves): the pause counts from there, not from the end of the revoke round
    w1 = log(
        assigned(0, "a[0]", "a[1]", "b[0]", "b[1]"),
        done(1, 1, "cooperative, leader", 0.05, 4, 0),
        (10_100, "consumer", "revoking 2 partitions: a[1], b[1] (owning 4)"),
        done(10_400, 2, "cooperative, leader", 0.4, 0, 2),
        done(10_700, 3, "cooperative, leader", 0.3, 0, 0),
    )
    w2 = log(
        done(10_350, 2, "cooperative", 0.1, 0, 0),
        assigned(10_690, "a[1]", "b[1]"),
        done(10_690, 3, "cooperative", 0.2, 2, 0),
    )
    _, second = rebalances([read_worker_log("w1", w1), read_worker_log("w2", w2)])
    assert sorted(h.tp for h in second.moved) == [("a", 1), ("b", 1)]
    for h in second.moved:
        assert (h.old, h.new, h.why) == ("w1", "w2", "revoked")
        assert h.paused == pytest.approx(0.59)  # 10.100 -> 10.690
    assert second.never_paused == 2


def test_the_tasks_of_a_stopped_worker_pause_from_its_stop_request() -> None:
    w1 = log(
        assigned(0, "a[0]", "b[0]"),
        done(0, 1, "cooperative, leader", 0.1, 2, 0),
        assigned(20_500, "a[1]", "b[1]"),
        done(20_500, 2, "cooperative, leader", 0.4, 2, 0),
    )
    w2 = log(
        assigned(2, "a[1]", "b[1]"),
        done(2, 1, "cooperative", 0.1, 2, 0),
        (20_000, "worker", "stop requested; finishing in-flight events and committing"),
    )
    _, stop = rebalances([read_worker_log("w1", w1), read_worker_log("w2", w2)])
    assert (stop.generations, stop.members, stop.stopped, stop.joined) == (
        (2,),
        ("w1",),
        ("w2",),
        (),
    )
    assert [(h.old, h.new, h.why) for h in stop.moved] == [("w2", "w1", "stopped")] * 2
    assert [h.paused for h in stop.moved] == [pytest.approx(0.5)] * 2
    assert stop.never_paused == 2
    assert describe_rebalances([stop]) == [
        "generation 2, cooperative, 1 member (w2 stopped): 1 task moved, 2 partitions never paused",
        "  a+b[1]: w2 -> w1, paused 0.50 s",
    ]


def test_an_eager_rebalance_pauses_every_partition_from_the_start_of_its_revocation() -> None:
    w1 = log(
        assigned(0, "a[0]", "a[1]", "b[0]", "b[1]"),
        done(0, 1, "eager, leader", 0.1, 4, 0),
        # revoked everything at 5.000 (0.6 s before the end), got a[0], b[0] back
        assigned(5_600, "a[0]", "b[0]"),
        done(5_600, 2, "eager, leader", 0.6, 2, 0),
    )
    w2 = log(
        assigned(5_620, "a[1]", "b[1]"),
        done(5_620, 2, "eager", 0.3, 2, 0),
        restored(5_800, 1, 0.15),
        restored(5_790, 0, 0.1),  # partition 0 is not w2's: not its restore
    )
    _, eager = rebalances([read_worker_log("w1", w1), read_worker_log("w2", w2)])
    assert (eager.generations, eager.cooperative, eager.joined) == ((2,), False, ("w2",))
    assert [(h.tp, h.old, h.why) for h in eager.moved] == [
        (("a", 1), "w1", "eager"),
        (("b", 1), "w1", "eager"),
    ]
    assert [h.paused for h in eager.moved] == [pytest.approx(0.8)] * 2
    assert [h.paused for h in eager.paused_in_place] == [pytest.approx(0.6)] * 2
    assert eager.never_paused == 0
    assert describe_rebalances([eager]) == [
        "generation 2, eager, 2 members (w2 joined): 1 task moved, 2 partitions paused and "
        "stayed (up to 0.60 s), 0 partitions never paused",
        "  a+b[1]: w1 -> w2, paused 0.80 s (restore 0.15 s)",
    ]


def test_unlogged_releases_and_revocations_are_shown_not_guessed() -> None:
    w1 = log(
        assigned(0, "a[0]", "a[1]"),
        done(0, 1, "cooperative, leader", 0.1, 2, 0),
        done(3_000, 2, "cooperative, leader", 0.1, 0, 3),  # says 3 revoked; 2 move
        done(3_500, 3, "cooperative, leader", 0.1, 0, 0),
    )
    w2 = log(
        done(3_000, 2, "cooperative", 0.1, 0, 0),
        assigned(3_400, "a[1]"),
        done(3_400, 3, "cooperative", 0.1, 1, 0),
        assigned(9_000, "a[0]"),  # killed before its round ended: dropped
    )
    w3 = log(assigned(3_450, "a[0]"), done(3_450, 3, "cooperative", 0.1, 1, 0))
    logs = [read_worker_log(w, text) for w, text in (("w1", w1), ("w2", w2), ("w3", w3))]
    assert [len(r.assigned) for r in logs[1].rounds] == [0, 1]
    _, moves = rebalances(logs)
    assert [(h.tp, h.new) for h in moves.moved] == [(("a", 1), "w2"), (("a", 0), "w3")]
    assert [h.paused for h in moves.moved] == [pytest.approx(0.4), pytest.approx(0.45)]
    assert moves.notes == ("w1 revoked 3 partitions, 2 of them assigned again in this rebalance",)
    # w1's stop or loss is not in its log: a partition it still owned has no known pause
    w1_after = log(assigned(0, "a[0]"), done(0, 1, "cooperative, leader", 0.1, 1, 0))
    w2_after = log(assigned(4_000, "a[0]"), done(4_000, 2, "cooperative, leader", 0.1, 1, 0))
    _, unknown = rebalances([read_worker_log("w1", w1_after), read_worker_log("w2", w2_after)])
    assert [(h.old, h.released, h.paused) for h in unknown.moved] == [("w1", None, None)]
    assert describe_rebalances([unknown])[1] == "  a[0]: w1 -> w2, paused ?"
