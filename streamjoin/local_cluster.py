"""A real multi-node Apache Kafka (KRaft) cluster on loopback, for fault tests and the demo.

Each node is one :class:`~streamjoin.local_kafka.LocalKafka` process with combined
broker+controller roles; together they form a static quorum of every node (3 voters for 3
nodes), share one cluster id, and each keeps its own data dir and logs
(``<root>/node-<id>/``). Nodes start in parallel, and one node can be killed (SIGKILL),
stopped (SIGTERM) and started again on the same ports and data while the others run.

Questions a fault test asks (who leads this partition, which node is the active controller or
a coordinator, is every partition fully replicated again) go to the nodes' INTERNAL listener
(PLAINTEXT, never proxied) with a short-lived aiokafka client, in a thread of their own: the
API is synchronous and thread-safe; call it through ``asyncio.to_thread`` from async code.

The pure parts (broker defaults for N nodes, the ports file, the health verdict) are plain
functions so they can be unit-tested without a JVM.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

from streamjoin.errors import KafkaProvisioningError
from streamjoin.local_kafka import (
    KAFKA_VERSION,
    BrokerSettings,
    LocalKafka,
    Progress,
    StartedByHand,
    free_port,
    new_cluster_id,
    port_is_free,
    resolve_kafka,
    stored_cluster_id,
)

#: in a kept cluster dir: one line per node, "<node id> <client> <controller> <internal>"
CLUSTER_PORTS_FILE = "ports"
#: the replication factor streamjoin's local clusters give internal topics, at most
MAX_REPLICATION = 3
_T = TypeVar("_T")


def _quiet(_: str) -> None:
    """Default progress sink: say nothing."""


# --------------------------------------------------------------------------- pure helpers


def cluster_broker_defaults(brokers: int) -> dict[str, str]:
    """Server settings for a node of a local ``brokers``-node cluster (merged over the
    single-node defaults): internal topics replicated ``min(3, brokers)`` times, and
    ``min.insync.replicas=2`` once there are 3 replicas, so one broker down never blocks
    acks=all writes while a second failure cannot lose acknowledged ones."""
    if brokers < 1:
        raise KafkaProvisioningError(f"a cluster needs at least 1 broker, got {brokers}")
    replication = min(MAX_REPLICATION, brokers)
    min_isr = 2 if replication >= 3 else 1
    return {
        "default.replication.factor": str(replication),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(replication),
        "transaction.state.log.replication.factor": str(replication),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(replication),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        "unclean.leader.election.enable": "false",
        # A killed broker is fenced (and its partitions get new leaders) after the session
        # timeout: 5 s instead of 9 s keeps fault tests short without fencing a busy node.
        "broker.heartbeat.interval.ms": "1000",
        "broker.session.timeout.ms": "5000",
    }


@dataclass(frozen=True)
class NodePorts:
    """One node's three ports."""

    client: int
    controller: int
    internal: int


def render_cluster_ports(ports: Mapping[int, NodePorts]) -> str:
    return "".join(
        f"{node} {p.client} {p.controller} {p.internal}\n" for node, p in sorted(ports.items())
    )


def parse_cluster_ports(text: str) -> dict[int, NodePorts] | None:
    """The ports file of a kept cluster dir; None when it cannot be read."""
    ports: dict[int, NodePorts] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            return None
        node, client, controller, internal = (int(p) for p in parts)
        ports[node] = NodePorts(client, controller, internal)
    every = [p for n in ports.values() for p in (n.client, n.controller, n.internal)]
    if not ports or len(set(every)) != len(every):
        return None
    return ports


def health_problems(metadata: Mapping[str, Any], expected_brokers: Sequence[int]) -> list[str]:
    """Why a cluster is not healthy, from a Metadata response as a dict (empty: healthy).

    Healthy: every expected broker is registered and unfenced (metadata lists only those),
    and every partition of every topic has a leader and its full replica set in sync.
    """
    problems: list[str] = []
    listed = {b["node_id"] for b in metadata["brokers"]}
    missing = sorted(set(expected_brokers) - listed)
    if missing:
        problems.append(f"brokers not registered: {missing}")
    for topic in metadata["topics"]:
        name = topic["topic"]
        if topic["error_code"] != 0:
            problems.append(f"{name}: error {topic['error_code']}")
            continue
        for part in topic["partitions"]:
            where = f"{name}-{part['partition']}"
            if part["leader"] < 0:
                problems.append(f"{where}: no leader")
            elif set(part["isr"]) != set(part["replicas"]):
                problems.append(f"{where}: in sync {sorted(part['isr'])} of {part['replicas']}")
    return problems


