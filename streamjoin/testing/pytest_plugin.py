"""pytest fixtures for streamjoin users and for our own suite (registered as a pytest11 plugin).

- ``kafka_broker``: a session-scoped real Apache Kafka broker on loopback
  (:class:`~streamjoin.local_kafka.LocalKafka`), or an already running
  loopback broker named by ``STREAMJOIN_KAFKA_BOOTSTRAP`` (e.g. one started with
  ``streamjoin dev-broker``) to skip the JVM start while iterating.
- ``kafka_bootstrap``: its ``host:port``.
- ``kafka_broker_with``: ``kafka_broker_with({"group.initial.rebalance.delay.ms": "3000"})``
  starts (once per session and config) another local broker with those server
  config overrides and returns its ``host:port``; for behaviour that depends on
  broker settings the shared broker cannot change (static configs such as the
  initial rebalance delay). Always a broker of our own, even with
  ``STREAMJOIN_KAFKA_BOOTSTRAP`` set.
- ``kafka_cluster``: a session-scoped real 3-broker cluster on loopback
  (:class:`~streamjoin.local_cluster.LocalKafkaCluster`: ``min.insync.replicas=2``,
  internal topics replicated 3 times). Tests may kill and restart its nodes, but must leave
  it healthy: restart what they stopped and ``wait_until_healthy()`` before returning.
- ``kafka_cluster_factory``: ``kafka_cluster_factory(brokers=3, **options)`` starts a
  cluster of the test's own (stopped at the end of the test), for tests that leave it broken
  or need other settings.
- ``unique_topic``: a factory of topic names unique to the test, so tests on a
  shared broker never see each other's records.
- ``schema_registry_url``: the Confluent-compatible API of a session-scoped real schema
  registry on loopback (:class:`~streamjoin.local_registry.LocalRegistry`, started on first
  use), or of an already running loopback one named by ``STREAMJOIN_SCHEMA_REGISTRY_URL``.
"""

from __future__ import annotations

import itertools
import os
import re
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from streamjoin.errors import KafkaProvisioningError, ProvisioningError
from streamjoin.local_cluster import LocalKafkaCluster
from streamjoin.local_kafka import LocalKafka
from streamjoin.local_registry import LocalRegistry

EXTERNAL_BOOTSTRAP_ENV = "STREAMJOIN_KAFKA_BOOTSTRAP"
_LOOPBACK_HOSTS = ("127.", "localhost", "[::1]", "::1")


def check_loopback_bootstrap(bootstrap: str) -> str:
    """Refuse anything but loopback addresses: tests must never reach another machine."""
    for server in bootstrap.split(","):
        host = server.strip().rsplit(":", 1)[0]
        if not host.startswith(_LOOPBACK_HOSTS):
            raise KafkaProvisioningError(
                f"{EXTERNAL_BOOTSTRAP_ENV}={bootstrap!r}: test brokers must be on loopback "
                f"(127.0.0.0/8, localhost or [::1]); {host!r} is not"
            )
    return bootstrap


class _ExternalBroker:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap_servers = check_loopback_bootstrap(bootstrap)


def topic_name_for(test_name: str, prefix: str, counter: int) -> str:
    """A legal, unique Kafka topic name derived from the test's name."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", test_name).strip("-")[:80]
    return f"{prefix}-{slug}-{counter}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[LocalKafka | _ExternalBroker]:
    """A real Kafka broker for the whole test session."""
    external = os.environ.get(EXTERNAL_BOOTSTRAP_ENV)
    if external:
        yield _ExternalBroker(external)
        return
    with LocalKafka(progress=lambda line: print(f"[streamjoin] {line}", flush=True)) as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: LocalKafka | _ExternalBroker) -> str:
    """``host:port`` of the session's broker."""
    return kafka_broker.bootstrap_servers


@pytest.fixture(scope="session")
def kafka_broker_with() -> Iterator[Callable[[Mapping[str, str]], str]]:
    """A factory of extra local brokers with server config overrides, by config; each is
    started on first use and stopped at the end of the session."""
    started: dict[tuple[tuple[str, str], ...], LocalKafka] = {}

    def broker(overrides: Mapping[str, str]) -> str:
        key = tuple(sorted(overrides.items()))
        if key not in started:
            kafka = LocalKafka(
                overrides=overrides,
                progress=lambda line: print(f"[streamjoin] {line}", flush=True),
            )
            started[key] = kafka.start()
        return started[key].bootstrap_servers

    try:
        yield broker
    finally:
        for kafka in started.values():
            kafka.stop()


def _say(line: str) -> None:
    print(f"[streamjoin] {line}", flush=True)


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalKafkaCluster]:
    """A real 3-broker Kafka cluster for the whole session; tests leave it healthy."""
    with LocalKafkaCluster(brokers=3, progress=_say) as cluster:
        yield cluster


@pytest.fixture
def kafka_cluster_factory() -> Iterator[Callable[..., LocalKafkaCluster]]:
    """``kafka_cluster_factory(brokers=3, **options)``: a started cluster of the test's own
    (options as :class:`LocalKafkaCluster` takes them), stopped when the test ends."""
    started: list[LocalKafkaCluster] = []

    def make(brokers: int = 3, **options: Any) -> LocalKafkaCluster:
        options.setdefault("progress", _say)
        cluster = LocalKafkaCluster(brokers, **options)
        started.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in started:
            cluster.stop()


EXTERNAL_REGISTRY_ENV = "STREAMJOIN_SCHEMA_REGISTRY_URL"


def check_loopback_registry_url(url: str) -> str:
    """Refuse a registry URL that is not ``http(s)://`` on loopback, without a trailing slash."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if not url.startswith(("http://", "https://")) or not host.startswith(_LOOPBACK_HOSTS):
        raise ProvisioningError(
            f"{EXTERNAL_REGISTRY_ENV}={url!r}: the test schema registry must be an http(s) URL "
            f"on loopback (127.0.0.0/8, localhost or [::1]); {host or url!r} is not"
        )
    return url.rstrip("/")


@pytest.fixture(scope="session")
def schema_registry_url() -> Iterator[str]:
    """The Confluent-compatible API (``http://127.0.0.1:<port>/apis/ccompat/v7``) of a real
    schema registry for the whole session; an empty registry when started here."""
    external = os.environ.get(EXTERNAL_REGISTRY_ENV)
    if external:
        yield check_loopback_registry_url(external)
        return
    with LocalRegistry(progress=_say) as registry:
        yield registry.ccompat_url


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> Callable[..., str]:
    """``unique_topic("clicks")`` -> a topic name no other test uses."""
    counter = itertools.count()

    def make(prefix: str = "t") -> str:
        return topic_name_for(request.node.name, prefix, next(counter))

    return make
