"""The local cluster's pure parts, and the replication streamjoin picks for its topics
(with a fake admin client: no broker here)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

import streamjoin
from streamjoin.errors import ConfigurationError, KafkaProvisioningError
from streamjoin.local_cluster import (
    LocalKafkaCluster,
    NodePorts,
    cluster_broker_defaults,
    health_problems,
    parse_cluster_ports,
    render_cluster_ports,
    view_problems,
)
from streamjoin.local_kafka import BrokerSettings, render_server_properties
from streamjoin.runtime.transport import topic_admin
from streamjoin.runtime.transport.topic_admin import (
    TopicReplication,
    TopicSpec,
    creation_config,
    internal_topics,
    replication_for,
    replication_warnings,
)

# --------------------------------------------------------------------------- the cluster


def test_three_nodes_replicate_internal_topics_three_times_with_min_isr_two() -> None:
    defaults = cluster_broker_defaults(3)
    assert defaults["min.insync.replicas"] == "2"
    assert defaults["default.replication.factor"] == "3"
    assert defaults["offsets.topic.replication.factor"] == "3"
    assert defaults["transaction.state.log.replication.factor"] == "3"
    assert defaults["transaction.state.log.min.isr"] == "2"
    assert defaults["group.initial.rebalance.delay.ms"] == "0"


@pytest.mark.parametrize(
    ("brokers", "replicas", "min_isr"), [(1, "1", "1"), (2, "2", "1"), (5, "3", "2")]
)
def test_smaller_and_larger_clusters(brokers: int, replicas: str, min_isr: str) -> None:
    defaults = cluster_broker_defaults(brokers)
    assert defaults["offsets.topic.replication.factor"] == replicas
    assert defaults["min.insync.replicas"] == min_isr


def test_no_cluster_of_zero_brokers() -> None:
    with pytest.raises(KafkaProvisioningError, match="at least 1 broker, got 0"):
        LocalKafkaCluster(brokers=0)


def test_cluster_defaults_reach_each_nodes_properties(tmp_path: Path) -> None:
    settings = BrokerSettings(
        client_port=1,
        internal_port=2,
        controller_port=3,
        log_dir=tmp_path,
        node_id=2,
        quorum={1: 13, 2: 3, 3: 23},
        overrides=cluster_broker_defaults(3),
    )
    text = render_server_properties(settings)
    assert "\nmin.insync.replicas=2\n" in text
    assert "\noffsets.topic.replication.factor=3\n" in text
    assert "\ncontroller.quorum.voters=1@127.0.0.1:13,2@127.0.0.1:3,3@127.0.0.1:23\n" in text


def test_ports_file_round_trip_and_garbage() -> None:
    ports = {1: NodePorts(21001, 21002, 21003), 2: NodePorts(21011, 21012, 21013)}
    assert parse_cluster_ports(render_cluster_ports(ports)) == ports
    for bad in ("", "1 2 3\n", "1 21001 21002 x\n", "1 21001 21002 21003\n2 21001 21012 21013\n"):
        assert parse_cluster_ports(bad) is None


def _metadata(brokers: list[int], partitions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "brokers": [{"node_id": b} for b in brokers],
        "topics": [{"topic": "t", "error_code": 0, "partitions": partitions}],
    }


def _part(p: int, leader: int, replicas: list[int], isr: list[int]) -> dict[str, Any]:
    return {"partition": p, "leader": leader, "replicas": replicas, "isr": isr}


def test_healthy_means_every_broker_and_every_replica_in_sync() -> None:
    healthy = _metadata([1, 2, 3], [_part(0, 1, [1, 2, 3], [3, 2, 1])])
    assert health_problems(healthy, [1, 2, 3]) == []
    assert health_problems(_metadata([1, 3], []), [1, 2, 3]) == ["brokers not registered: [2]"]
    lagging = _metadata([1, 2, 3], [_part(0, 1, [1, 2, 3], [1, 3]), _part(1, -1, [2], [])])
    assert health_problems(lagging, [1, 2, 3]) == [
        "t-0: in sync [1, 3] of [1, 2, 3]",
        "t-1: no leader",
    ]


def test_every_node_must_know_every_broker() -> None:
    views = {1: {1, 2, 3}, 2: {2, 3}, 3: {1, 2, 3, 4}}
    assert view_problems(views, [1, 2, 3]) == ["node 2 sees brokers [2, 3]"]
    assert view_problems({1: {1, 2, 3}}, [1, 2, 3]) == []


def test_coordinator_kind_is_checked() -> None:
    cluster = LocalKafkaCluster(brokers=3)
    with pytest.raises(KafkaProvisioningError, match="'group' or 'transaction', got 'txn'"):
        cluster.coordinator("txn", "k")  # type: ignore[arg-type]


def test_queries_before_start_say_so() -> None:
    cluster = LocalKafkaCluster(brokers=3)
    with pytest.raises(KafkaProvisioningError, match="no node of the local cluster is running"):
        cluster.leader_of("t", 0)
    with pytest.raises(KafkaProvisioningError, match="not started"):
        _ = cluster.bootstrap_servers
    assert not cluster.running


# --------------------------------------------------------------------------- replication


def test_auto_replication_is_min_of_three_and_the_brokers() -> None:
    assert [replication_for("t", None, n) for n in (1, 2, 3, 7)] == [1, 2, 3, 3]
    assert replication_for("t", 2, 3) == 2


def test_more_replicas_than_brokers_names_both_numbers() -> None:
    with pytest.raises(
        ConfigurationError, match=r"'orders': replication factor 3 .* the 1 broker "
    ):
        replication_for("orders", 3, 1)


def test_three_replicas_get_min_isr_two_unless_set() -> None:
    assert creation_config({"cleanup.policy": "compact"}, 3) == {
        "cleanup.policy": "compact",
        "min.insync.replicas": "2",
    }
    assert creation_config({"min.insync.replicas": "3"}, 3) == {"min.insync.replicas": "3"}
    assert creation_config({}, 2) == {}
    assert creation_config({}, 1) == {}


def test_internal_topics_are_changelogs_and_the_apps_repartition_topics() -> None:
    names = ["clicks", "shop-by-user-repartition", "other-x-repartition", "shop-counts-changelog"]
    assert internal_topics("shop", names, ["shop-counts-changelog"]) == {
        "shop-by-user-repartition",
        "shop-counts-changelog",
    }


def test_single_copy_internal_topic_on_three_brokers_warns_once() -> None:
    existing = {
        "a-x-changelog": TopicReplication(1),
        "a-y-repartition": TopicReplication(3, 2),
        "clicks": TopicReplication(1),  # the user's: none of our business
    }
    warnings = replication_warnings(
        existing,
        internal={"a-x-changelog", "a-y-repartition"},
        changelogs={"a-x-changelog"},
        brokers=3,
        exactly_once=False,
    )
    assert len(warnings) == 1
    assert "'a-x-changelog' has replication factor 1 on a cluster of 3 brokers" in warnings[0]
    assert "delete the topic" in warnings[0]
    one_broker = replication_warnings(
        existing, internal=set(existing), changelogs=(), brokers=1, exactly_once=False
    )
    assert one_broker == []


def test_exactly_once_changelog_with_min_isr_one_warns() -> None:
    existing = {"a-x-changelog": TopicReplication(3, 1), "a-y-changelog": TopicReplication(3, 2)}
    kwargs: dict[str, Any] = {"internal": set(existing), "changelogs": set(existing), "brokers": 3}
    assert replication_warnings(existing, exactly_once=False, **kwargs) == []
    [warning] = replication_warnings(existing, exactly_once=True, **kwargs)
    assert warning.startswith("exactly_once: changelog 'a-x-changelog' has 3 replicas")
    assert "--add-config min.insync.replicas=2" in warning


def test_replication_setting_is_auto_by_default_and_checked() -> None:
    app = streamjoin.App("repl-default")
    assert app.config.topic_replication_factor == "auto"
    assert app.topic("clicks").replication_factor is None  # decided at creation
    assert app.topic("orders", replication_factor=2).replication_factor == 2
    assert streamjoin.App("two", topic_replication_factor=2).topic("t").replication_factor == 2
    for bad in (0, "3", 1.5, True):
        with pytest.raises(ConfigurationError, match='topic_replication_factor must be "auto"'):
            streamjoin.App("bad", topic_replication_factor=bad)


class FakeAdmin:
    """Just enough of AIOKafkaAdminClient for ensure_topics and check_replication."""

    brokers: ClassVar[int] = 3
    topics: ClassVar[Mapping[str, dict[str, Any]]] = {}
    configs: ClassVar[Mapping[str, str]] = {}
    created: ClassVar[list[Any]] = []

    def __init__(self, **_: object) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def describe_cluster(self) -> dict[str, Any]:
        return {"brokers": [{"node_id": n} for n in range(1, self.brokers + 1)]}

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        out = []
        for name in names:
            if name in self.topics:
                out.append({"topic": name, "error_code": 0, **self.topics[name]})
            else:
                out.append({"topic": name, "error_code": 3, "partitions": []})
        return out

    async def create_topics(self, new_topics: list[Any]) -> Any:
        type(self).created = list(new_topics)
        for topic in new_topics:
            replicas = list(range(topic.replication_factor))
            parts = [{"partition": p, "replicas": replicas} for p in range(topic.num_partitions)]
            type(self).topics = {**self.topics, topic.name: {"partitions": parts}}

        return SimpleNamespace(topic_errors=[(t.name, 0, None) for t in new_topics])

    async def describe_configs(self, resources: list[Any]) -> list[Any]:
        entries = list(self.configs.items())
        return [SimpleNamespace(resources=[(0, None, 2, r.name, entries) for r in resources])]


@pytest.fixture
def fake_admin(monkeypatch: pytest.MonkeyPatch) -> type[FakeAdmin]:
    monkeypatch.setattr(topic_admin, "AIOKafkaAdminClient", FakeAdmin)
    FakeAdmin.brokers, FakeAdmin.topics, FakeAdmin.configs, FakeAdmin.created = 3, {}, {}, []
    return FakeAdmin


async def test_created_topics_get_the_clusters_replication(fake_admin: type[FakeAdmin]) -> None:
    specs = [
        TopicSpec("a-t-changelog", 2, config={"cleanup.policy": "compact"}),
        TopicSpec("outputs", 2, replication_factor=2),
        TopicSpec("audited", 1, replication_factor=3, config={"min.insync.replicas": "3"}),
    ]
    created = await topic_admin.ensure_topics("127.0.0.1:1", specs)
    assert created == ["a-t-changelog", "outputs", "audited"]
    made = {t.name: (t.replication_factor, t.topic_configs) for t in fake_admin.created}
    assert made == {
        "a-t-changelog": (3, {"cleanup.policy": "compact", "min.insync.replicas": "2"}),
        "outputs": (2, {}),
        "audited": (3, {"min.insync.replicas": "3"}),
    }


async def test_one_broker_gets_one_replica_and_too_many_is_an_error(
    fake_admin: type[FakeAdmin],
) -> None:
    fake_admin.brokers = 1
    await topic_admin.ensure_topics("127.0.0.1:1", [TopicSpec("a-t-changelog", 1)])
    assert [(t.replication_factor, t.topic_configs) for t in fake_admin.created] == [(1, {})]
    with pytest.raises(ConfigurationError, match=r"replication factor 3 is more than the 1 broker"):
        await topic_admin.ensure_topics("127.0.0.1:1", [TopicSpec("x", 1, replication_factor=3)])


async def test_check_replication_reads_replicas_and_min_isr(fake_admin: type[FakeAdmin]) -> None:
    fake_admin.topics = {
        "a-t-changelog": {"partitions": [{"partition": 0, "replicas": [1, 2, 3]}]},
        "a-u-changelog": {"partitions": [{"partition": 0, "replicas": [2]}]},
    }
    fake_admin.configs = {"min.insync.replicas": "1"}
    names = ["a-t-changelog", "a-u-changelog"]
    warnings = await topic_admin.check_replication("127.0.0.1:1", names, names, exactly_once=True)
    assert any("'a-t-changelog' has 3 replicas but min.insync.replicas=1" in w for w in warnings)
    assert any("'a-u-changelog' has replication factor 1 on a cluster of 3" in w for w in warnings)
    assert len(warnings) == 2
    assert await topic_admin.check_replication("127.0.0.1:1", [], [], exactly_once=True) == []


# --------------------------------------------------------------------------- dev-broker


class FakeCluster:
    """Starts at once, then its nodes 'exit' at the first look."""

    made: ClassVar[list[tuple[int, dict[str, Any]]]] = []

    def __init__(self, brokers: int, **options: Any) -> None:
        type(self).made.append((brokers, options))
        self.nodes = {1: SimpleNamespace(running=False, log_file=Path("/x/node-1/broker.log"))}
        self.stopped = False

    def start(self) -> FakeCluster:
        return self

    @property
    def bootstrap_servers(self) -> str:
        return "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"

    @property
    def running(self) -> bool:
        return False

    def stop(self) -> None:
        self.stopped = True


def test_dev_broker_runs_a_cluster_with_brokers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from streamjoin import cli

    monkeypatch.setattr(cli, "LocalKafkaCluster", FakeCluster)
    monkeypatch.setattr(cli.signal, "signal", lambda *_: None)  # keep pytest's Ctrl-C
    FakeCluster.made = []
    result = CliRunner().invoke(
        cli.cli, ["dev-broker", "--brokers", "3", "--data-dir", str(tmp_path)]
    )
    assert "bootstrap servers: 127.0.0.1:1,127.0.0.1:2,127.0.0.1:3" in result.output
    assert "a broker exited unexpectedly; see /x/node-1/broker.log" in result.output
    assert result.exit_code == 1
    [(brokers, options)] = FakeCluster.made
    assert brokers == 3 and options["data_dir"] == tmp_path


def test_dev_broker_port_is_for_one_broker_only() -> None:
    from click.testing import CliRunner

    from streamjoin import cli

    result = CliRunner().invoke(cli.cli, ["dev-broker", "--brokers", "3", "--port", "19092"])
    assert result.exit_code == 2
    assert "--port applies to a single broker" in result.output