def view_problems(views: Mapping[int, set[int]], expected_brokers: Sequence[int]) -> list[str]:
    """Nodes whose metadata does not list every expected broker yet (a client asking that
    node would see a smaller cluster: "auto" replication would pick fewer replicas)."""
    return [
        f"node {node} sees brokers {sorted(seen)}"
        for node, seen in sorted(views.items())
        if not set(expected_brokers) <= seen
    ]


# --------------------------------------------------------------------------- DescribeQuorum


class _DescribeQuorumResponse_v0(Response):  # type: ignore[misc]
    API_KEY = 55
    API_VERSION = 0
    _REPLICA = CompactArray(
        ("replica_id", Int32), ("log_end_offset", Int64), ("tags", TaggedFields)
    )
    SCHEMA = Schema(
        ("error_code", Int16),
        (
            "topics",
            CompactArray(
                ("topic_name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("error_code", Int16),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("high_watermark", Int64),
                        ("current_voters", _REPLICA),
                        ("observers", _REPLICA),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DescribeQuorumRequest_v0(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 55
    API_VERSION = 0
    RESPONSE_TYPE = _DescribeQuorumResponse_v0
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(
                ("topic_name", CompactString("utf-8")),
                ("partitions", CompactArray(("partition_index", Int32), ("tags", TaggedFields))),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DescribeQuorumRequest(Request[_DescribeQuorumRequest_v0]):  # type: ignore[misc]
    """The KRaft quorum of ``__cluster_metadata``: a broker forwards it to the controller.
    (Metadata's ``controller_id`` is a random broker under KRaft, so it cannot say.)"""

    API_KEY = 55

    def build(self, request_struct_class: type[_DescribeQuorumRequest_v0]) -> Any:
        return request_struct_class([("__cluster_metadata", [(0, {})], {})], {})


# --------------------------------------------------------------------------- the cluster


def _run_in_thread(factory: Callable[[], Awaitable[_T]], timeout: float) -> _T:
    """Run a coroutine in a fresh event loop in its own thread: usable from sync code, from
    ``asyncio.to_thread`` and from inside a running loop alike."""
    outcome: list[_T] = []
    failure: list[BaseException] = []

    async def bounded() -> _T:
        return await asyncio.wait_for(factory(), timeout)

    def run() -> None:
        try:
            outcome.append(asyncio.run(bounded()))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="kafka-cluster-query", daemon=True)
    thread.start()
    thread.join(timeout + 10)
    if failure:
        raise failure[0]
    if not outcome:
        raise KafkaProvisioningError(f"cluster query did not finish within {timeout:.0f}s")
    return outcome[0]


class LocalKafkaCluster(StartedByHand):
    """``brokers`` KRaft nodes (combined broker+controller, all voters) on loopback.

    ``with LocalKafkaCluster(brokers=3) as cluster: cluster.bootstrap_servers``;
    ``async with`` works too. ``advertise``, ``client_protocol``, ``overrides`` and
    ``format_args`` mean what they mean on :class:`LocalKafka`, for every node.
    """

    def __init__(
        self,
        brokers: int = 3,
        *,
        version: str = KAFKA_VERSION,
        cache_dir: Path | None = None,
        data_dir: Path | None = None,
        overrides: Mapping[str, str] | None = None,
        advertise: Callable[[int, int], int] | None = None,
        client_protocol: str = "PLAINTEXT",
        format_args: Sequence[str] = (),
        startup_timeout: float = 120.0,
        shutdown_timeout: float = 20.0,
        heap: str = "448m",
        fast_start: bool = True,
        progress: Progress = _quiet,
    ) -> None:
        self.defaults = cluster_broker_defaults(brokers)
        self.brokers = brokers
        self.version = version
        self.cache_dir = cache_dir
        self._requested_data_dir = data_dir
        self._overrides = {**self.defaults, **(overrides or {})}
        self._advertise = advertise
        self._client_protocol = client_protocol
        self._format_args = list(format_args)
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
        self.heap = heap
        self.fast_start = fast_start
        self._progress = progress
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self.root: Path | None = None
        self._nodes: dict[int, LocalKafka] = {}

    # -- public

    @property
    def nodes(self) -> Mapping[int, LocalKafka]:
        """The nodes by node id (1..brokers): each has ``kill()``, ``stop()``, ``start()``,
        ``running``, ``log_file``."""
        return MappingProxyType(self._nodes)

    @property
    def bootstrap_servers(self) -> str:
        """Every node's CLIENT address (advertised), comma separated."""
        if not self._nodes:
            raise KafkaProvisioningError("the local cluster is not started; call start() first")
        return ",".join(self._settings(n).bootstrap_servers for n in sorted(self._nodes))

    @property
    def internal_bootstrap_servers(self) -> str:
        """Every node's INTERNAL (PLAINTEXT, unproxied) address, comma separated."""
        if not self._nodes:
            raise KafkaProvisioningError("the local cluster is not started; call start() first")
        return ",".join(self._settings(n).internal_bootstrap_servers for n in sorted(self._nodes))

    @property
    def running(self) -> bool:
        return bool(self._nodes) and all(node.running for node in self._nodes.values())

    def start(self) -> LocalKafkaCluster:
        """Start every node in parallel and wait until each answers over INTERNAL."""
        if self._nodes:
            raise KafkaProvisioningError("the local cluster is already started")
        started = time.monotonic()
        resolve_kafka(self.version, self.cache_dir, self._progress)  # once, not per node
        root = self._make_root()
        kept = self._requested_data_dir is not None
        attempts = 1 if kept else 2  # a port taken between our probe and the bind: new ports
        for attempt in range(1, attempts + 1):
            self._nodes = self._make_nodes(root, self._choose_ports(root, first=attempt == 1))
            try:
                self._start_all(list(self._nodes.values()))
                break
            except KafkaProvisioningError as exc:
                self._stop_nodes()
                self._nodes = {}
                if attempt == attempts:
                    self._cleanup()
                    raise
                self._progress(f"cluster start failed ({exc}); retrying with new ports")
                for node_dir in root.glob("node-*"):
                    shutil.rmtree(node_dir, ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        # every node answers now, but may not know every other one yet: a topic created
        # then would get fewer replicas than the cluster has brokers
        try:
            self.wait_until_healthy(self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        if kept:
            (root / CLUSTER_PORTS_FILE).write_text(render_cluster_ports(self._ports()))
        self._progress(
            f"Kafka cluster of {self.brokers} ready at {self.bootstrap_servers} in "
            f"{time.monotonic() - started:.1f}s"
        )
        return self

    def stop(self) -> None:
        """Stop every node and remove a temporary root. Kept data (``data_dir``) gets a
        controlled shutdown (SIGTERM, in parallel; about 10 s for 3 nodes); data about to be
        removed is not worth it: SIGKILL (unless a JVM is to write the class data archive)."""
        if self._tmpdir is not None and not any(
            n.writes_class_data_archive for n in self._nodes.values()
        ):
            for node in self._nodes.values():
                node.kill()
        self._stop_nodes()
        self._nodes = {}
        self._cleanup()

    def start_stopped(self) -> list[int]:
        """Start every node that is not running, in parallel; returns their ids. A node is
        ready only once a quorum runs: after stopping a majority (the whole cluster down),
        start them together with this rather than one ``node.start()`` after another."""
        stopped = sorted(n for n, node in self._nodes.items() if not node.running)
        if stopped:
            self._start_all([self._nodes[n] for n in stopped])
        return stopped

    def leader_of(self, topic: str, partition: int, timeout: float = 30.0) -> int:
        """Node id of the partition's leader, as the cluster's metadata says now."""
        metadata = self._metadata([topic], timeout)
        for entry in metadata["topics"]:
            if entry["error_code"] != 0:
                raise KafkaProvisioningError(
                    f"metadata for topic {topic!r} failed with error code {entry['error_code']}"
                )
            for part in entry["partitions"]:
                if part["partition"] == partition:
                    if part["leader"] < 0:
                        raise KafkaProvisioningError(f"{topic}-{partition} has no leader now")
                    return int(part["leader"])
        raise KafkaProvisioningError(f"{topic}-{partition} is not in the cluster's metadata")

    def replicas_of(self, topic: str, partition: int, timeout: float = 30.0) -> list[int]:
        """Node ids of the partition's replicas (its replication factor is their count)."""
        for entry in self._metadata([topic], timeout)["topics"]:
            for part in entry["partitions"]:
                if part["partition"] == partition:
                    return list(part["replicas"])
        raise KafkaProvisioningError(f"{topic}-{partition} is not in the cluster's metadata")

    def active_controller(self, timeout: float = 30.0) -> int:
        """Node id of the active KRaft controller (the leader of ``__cluster_metadata``)."""

        async def ask() -> int:
            async def describe(client: Any, node: int) -> int:
                response = await client.send(node, _DescribeQuorumRequest())
                obj = response.to_object()
                part = obj["topics"][0]["partitions"][0]
                if obj["error_code"] or part["error_code"] or part["leader_id"] < 0:
                    raise KafkaProvisioningError(f"no active controller now: {obj}")
                return int(part["leader_id"])

            return await self._with_client(describe)

        return _run_in_thread(ask, timeout)

    def coordinator(
        self, kind: Literal["group", "transaction"], key: str, timeout: float = 30.0
    ) -> int:
        """Node id of the group coordinator of group ``key``, or of the transaction
        coordinator of transactional id ``key`` (FindCoordinator)."""
        from aiokafka.client import CoordinationType

        if kind not in ("group", "transaction"):
            raise KafkaProvisioningError(
                f"coordinator kind must be 'group' or 'transaction', got {kind!r}"
            )
        kind_code = CoordinationType.GROUP if kind == "group" else CoordinationType.TRANSACTION

        async def ask() -> int:
            async def lookup(client: Any, _node: int) -> int:
                from aiokafka.errors import KafkaError

                while True:  # the first lookup creates __transaction_state: not there yet
                    try:
                        return int(await client.coordinator_lookup(kind_code, key))
                    except KafkaError as exc:
                        if not exc.retriable:
                            raise
                    await asyncio.sleep(0.2)

            return await self._with_client(lookup)

        return _run_in_thread(ask, timeout)

    def health_problems(self, timeout: float = 30.0) -> list[str]:
        """Why the cluster is not healthy now (empty: healthy); see :func:`health_problems`."""
        down = sorted(n for n, node in self._nodes.items() if not node.running)
        if down:
            return [f"nodes not running: {down}"]
        expected = sorted(self._nodes)
        views = self._brokers_seen_by_each(timeout)
        return view_problems(views, expected) + health_problems(
            self._metadata(None, timeout), expected
        )

    def wait_until_healthy(self, timeout: float = 60.0) -> None:
        """Until every node runs, is registered, and no partition is under-replicated."""
        deadline = time.monotonic() + timeout
        problems: list[str] = []
        while True:
            try:
                problems = self.health_problems(timeout=max(1.0, deadline - time.monotonic()))
            except Exception as exc:  # a node still starting, a query timing out: try again
                problems = [f"{type(exc).__name__}: {exc}"]
            if not problems:
                return
            if time.monotonic() > deadline:
                raise KafkaProvisioningError(
                    f"the cluster is not healthy after {timeout:.0f}s: " + "; ".join(problems[:10])
                )
            time.sleep(0.25)

    # -- internals

    def _settings(self, node_id: int) -> BrokerSettings:
        settings = self._nodes[node_id].settings
        if settings is None:
            raise KafkaProvisioningError("the local cluster is not started; call start() first")
        return settings

    def _make_root(self) -> Path:
        if self._requested_data_dir is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="streamjoin-cluster-")
            self.root = Path(self._tmpdir.name)
        else:
            self.root = self._requested_data_dir
            self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    def _choose_ports(self, root: Path, *, first: bool) -> dict[int, NodePorts]:
        """A kept cluster's previous ports when all are free again, else free ones."""
        node_ids = range(1, self.brokers + 1)
        if first:
            try:
                saved = parse_cluster_ports((root / CLUSTER_PORTS_FILE).read_text())
            except OSError:
                saved = None
            if saved is not None and sorted(saved) == list(node_ids):
                every = [p for n in saved.values() for p in (n.client, n.controller, n.internal)]
                if all(port_is_free(p) for p in every):
                    return saved
        taken: set[int] = set()

        def pick() -> int:
            port = free_port(exclude=frozenset(taken))
            taken.add(port)
            return port

        return {node: NodePorts(pick(), pick(), pick()) for node in node_ids}

    def _make_nodes(self, root: Path, ports: Mapping[int, NodePorts]) -> dict[int, LocalKafka]:
        cluster_id = stored_cluster_id(root / "node-1" / "data")
        if cluster_id is None:
            cluster_id = new_cluster_id()
        quorum = {node: p.controller for node, p in ports.items()}
        return {
            node: LocalKafka(
                version=self.version,
                cache_dir=self.cache_dir,
                data_dir=root / f"node-{node}",
                broker_port=p.client,
                internal_port=p.internal,
                controller_port=p.controller,
                overrides=self._overrides,
                advertise=self._advertise,
                client_protocol=self._client_protocol,
                format_args=self._format_args,
                node_id=node,
                quorum=quorum,
                cluster_id=cluster_id,
                startup_timeout=self.startup_timeout,
                shutdown_timeout=self.shutdown_timeout,
                heap=self.heap,
                fast_start=self.fast_start,
                progress=self._node_progress(node),
            )
            for node, p in ports.items()
        }

    def _node_progress(self, node: int) -> Progress:
        def say(line: str) -> None:
            self._progress(f"node {node}: {line}")

        return say

    def _ports(self) -> dict[int, NodePorts]:
        out = {}
        for node in self._nodes:
            s = self._settings(node)
            out[node] = NodePorts(s.client_port, s.controller_port, s.internal_port)
        return out

    def _start_all(self, nodes: list[LocalKafka]) -> None:
        """Start nodes in parallel (a node is ready only once a quorum of them runs)."""
        with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="kafka-node") as pool:
            futures = [pool.submit(node.start) for node in nodes]
            errors = [f.exception() for f in futures]
        failures = [e for e in errors if e is not None]
        if failures:
            first = failures[0]
            if isinstance(first, KafkaProvisioningError):
                raise first
            raise KafkaProvisioningError(f"starting a cluster node failed: {first!r}") from first

    def _stop_nodes(self) -> None:
        nodes = [n for n in self._nodes.values() if n.running]
        if not nodes:
            return
        with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="kafka-stop") as pool:
            list(pool.map(lambda n: n.stop(), nodes))

    def _cleanup(self) -> None:
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def _running_internal(self) -> list[tuple[int, str]]:
        running = [
            (node_id, self._settings(node_id).internal_bootstrap_servers)
            for node_id, node in sorted(self._nodes.items())
            if node.running
        ]
        if not running:
            raise KafkaProvisioningError("no node of the local cluster is running")
        return running

    async def _with_client(self, ask: Callable[[Any, int], Awaitable[_T]]) -> _T:
        """``ask(client, node id)`` with a client bootstrapped from one running node's
        INTERNAL listener (the next one when a node does not answer)."""
        from aiokafka import AIOKafkaClient
        from aiokafka.errors import KafkaError

        last: BaseException | None = None
        for node_id, address in self._running_internal():
            client = AIOKafkaClient(bootstrap_servers=address, request_timeout_ms=5000)
            try:
                await client.bootstrap()
                return await ask(client, node_id)
            except (KafkaError, OSError, KafkaProvisioningError) as exc:
                last = exc
            finally:
                await client.close()
        raise KafkaProvisioningError(f"no running node of the cluster answered: {last!r}")

    def _brokers_seen_by_each(self, timeout: float) -> dict[int, set[int]]:
        """The brokers each running node's metadata lists (a node that just started, or the
        one a client happens to ask, may not know every other one yet)."""
        from aiokafka import AIOKafkaClient
        from aiokafka.protocol.metadata import MetadataRequest

        async def ask() -> dict[int, set[int]]:
            views: dict[int, set[int]] = {}
            for node_id, address in self._running_internal():
                client = AIOKafkaClient(bootstrap_servers=address, request_timeout_ms=5000)
                try:
                    await client.bootstrap()
                    response = await client.send(node_id, MetadataRequest(topics=[]))
                    views[node_id] = {b["node_id"] for b in response.to_object()["brokers"]}
                finally:
                    await client.close()
            return views

        return _run_in_thread(ask, timeout)

    def _metadata(self, topics: list[str] | None, timeout: float) -> dict[str, Any]:
        from aiokafka.protocol.metadata import MetadataRequest

        async def ask() -> dict[str, Any]:
            async def fetch(client: Any, node: int) -> dict[str, Any]:
                request = MetadataRequest(topics=topics, allow_auto_topic_creation=False)
                response = await client.send(node, request)
                return dict(response.to_object())

            return await self._with_client(fetch)

        return _run_in_thread(ask, timeout)
