"""The foreign-key join: its pure core against a brute-force join under every delivery order
the topics permit, and its declaration through the in-memory test driver."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.errors import AgentFailed, ConfigurationError, CorruptJoinState
from streamjoin.joins.foreign_key import (
    ForeignKeyHow,
    Outcome,
    parse_response,
    parse_subscription,
    plan_left_change,
    response_message,
    response_outcome,
    response_to,
    split_subscription_key,
    subscribe_message,
    subscribers_range,
    subscription_key,
    unsubscribe_message,
    value_hash,
)
from streamjoin.partitioner import partition_for_key
from streamjoin.testing.driver import TestDriver

# ---------------------------------------------------------------- the pieces


def test_subscription_keys_split_back_and_one_foreign_keys_range_holds_only_its_own() -> None:
    keys = [b"", b"a", b"ab", b"a\xff", b"\xff", b"\xff\xff", b"b"]
    subs = sorted(subscription_key(fk, lk) for fk in keys for lk in keys)
    for fk in keys:
        start, end = subscribers_range(fk)
        inside = [k for k in subs if start <= k < end]
        assert inside == sorted(subscription_key(fk, lk) for lk in keys)
        assert all(split_subscription_key(k)[0] == fk for k in inside)
    assert split_subscription_key(subscription_key(b"fk", b"left")) == (b"fk", b"left")


def test_messages_round_trip_and_malformed_ones_are_named() -> None:
    digest = value_hash(b"order")
    stored = parse_subscription(subscribe_message(digest, 7))
    assert stored is not None and stored[:16] == digest
    assert parse_subscription(unsubscribe_message()) is None
    assert parse_response(response_message(digest, b"right")) == (digest, b"right")
    assert parse_response(response_message(digest, b"")) == (digest, b"")  # empty, not absent
    assert parse_response(response_message(digest, None)) == (digest, None)
    assert response_to(subscription_key(b"c1", b"o1"), stored, None) == (
        b"o1",
        7,
        response_message(digest, None),
    )
    for bad in (None, b"", b"S" + digest, b"X" + digest + bytes(4)):
        with pytest.raises(CorruptJoinState, match="not a subscription"):
            parse_subscription(bad)
    with pytest.raises(CorruptJoinState, match="not a response"):
        parse_response(b"\x02" + digest)
    with pytest.raises(CorruptJoinState, match="shorter"):
        split_subscription_key(b"\x00\x00\x00\x09ab")


@pytest.mark.parametrize("how", ["inner", "left"])
def test_left_changes(how: ForeignKeyHow) -> None:
    # a new row subscribes and waits for its response
    plan = plan_left_change(None, b"v", b"A", how)
    assert (plan.unsubscribe, plan.subscribe, plan.outcome) == (None, b"A", Outcome.KEEP)
    # same foreign key, new value: subscribes again (the response must carry the new hash)
    plan = plan_left_change(b"A", b"v2", b"A", how)
    assert (plan.unsubscribe, plan.subscribe, plan.outcome) == (None, b"A", Outcome.KEEP)
    # foreign key changed: the old subscription goes
    plan = plan_left_change(b"A", b"v3", b"B", how)
    assert (plan.unsubscribe, plan.subscribe, plan.outcome) == (b"A", b"B", Outcome.KEEP)
    # deleted: the result goes at once
    plan = plan_left_change(b"B", None, None, how)
    assert (plan.unsubscribe, plan.subscribe, plan.outcome) == (b"B", None, Outcome.DELETE)
    # a null foreign key: no response will come; a left join joins with no right row
    plan = plan_left_change(b"B", b"v4", None, how)
    null_fk = Outcome.JOIN if how == "left" else Outcome.DELETE
    assert (plan.unsubscribe, plan.subscribe, plan.outcome) == (b"B", None, null_fk)


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_response_applies_only_to_the_value_it_was_computed_for(how: ForeignKeyHow) -> None:
    old, new = b"order v1", b"order v2"
    assert response_outcome(new, value_hash(old), b"c", how) is Outcome.KEEP  # stale
    assert response_outcome(None, value_hash(old), b"c", how) is Outcome.KEEP  # row deleted
    assert response_outcome(new, value_hash(new), b"c", how) is Outcome.JOIN
    missing = Outcome.DELETE if how == "inner" else Outcome.JOIN
    assert response_outcome(new, value_hash(new), None, how) is missing


# ---------------------------------------------------------------- a brute-force model


def foreign_key_of(value: bytes) -> bytes | None:
    """Test left values are ``b"<fk>:<version>"``; ``-`` is a null foreign key."""
    fk = value.split(b":")[0]
    return None if fk == b"-" else fk


@dataclass
class Model:
    """The join's partitions and topics in memory, driven by the pure core: each queue is
    one topic partition (read in order by one task); which queue moves next is chosen by
    the test, so every interleaving across partitions can happen."""

    how: ForeignKeyHow
    left_partitions: int
    right_partitions: int
    #: the responses' hash check (off only to show the tests notice its absence)
    check_hash: bool = True
    left: dict[bytes, bytes] = field(default_factory=dict)
    right: dict[bytes, bytes] = field(default_factory=dict)
    foreign_keys: dict[bytes, bytes] = field(default_factory=dict)
    subscriptions: dict[bytes, bytes] = field(default_factory=dict)
    result: dict[bytes, tuple[bytes, bytes | None]] = field(default_factory=dict)
    emitted: list[tuple[bytes, tuple[bytes, bytes | None] | None]] = field(default_factory=list)
    queues: dict[tuple[str, int], deque[tuple[bytes, bytes | None]]] = field(default_factory=dict)

    def send(self, topic: str, partition: int, key: bytes, value: bytes | None) -> None:
        self.queues.setdefault((topic, partition), deque()).append((key, value))

    def write(self, side: str, key: bytes, value: bytes | None) -> None:
        """An input record, to its topic's partition."""
        count = self.left_partitions if side == "left" else self.right_partitions
        self.send(side, partition_for_key(key, count), key, value)

    def ready(self) -> list[tuple[str, int]]:
        return sorted(q for q, records in self.queues.items() if records)

    def step(self, queue: tuple[str, int]) -> None:
        topic, partition = queue
        key, value = self.queues[queue].popleft()
        getattr(self, f"_on_{topic}")(partition, key, value)

    def _on_left(self, partition: int, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.left.pop(key, None)
        else:
            self.left[key] = value
        new_fk = None if value is None else foreign_key_of(value)
        plan = plan_left_change(self.foreign_keys.get(key), value, new_fk, self.how)
        if plan.unsubscribe is not None:
            self._subscribe(plan.unsubscribe, key, unsubscribe_message())
        if plan.subscribe is not None and value is not None:
            self._subscribe(plan.subscribe, key, subscribe_message(value_hash(value), partition))
        if new_fk is None:
            self.foreign_keys.pop(key, None)
        else:
            self.foreign_keys[key] = new_fk
        self._settle(key, plan.outcome, value, None)

    def _subscribe(self, fk: bytes, left_key: bytes, message: bytes) -> None:
        target = partition_for_key(fk, self.right_partitions)
        self.send("subscription", target, subscription_key(fk, left_key), message)

    def _on_subscription(self, partition: int, key: bytes, value: bytes | None) -> None:
        fk, _ = split_subscription_key(key)
        assert partition_for_key(fk, self.right_partitions) == partition
        stored = parse_subscription(value)
        if stored is None:
            self.subscriptions.pop(key, None)
            return
        self.subscriptions[key] = stored
        self.send("response", *self._routed(response_to(key, stored, self.right.get(fk))))

    def _on_right(self, partition: int, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.right.pop(key, None)
        else:
            self.right[key] = value
        start, end = subscribers_range(key)
        subscribers = [(k, v) for k, v in sorted(self.subscriptions.items()) if start <= k < end]
        # the range holds exactly this foreign key's subscriptions
        assert [k for k, _ in subscribers] == sorted(
            k for k in self.subscriptions if split_subscription_key(k)[0] == key
        )
        for sub_key, stored in subscribers:
            self.send("response", *self._routed(response_to(sub_key, stored, value)))

    @staticmethod
    def _routed(response: tuple[bytes, int, bytes]) -> tuple[int, bytes, bytes]:
        left_key, partition, message = response
        return partition, left_key, message

    def _on_response(self, partition: int, key: bytes, value: bytes | None) -> None:
        assert partition_for_key(key, self.left_partitions) == partition
        left_hash, right = parse_response(value)
        current = self.left.get(key)
        if not self.check_hash and current is not None:
            left_hash = value_hash(current)
        self._settle(key, response_outcome(current, left_hash, right, self.how), current, right)

    def _settle(
        self, key: bytes, outcome: Outcome, left: bytes | None, right: bytes | None
    ) -> None:
        if outcome is Outcome.KEEP:
            return
        joined = (left, right) if outcome is Outcome.JOIN and left is not None else None
        if self.result.get(key) == joined:
            return
        if joined is None:
            del self.result[key]
        else:
            self.result[key] = joined
        self.emitted.append((key, joined))

    def brute_force(self) -> dict[bytes, tuple[bytes, bytes | None]]:
        """The join of the final tables, computed directly."""
        joined: dict[bytes, tuple[bytes, bytes | None]] = {}
        for key, value in self.left.items():
            fk = foreign_key_of(value)
            right = None if fk is None else self.right.get(fk)
            if right is not None or self.how == "left":
                joined[key] = (value, right)
        return joined


LEFT_KEYS = [b"o1", b"o2", b"o3", b"o4", b"o5"]
FOREIGN_KEYS = [b"c1", b"c4", b"c3", b"c4", b"-"]

left_writes = st.tuples(
    st.just("left"),
    st.sampled_from(LEFT_KEYS),
    st.one_of(st.none(), st.sampled_from(FOREIGN_KEYS)),  # None: a delete
)
right_writes = st.tuples(
    st.just("right"),
    st.sampled_from(FOREIGN_KEYS[:-1]),
    st.one_of(st.none(), st.just(b"")),  # None: a delete
)
histories = st.lists(st.one_of(left_writes, right_writes), min_size=1, max_size=40)


def run(
    model: Model, history: list[tuple[str, bytes, bytes | None]], pick: Callable[[int], int]
) -> None:
    """Write ``history`` (versions numbered in order) and deliver everything, ``pick``
    choosing which ready partition moves next."""
    for version, (side, key, target) in enumerate(history):
        if side == "left":
            value = None if target is None else target + b":%d" % version
        else:
            value = None if target is None else b"right:%d" % version
        model.write(side, key, value)
    while ready := model.ready():
        model.step(ready[pick(len(ready))])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=histories,
    how=st.sampled_from(["inner", "left"]),
    left_partitions=st.integers(1, 3),
    right_partitions=st.integers(1, 4),
    data=st.data(),
)
def test_the_join_ends_equal_to_the_brute_force_join_whatever_the_delivery_order(
    history: list[tuple[str, bytes, bytes | None]],
    how: ForeignKeyHow,
    left_partitions: int,
    right_partitions: int,
    data: st.DataObject,
) -> None:
    model = Model(how, left_partitions, right_partitions)
    run(model, history, lambda n: data.draw(st.integers(0, n - 1)))
    assert model.result == model.brute_force()
    # what was sent tells the same story: each row's last change is its final result
    last = dict(model.emitted)
    assert {k: v for k, v in last.items() if v is not None} == model.result
    # no subscription outlives its row's foreign key
    subscribed = {split_subscription_key(k)[::-1] for k in model.subscriptions}
    assert subscribed == set(model.foreign_keys.items())


@pytest.mark.parametrize("check_hash", [True, False])
def test_a_stale_response_arriving_last_is_dropped(check_hash: bool) -> None:
    """o1 moves from c1 to c4; c4's answer arrives before c1's (a partition of the
    subscription topic was slower): only the hash check keeps c1's answer out."""
    # c1 and c4 on different right partitions, so their responses can pass each other
    assert partition_for_key(b"c1", 2) != partition_for_key(b"c4", 2)
    model = Model("inner", 1, 2, check_hash=check_hash)
    model.write("right", b"c1", b"ann")
    model.write("right", b"c4", b"bob")
    model.write("left", b"o1", b"c1:1")
    model.write("left", b"o1", b"c4:2")
    for queue in [("right", partition_for_key(b"c1", 2)), ("right", partition_for_key(b"c4", 2))]:
        model.step(queue)
    model.step(("left", 0))
    model.step(("left", 0))
    c4 = ("subscription", partition_for_key(b"c4", 2))
    c1 = ("subscription", partition_for_key(b"c1", 2))
    model.step(c4)  # c4 answers first
    model.step(c1)  # c1's subscription, then its unsubscription
    model.step(c1)
    while model.ready():
        model.step(model.ready()[0])
    if check_hash:
        assert model.result == model.brute_force() == {b"o1": (b"c4:2", b"bob")}
    else:
        assert model.result == {b"o1": (b"c4:2", b"ann")}  # the stale answer won


# ---------------------------------------------------------------- the declaration


def orders_app(
    how: str = "inner", guarantee: str = "at_least_once"
) -> tuple[streamjoin.App, list[tuple[Any, Any, Any]]]:
    """Orders (3 partitions) joined to customers (2) by ``order["customer"]``."""
    app = streamjoin.App("fk-unit", processing_guarantee=guarantee)
    orders = app.topic("orders", key_serializer="str", partitions=3)
    customers = app.topic("customers", key_serializer="str", partitions=2)
    out = app.topic("enriched", key_serializer="str", partitions=3)
    calls: list[tuple[Any, Any, Any]] = []

    @app.join(
        app.topic_table(orders),
        app.topic_table(customers),
        foreign_key=lambda order: order["customer"],
        how=how,
        output=out,
        name="enriched",
    )
    def enrich(key: Any, order: Any, customer: Any) -> Any:
        calls.append((key, order, customer))
        return {"n": order["n"], "customer": None if customer is None else customer["name"]}

    return app, calls


def test_the_declaration_partitions_its_topics_like_the_sides_they_serve() -> None:
    app, _ = orders_app()
    assert app.topics["fk-unit-enriched-subscription"].partitions == 2
    assert app.topics["fk-unit-enriched-response"].partitions == 3
    assert {"enriched", "enriched-subscriptions", "enriched-foreign-keys"} <= set(app.tables)
    assert {"enriched.subscriptions", "enriched.responses"} <= set(app.agents)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("how", ["inner", "left"])
async def test_orders_follow_their_customers_through_changes_and_deletes(
    how: str, guarantee: str
) -> None:
    """Every change of a result is sent (None: the row is gone); under at-least-once an
    inner join's deletes are sent even when no row was there (a crash may have lost the
    row from the table after it was sent: see foreign_key_api._settle)."""
    app, _ = orders_app(how, guarantee)
    async with TestDriver(app) as driver:

        async def put(topic: str, key: str, value: Any) -> None:
            await driver.put(topic, key=key, value=value)
            await driver.drain()

        await put("customers", "c1", {"name": "ann"})
        await put("orders", "o1", {"customer": "c1", "n": 1})
        await put("orders", "o2", {"customer": "c9", "n": 2})  # no such customer
        await put("customers", "c1", {"name": "ann b."})  # every subscriber recomputed
        await put("orders", "o1", {"customer": "c2", "n": 3})  # moves to a missing customer
        await put("customers", "c1", {"name": "gone"})  # o1 no longer follows c1
        await put("customers", "c2", {"name": "bob"})
        await put("orders", "o3", {"customer": None, "n": 4})  # a null foreign key
        await put("customers", "c2", None)  # right side deleted
        await put("orders", "o2", None)  # left side deleted
        values = [(e.key, e.value) for e in driver.records("enriched")]
    inner = [
        ("o1", {"n": 1, "customer": "ann"}),
        ("o1", {"n": 1, "customer": "ann b."}),
        ("o1", None),
        ("o1", {"n": 3, "customer": "bob"}),
        ("o1", None),
    ]
    left = [
        ("o1", {"n": 1, "customer": "ann"}),
        ("o2", {"n": 2, "customer": None}),
        ("o1", {"n": 1, "customer": "ann b."}),
        ("o1", {"n": 3, "customer": None}),
        ("o1", {"n": 3, "customer": "bob"}),
        ("o3", {"n": 4, "customer": None}),
        ("o1", {"n": 3, "customer": None}),
        ("o2", None),
    ]
    if how == "inner" and guarantee == "at_least_once":
        # o2 joins a missing customer, o3 has no customer, o2 is deleted
        inner += [("o2", None), ("o3", None), ("o2", None)]
    expected = inner if how == "inner" else left

    def by_key(changes: list[tuple[Any, Any]]) -> dict[Any, list[Any]]:
        """Each key's changes in order (the output's partitions interleave them)."""
        out: dict[Any, list[Any]] = {}
        for key, value in changes:
            out.setdefault(key, []).append(value)
        return out

    assert by_key(values) == by_key(expected)


def test_a_foreign_key_join_is_inner_or_left_of_two_topic_tables() -> None:
    app = streamjoin.App("fk-unit")
    orders = app.topic_table(app.topic("orders", key_serializer="str"))
    customers = app.topic_table(app.topic("customers", key_serializer="str"))
    plain = app.table("plain")
    events = app.topic("events")

    def fun(key: Any, left: Any, right: Any) -> Any:
        return left

    with pytest.raises(ConfigurationError, match="inner or left, not 'outer'"):
        app.join(orders, customers, foreign_key=lambda o: o, how="outer")(fun)
    with pytest.raises(ConfigurationError, match="tables read from topics"):
        app.join(orders, plain, foreign_key=lambda o: o, name="j2")(fun)
    with pytest.raises(ConfigurationError, match="joins two tables"):
        app.join(events, customers, foreign_key=lambda o: o, name="j3")(fun)
    with pytest.raises(ConfigurationError, match="a function of the left value"):
        app.join(orders, customers, foreign_key="customer", name="j4")(fun)  # type: ignore[arg-type]


async def test_a_table_joined_to_itself_follows_each_rows_manager() -> None:
    """A self-join (each person to their manager, another row of the same table): a row is
    both a subscriber and subscribed to."""
    app = streamjoin.App("fk-unit", processing_guarantee="exactly_once")
    people = app.topic("people", key_serializer="str", partitions=3)
    out = app.topic("with-manager", key_serializer="str", partitions=3)
    table = app.topic_table(people)

    @app.join(
        table,
        table,
        foreign_key=lambda person: person.get("manager"),
        how="left",
        output=out,
        name="with-manager",
    )
    def manager_of(key: Any, person: Any, manager: Any) -> Any:
        return {"name": person["name"], "manager": None if manager is None else manager["name"]}

    async with TestDriver(app) as driver:
        for key, value in [
            ("a", {"name": "ann"}),
            ("b", {"name": "bob", "manager": "a"}),
            ("c", {"name": "cy", "manager": "b"}),
            ("a", {"name": "ann 2"}),
            ("b", {"name": "bob", "manager": "c"}),
        ]:
            await driver.put("people", key=key, value=value)
            await driver.drain()
        final = {e.key: e.value for e in driver.records("with-manager")}
    assert final == {
        "a": {"name": "ann 2", "manager": None},
        "b": {"name": "bob", "manager": "cy"},
        "c": {"name": "cy", "manager": "bob"},
    }


async def test_a_failing_foreign_key_function_stops_the_worker_naming_the_join_and_key() -> None:
    app, _ = orders_app()
    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value={"no customer field": 1})
        with pytest.raises(
            AgentFailed,
            match=r"JoinError: join 'enriched': foreign_key failed on .* 'o1': KeyError",
        ):
            await driver.drain()
