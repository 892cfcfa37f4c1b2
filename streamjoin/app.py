"""The App: the friendly facade users declare with (topics, agents, tables, joins).

Nothing runs at import or declaration time. The App keeps the declarations and
an :class:`~streamjoin.config.AppConfig`; ``await app.start()`` (or ``async with
app:``) freezes them into a :class:`~streamjoin.topology.Topology` and hands both
to a :class:`~streamjoin.runtime.worker.Worker`, the composition root that builds
and runs everything else. ``await app.stop()`` stops it, committing what was
processed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import timedelta, tzinfo
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar, cast

from streamjoin.agents import Agent, AgentFunction, AgentGenerator, OnError
from streamjoin.aggregations import Aggregator
from streamjoin.app_commands import AppCommand, command_decorator
from streamjoin.channels import Sink, Sinks
from streamjoin.codecs import Codec, resolve_codec
from streamjoin.config import PROCESSING_GUARANTEES, AppConfig, parse_broker_url
from streamjoin.context import RuntimeLink
from streamjoin.errors import ConfigurationError, CopartitioningError, EncodeError, LifecycleError
from streamjoin.events import Event
from streamjoin.global_tables import GlobalTable, SetGlobalTable
from streamjoin.joins.api import declare_join
from streamjoin.joins.run_state import JoinStats
from streamjoin.memory_channels import ChannelAgent, MemoryChannel
from streamjoin.punctuation import (
    Punctuation,
    PunctuationFunction,
    PunctuationType,
    agent_punctuated,
    interval_ms,
)
from streamjoin.query.routing import Location
from streamjoin.set_tables import SetTable
from streamjoin.state.ttl import check_ttl_ms
from streamjoin.state.versions import check_history_ms
from streamjoin.state.windows import WindowSpec
from streamjoin.stream import INTERNAL_AGENT_BATCH, Stream
from streamjoin.stream_ops import field_key
from streamjoin.table_inference import used_of_kind
from streamjoin.tables import STORE_KINDS, StoreKind, Table
from streamjoin.timers import (
    AppTask,
    Crontab,
    Every,
    OnTimerError,
    Timer,
    check_on_error,
    interval_seconds,
    scheduled_function,
)
from streamjoin.topic_tables import TopicTableFeed
from streamjoin.topics import Topic
from streamjoin.topology import Topology
from streamjoin.ttl_tables import TtlTable
from streamjoin.versioned_tables import VersionedTable
from streamjoin.web_views import (
    WebView,
    attach_route,
    declare_view,
    make_table_route,
    table_route_of,
)
from streamjoin.windowed import (
    WindowCloseCallback,
    WindowedTable,
    check_emission,
    idle_after_ms,
)
from streamjoin.windowed_aggregation import (
    AggregateTable,
    DynamicWindows,
    WindowedAggregation,
    declare_aggregation,
)

if TYPE_CHECKING:
    from streamjoin.runtime.worker import Worker

log = logging.getLogger("streamjoin.app")

S = TypeVar("S", bound=Callable[..., Awaitable[None]])
P = TypeVar("P", bound=PunctuationFunction)
V = TypeVar("V", bound=Callable[..., Awaitable[Any]])
_Settings = ParamSpec("_Settings")


def _takes_the_settings_of(
    config: Callable[_Settings, AppConfig],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, _Settings], None]]:
    """Give ``App.__init__`` ``AppConfig``'s parameters (the id, then every setting with its
    type and default), for type checkers and ``help()``: the settings are declared once, in
    AppConfig, and ``App(...)``'s keywords are still checked statically."""

    def typed(init: Callable[..., None]) -> Callable[Concatenate[Any, _Settings], None]:
        self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        settings = inspect.signature(config).parameters.values()
        signature = inspect.Signature([self, *settings], return_annotation=None)
        init.__signature__ = signature  # type: ignore[attr-defined]
        return init

    return typed


class App:
    """A streamjoin application: one consumer group named after ``id``.

    ``App(id, **settings)`` takes the keywords of :class:`~streamjoin.config.AppConfig`,
    where each setting is declared once with its type and default (``App.__init__`` has
    AppConfig's signature, so type checkers check the keywords and their values). They are
    validated into the frozen ``app.config``, the one place to read them (the App has no
    attribute per setting); an unknown keyword is a ConfigurationError naming it and the
    closest setting. ``query_token`` left out defaults to ``$STREAMJOIN_QUERY_TOKEN``.

    Settings:
        broker: ``kafka://host:port[,host:port...]``.
        key_serializer / value_serializer: default codecs for topics (names such as
            ``"raw"``, ``"json"``, ``"str"``, a registered codec, or a dataclass type).
        commit_interval: seconds between commits (default 1.0; 0.1 under exactly-once).
        processing_guarantee: ``"at_least_once"`` (a crash replays what was processed
            since the last commit) or ``"exactly_once"`` (each commit is one Kafka
            transaction holding the outputs, changelog records and consumed offsets; readers
            of the outputs must read ``read_committed``; see docs/exactly-once.md).
        transaction_timeout_ms: exactly-once: how long the broker keeps a transaction of a
            worker that vanished open (it holds back read_committed readers that long).
        standby_replicas: warm standby copies of each stateful task on other workers.
        state_dir: where local state lives (default ``./<id>-data``).
        group_instance_id: static membership id: a restarted worker with the same id
            within the session timeout keeps its partitions without a rebalance.
        topic_partitions: partition count for declared topics that do not say.
        client_options: passed to every aiokafka client (SASL/SSL: ``security_protocol``,
            ``ssl_context``, ``sasl_mechanism``, ``sasl_plain_username``, ...).
        consumer_options / producer_options: passed to the consumer / producer only.
        capacity, tags, host: what this worker reports to the assignor (processing
            slots, placement tags such as ``{"zone": "a"}``, address for routing).
        align_idle_ms: how long inputs read together in timestamp order (the two sides
            of a join) wait for a side with nothing buffered when it looks caught up, in
            case its producer runs a little behind (0: only wait for a side known to have
            more data). Raise it for replays much faster than real time.
        align_max_idle_ms: the longest wait for a side known to have more data before the
            other side is processed without it (logged).
        rebalance_protocol: ``"cooperative"`` (default: members keep processing what
            they keep while the group rebalances; a task moves in two short steps) or
            ``"eager"`` (every rebalance stops every task; the protocol of versions
            before 0.3). A group stays eager while any member speaks only eager.
        high_availability: KIP-441 style: a task stays on a caught-up member while a
            warmup replica restores it on its balanced target; it moves only once the
            warmup is within ``acceptable_recovery_lag`` records.
        acceptable_recovery_lag: changelog records behind that still count as caught up.
        max_warmup_replicas: warmup replicas restoring at once (high availability).
        probing_rebalance_interval: seconds between the rebalances that check whether
            warmups have caught up (while any warmup exists).
        web_port: serve the status page, ``/status.json`` and Prometheus ``/metrics`` on
            this port (0: any free port, see :attr:`web_url`; None, the default: no server).
        web_host: the address the server listens on (default ``127.0.0.1``: this machine
            only; ``--http-host``/``--web-host`` on the CLI). The server also answers
            interactive table queries (``GET /tables/<table>/<key>``, docs/queries.md);
            unless ``host`` says otherwise, this worker advertises ``web_host:port`` to
            the group as its query address.
        query_token: a bearer token every table query must carry
            (``Authorization: Bearer <token>``; default: ``$STREAMJOIN_QUERY_TOKEN``, else
            none). Never shown in reprs or logs.
        web_tls_cert / web_tls_key: PEM files of a certificate (then its chain) and its
            private key: the web server serves HTTPS only, and reads forwarded to other
            workers go over HTTPS too (docs/queries.md, "TLS"). Bad files: the start fails.
        web_tls_key_password: the password of an encrypted ``web_tls_key`` (a Secret).
        web_tls_client_ca: mutual TLS: clients, other workers included, must present a
            certificate this CA signed (workers present their own ``web_tls_cert``).
        web_tls_ca: the CA other workers' certificates are verified against when a read
            is forwarded (default: the system's trusted CAs).
        status_log_interval: seconds between the INFO lines of throughput, lag and
            partitions by role (default 30; None: no such line).
        startup_timeout: seconds the worker keeps trying to reach the broker when it starts
            before it gives up (``streamjoin worker`` then exits with code 3).
        shutdown_timeout: the longest a stop (a signal, or a fatal error) may take: what is
            not flushed and committed by then (the broker is unreachable) is processed
            again by the partitions' next owner.
        rocksdb: :class:`~streamjoin.state.RocksDBOptions` for every table store (the
            worker's shared block cache and write-buffer budget, open files per table
            database, compression, the read cache's bounds); None keeps their defaults.
    """

    @_takes_the_settings_of(AppConfig)
    def __init__(self, id: str, **settings: Any) -> None:
        if settings.get("query_token") is None:
            settings["query_token"] = os.environ.get("STREAMJOIN_QUERY_TOKEN") or None
        self.config = AppConfig.from_options(id, **settings)
        #: how declarations reach the running worker (connected while it runs)
        self._link = RuntimeLink()
        self.topics: dict[str, Topic] = {}
        self.agents: dict[str, Agent] = {}
        self.tables: dict[str, Table] = {}
        self.joins: dict[str, Any] = {}
        #: aggregations declared with app.aggregate, by name (their tables are in tables)
        self.aggregations: dict[str, WindowedAggregation] = {}
        #: tables materialized from a topic (app.topic_table): table name -> topic
        self.table_sources: dict[str, Topic] = {}
        #: ``app.global_table`` declarations, by name
        self.global_tables: dict[str, GlobalTable] = {}
        #: table name -> what keeps that topic table (and the stream-table joins reading it)
        self._feeds: dict[str, TopicTableFeed] = {}
        self.copartition_groups: list[tuple[str, ...]] = []
        #: ``@app.timer``/``@app.crontab`` and ``@app.task`` declarations, by name
        self.timers: dict[str, Timer] = {}
        self.app_tasks: dict[str, AppTask] = {}
        #: ``@app.punctuate`` declarations, by name, in declaration order
        self.punctuations: dict[str, Punctuation] = {}
        #: ``@app.page`` declarations, in declaration order
        self.views: list[WebView] = []
        #: ``app.channel()`` in-memory channels, by name (their agents run as app tasks)
        self.channels: dict[str, MemoryChannel] = {}
        #: ``@app.command`` subcommands of ``streamjoin -A <this app>``, by name
        self.commands: dict[str, AppCommand] = {}
        #: inside ``async with app.producing():``
        self._producing = False
        self._worker: Worker | None = None
        self._last_worker: Worker | None = None
        #: the task running an ``async with app:`` body, and whether a failure cancelled it
        self._body: asyncio.Task[Any] | None = None
        self._body_cancelled = False

    # ------------------------------------------------------------------ settings

    def configure(self, **changes: Any) -> None:
        """Change settings (validated like the constructor's); not while running."""
        if self._worker is not None:
            raise LifecycleError(f"{self!r} is running: stop it before changing settings")
        self.config = self.config.replace(**changes)

    @property
    def id(self) -> str:
        """The app's name (``config.id``): its consumer group and internal topics' prefix."""
        return self.config.id

    def __repr__(self) -> str:  # no client options: they may hold credentials
        return f"App(id={self.id!r}, broker={self.config.broker!r})"

    # ------------------------------------------------------------------ declarations

    def _codecs(
        self, key: str | Codec | type | None, value: str | Codec | type | None
    ) -> tuple[Codec, Codec]:
        """The codecs for a declaration; None means the app's defaults."""
        return (
            self.config.key_codec if key is None else resolve_codec(key),
            self.config.value_codec if value is None else resolve_codec(value),
        )

    def topic(
        self,
        name: str,
        *,
        key_serializer: str | Codec | type | None = None,
        value_serializer: str | Codec | type | None = None,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
    ) -> Topic:
        """Declare a topic (created at start when missing).

        Declaring it again returns the same object. Settings given again must agree with
        the first declaration (settings left out, as agents and joins name topics, are
        taken from it); a conflict is a :class:`ConfigurationError` naming each setting.
        """
        if partitions is not None and partitions < 1:
            raise ConfigurationError(f"topic {name!r}: partitions must be >= 1, got {partitions}")
        key_codec, value_codec = self._codecs(key_serializer, value_serializer)
        key_codec, value_codec = _bound(key_codec, name, True), _bound(value_codec, name, False)
        existing = self.topics.get(name)
        if existing is not None:
            conflicts = _redeclaration_conflicts(
                existing,
                key_codec=None if key_serializer is None else key_codec,
                value_codec=None if value_serializer is None else value_codec,
                partitions=partitions,
                replication_factor=replication_factor,
                config=config,
            )
            if conflicts:
                raise ConfigurationError(
                    f"topic {name!r} declared twice with {', '.join(conflicts)}. Declare it "
                    "once and pass the Topic around, or repeat only settings that agree."
                )
            if partitions is not None:
                existing.partitions = partitions
            return existing
        topic = Topic(
            name,
            key_codec,
            value_codec,
            partitions=partitions,
            replication_factor=replication_factor or _default_replication(self.config),
            config=dict(config or {}),
            link=self._link,
        )
        self.topics[name] = topic
        return topic

    def channel(self, name: str | None = None, *, maxsize: int = 1000) -> MemoryChannel:
        """An in-memory channel (Faust's ``app.channel()``): ``await channel.send(value=...)``
        queues an event for the one agent declared on it, ``@app.agent(channel)``, which runs
        once per worker. At-most-once: what is queued when the worker stops or crashes is
        lost (use an agent with no topic for records that must survive). ``send`` waits
        while ``maxsize`` events are queued. ``name``: default ``channel-<n>``.
        """
        name = f"channel-{len(self.channels) + 1}" if name is None else name
        if name in self.channels:
            raise ConfigurationError(f"channel {name!r} is declared twice")
        declared = self.channels[name] = MemoryChannel(name, maxsize, self._link)
        return declared

    def agent(
        self,
        topic: Topic | str | Sequence[Topic | str] | MemoryChannel | None = None,
        *,
        name: str | None = None,
        concurrency: int = 1,
        on_error: OnError = "stop",
        dead_letter: Topic | str | None = None,
        sink: Sequence[Sink] = (),
    ) -> Callable[[AgentFunction | AgentGenerator], Agent]:
        """Decorate ``async def f(stream)`` to process ``topic`` (or several co-partitioned
        topics, merged per partition in timestamp order); returns the :class:`Agent`
        (``await agent.send(key=..., value=...)`` sends to its topic).

        No topic (``@app.agent()``): the agent reads its own topic ``<app id>-<agent>``
        (created at start with the app's partition count), which ``agent.send`` writes.
        A channel (``@app.agent(app.channel())``): the agent reads that in-memory queue, once
        per worker, at-most-once (see :mod:`streamjoin.memory_channels`).
        ``sink``: topics, agents or functions that get what the function yields (it is then
        an async generator; see :mod:`streamjoin.channels`).
        ``on_error``: ``"stop"`` (default), ``"skip"``, or ``"dead_letter"`` (records
        go to ``dead_letter``, default ``<app id>-<agent>-dead-letters``).
        """
        if isinstance(topic, MemoryChannel):
            return self._channel_agent(topic, name, concurrency, on_error, dead_letter, sink)
        if topic is None:
            names: list[Topic | str] = []
        else:
            names = [topic] if isinstance(topic, Topic | str) else list(topic)
            if not names:
                raise ConfigurationError("an agent needs at least one topic")
            if any(isinstance(each, MemoryChannel) for each in names):
                raise ConfigurationError(
                    "an agent reads topics or one in-memory channel, not both: "
                    "@app.agent(channel) takes the channel alone"
                )
        sources = [self.topic(t) if isinstance(t, str) else t for t in names]
        if len(sources) > 1:
            self.copartition(*sources)

        def register(fun: AgentFunction | AgentGenerator) -> Agent:
            agent_name = name or f"{fun.__module__}.{fun.__qualname__}"
            if agent_name in self.agents:
                raise ConfigurationError(f"agent {agent_name!r} is declared twice")
            # Faust's agent with no topic reads its own, durable one
            read = sources or [self.topic(f"{self.id}-{agent_name.rsplit('.', 1)[-1]}")]
            dlq: Topic | None = None
            if on_error == "dead_letter" or dead_letter is not None:
                dlq_name = dead_letter if dead_letter is not None else None
                if isinstance(dlq_name, Topic):
                    dlq = dlq_name
                else:
                    short = agent_name.rsplit(".", 1)[-1]
                    dlq = self.topic(
                        dlq_name or f"{self.id}-{short}-dead-letters",
                        key_serializer="raw",
                        value_serializer="raw",
                    )
            declared = Agent(
                agent_name,
                fun,
                read[0],
                concurrency,
                on_error,
                dead_letter=dlq,
                more_topics=tuple(read[1:]),
                sinks=Sinks(agent_name, sink) if sink else None,
            )
            self.agents[agent_name] = declared
            return declared

        return register

    def _channel_agent(
        self,
        channel: MemoryChannel,
        name: str | None,
        concurrency: int,
        on_error: str,
        dead_letter: Topic | str | None,
        sink: Sequence[Sink],
    ) -> Callable[[AgentFunction | AgentGenerator], Any]:
        """``@app.agent(channel)``: the agent runs as an app task of the same name."""

        def register(fun: AgentFunction | AgentGenerator) -> ChannelAgent:
            agent_name = name or f"{fun.__module__}.{fun.__qualname__}"
            if agent_name in self.agents or agent_name in self.app_tasks:
                raise ConfigurationError(f"agent {agent_name!r} is declared twice")
            if agent_name in self.timers:
                raise ConfigurationError(f"agent {agent_name!r}: a timer has that name")
            declared = ChannelAgent.declare(
                agent_name,
                fun,
                channel,
                on_error=on_error,
                concurrency=concurrency,
                dead_letter=dead_letter,
                sink=sink,
            )
            self.app_tasks[agent_name] = AppTask(agent_name, declared.run)
            return declared

        return register

    def table(
        self,
        name: str,
        *,
        default: Callable[[], Any] | None = None,
        key_serializer: str | Codec | type | None = None,
        value_serializer: str | Codec | type | None = None,
        partitions: int | None = None,
        copartitioned_with: Topic | str | Sequence[Topic | str] = (),
        changelog_config: Mapping[str, str] | None = None,
        window: WindowSpec | None = None,
        emit: str = "update",
        emit_to: Topic | str | None = None,
        on_window_close: WindowCloseCallback | None = None,
        close_idle_after: timedelta | float | None = None,
        timestamp: Callable[[Event], int] | None = None,
        store: StoreKind = "rocksdb",
        ttl_ms: int | None = None,
        history_ms: int | None = None,
    ) -> Table:
        """Declare a table backed by the compacted changelog ``<app id>-<name>-changelog``.

        ``copartitioned_with`` names the topics whose agents write the table: partition p of
        each goes to the same worker as partition p of the table. ``default`` is called for
        missing keys (e.g. ``int`` for counters). With ``window`` (``TumblingWindows`` or
        ``HoppingWindows`` from ``streamjoin.state.windows``) values are kept per key and
        window and purged after the window's retention (a :class:`WindowedTable`).

        Windowed tables only (docs/windows.md, "Emission"): ``emit="update"`` (default) or
        ``"close"``: one final result per key and window once stream time passes the
        window's end + grace, sent to ``emit_to`` (a topic) and/or passed to
        ``on_window_close(key, (start, end), value)``; writes to a closed window are
        dropped and counted. ``close_idle_after`` (a timedelta or seconds): a partition
        receiving nothing for that long closes windows as if stream time had moved on
        with the wall clock. ``timestamp(event) -> ms``: the event time that picks the
        windows (default: the record timestamp).

        ``store="memory"`` keeps the table's partitions in memory instead of RocksDB: same
        changelog, standbys and guarantees, but each start restores them in full from the
        changelog (small or short-lived tables; docs/tables.md). ``ttl_ms=N`` (plain
        tables only) expires a key not written for N ms of stream time, the highest event
        timestamp the partition has seen: reads stop seeing it at once, and a later flush
        purges it with a changelog tombstone.

        ``history_ms=N`` (plain tables) makes a versioned table: each write is a version at
        the current event's timestamp, kept for N ms of stream time (the latest always),
        and ``table.get(key, as_of=ts)`` reads the value valid at ts; a stream-table join
        with it looks rows up as of each event's timestamp (docs/tables.md).
        """
        if name in self.tables:
            raise ConfigurationError(f"table {name!r} is declared twice")
        if store not in STORE_KINDS:
            raise ConfigurationError(
                f"table {name!r}: store must be one of {', '.join(map(repr, STORE_KINDS))}, "
                f"got {store!r}"
            )
        if ttl_ms is not None:
            ttl_ms = check_ttl_ms(name, ttl_ms)
            if window is not None:
                raise ConfigurationError(
                    f"table {name!r}: ttl_ms does not apply to windowed tables (their "
                    "windows expire after the window's retention: see window=)"
                )
        if history_ms is not None:
            history_ms = check_history_ms(name, history_ms)
            if window is not None or ttl_ms is not None:
                raise ConfigurationError(
                    f"table {name!r}: history_ms (a versioned table) does not combine with "
                    f"{'window=' if window is not None else 'ttl_ms='}: its history is "
                    "retained by stream time already"
                )
        emission: dict[str, Any] = {}
        if window is None:
            given = [
                setting
                for setting, value in (
                    ("emit_to", emit_to),
                    ("on_window_close", on_window_close),
                    ("close_idle_after", close_idle_after),
                    ("timestamp", timestamp),
                )
                if value is not None
            ]
            if emit != "update" or given:
                raise ConfigurationError(
                    f"table {name!r}: {', '.join(given) or 'emit'} only apply to windowed "
                    "tables (window=...)"
                )
        else:
            emission = {
                "emit": emit,
                "emit_to": self.topic(emit_to) if isinstance(emit_to, str) else emit_to,
                "on_window_close": on_window_close,
                "close_idle_after_ms": idle_after_ms(close_idle_after, f"table {name!r}"),
                "timestamp": timestamp,
            }
            check_emission(name, windows=window, **emission)  # (before anything is declared)
        writers = (
            [copartitioned_with]
            if isinstance(copartitioned_with, Topic | str)
            else list(copartitioned_with)
        )
        writer_topics = [self.topic(w) if isinstance(w, str) else w for w in writers]
        counts = {t.partitions for t in writer_topics if t.partitions is not None}
        if partitions is not None:
            counts.add(partitions)
        if len(counts) > 1:
            raise CopartitioningError(
                f"table {name!r}: partition counts differ: "
                + ", ".join(f"{t.name}={t.partitions}" for t in writer_topics)
                + (f", table={partitions}" if partitions is not None else "")
            )
        # Unknown counts are resolved at start from the existing topics (resolve_partitions).
        count = counts.pop() if counts else None
        if count is not None:
            for t in writer_topics:
                t.partitions = count
        config = {"cleanup.policy": "compact", **(changelog_config or {})}
        changelog = self.topic(
            f"{self.id}-{name}-changelog",
            key_serializer="raw",
            value_serializer="raw",
            partitions=count,
            config=config,
        )
        key_codec, value_codec = self._codecs(key_serializer, value_serializer)
        # (the changelog's records are the table's encoded keys and values)
        key_codec = _bound(key_codec, changelog.name, True)
        value_codec = _bound(value_codec, changelog.name, False)
        writer_names = frozenset(t.name for t in writer_topics)
        # (the kind of table, and what only that kind takes)
        kind: type[Table] = Table
        extra: dict[str, Any] = {}
        if ttl_ms is not None:
            kind, extra = TtlTable, {"ttl_ms": ttl_ms}
        elif history_ms is not None:
            kind, extra = VersionedTable, {"history_ms": history_ms}
        elif window is not None:
            kind, extra = WindowedTable, {"windows": window, "topics": self.topics, **emission}
        table = kind(
            name,
            key_codec,
            value_codec,
            changelog,
            default,
            writer_names,
            link=self._link,
            store=store,
            **extra,
        )
        self.tables[name] = table
        if writer_topics:
            self.copartition(changelog, *writer_topics)
        return table

    def set_table(
        self,
        name: str,
        *,
        key_serializer: str | Codec | type | None = None,
        value_serializer: str | Codec | type | None = None,
        partitions: int | None = None,
        copartitioned_with: Topic | str | Sequence[Topic | str] = (),
        changelog_config: Mapping[str, str] | None = None,
        store: StoreKind = "rocksdb",
        manager: bool = False,
    ) -> SetTable:
        """Declare a set table (Faust's ``SetTable``): ``table[key]`` is a mutable set of
        members (encoded with ``value_serializer``), empty for a missing key; an emptied
        set deletes its key. Otherwise a plain table: same changelog, standbys, restore and
        guarantees (docs/tables.md, "Set tables"). ``manager=True`` adds ``table.manager``
        (Faust's ``start_manager=True``): the topic ``<app id>-<name>-setmanager`` and the
        agent ``<name>.setmanager`` that applies the operations sent there."""
        writers = (
            [copartitioned_with]
            if isinstance(copartitioned_with, Topic | str)
            else list(copartitioned_with)
        )
        manager_topic = None
        if manager:
            manager_topic = self.topic(
                f"{self.id}-{name}-setmanager",
                key_serializer="raw",
                value_serializer="raw",
                partitions=partitions,
            )
            writers.append(manager_topic)
        table = SetTable.of(
            self.table(
                name,
                key_serializer=key_serializer,
                value_serializer=value_serializer,
                partitions=partitions,
                copartitioned_with=writers,
                changelog_config=changelog_config,
                store=store,
            ),
            manager_topic,
        )
        self.tables[name] = table
        if manager_topic is not None:
            self.agent(manager_topic, name=table.manager_agent)(table.apply_operations)
        return table

    def topic_table(
        self,
        topic: Topic | str,
        *,
        name: str | None = None,
        default: Callable[[], Any] | None = None,
        history_ms: int | None = None,
        ttl_ms: int | None = None,
    ) -> Table:
        """A table holding the latest value per key of ``topic`` (a null value deletes the key),
        kept up to date by an internal agent (``<table>.materialize``); usable in stream-table
        and table-table joins. Streams joined with it are read by that same agent, in
        timestamp order with the topic (see :mod:`streamjoin.topic_tables`). ``history_ms``
        makes it a versioned table (see :meth:`table`): joined streams' events then meet
        the row as of their timestamp even when they arrive after a newer row. ``ttl_ms``
        makes it a TTL table (see :meth:`table`): a key whose row was not written for that
        long of the partition's stream time is absent."""
        source = self.topic(topic) if isinstance(topic, str) else topic
        table_name = name or f"{source.name}-table"
        table = self.table(
            table_name,
            default=default,
            key_serializer=source.key_codec,
            value_serializer=source.value_codec,
            copartitioned_with=source,
            history_ms=history_ms,
            ttl_ms=ttl_ms,
        )
        self.table_sources[table_name] = source
        feed = self._feeds[table_name] = TopicTableFeed(table, source)
        self._declare_feed_agent(feed)
        return table

    def global_table(
        self,
        topic: Topic | str,
        *,
        name: str | None = None,
        default: Callable[[], Any] | None = None,
        key_serializer: str | Codec | type | None = None,
        value_serializer: str | Codec | type | None = None,
        store: StoreKind = "rocksdb",
    ) -> GlobalTable:
        """A read-only table of the latest value per key of ALL partitions of ``topic``, on
        every worker (Faust's ``GlobalTable``, Kafka Streams' ``GlobalKTable``): restored
        before the agents start, then kept current in the background; readable from any
        agent (no co-partitioning) and by ``app.join(stream, table, key=...)``. The topic
        is its changelog (docs/tables.md, "Global tables")."""
        source = self.topic(topic) if isinstance(topic, str) else topic
        table_name = name or f"{source.name}-global"
        if store not in STORE_KINDS:
            raise ConfigurationError(f"store must be one of {STORE_KINDS}, got {store!r}")
        if table_name in self.tables or table_name in self.global_tables:
            raise ConfigurationError(f"a table named {table_name!r} is already declared")
        table = GlobalTable(
            table_name,
            source,
            source.key_codec if key_serializer is None else resolve_codec(key_serializer),
            source.value_codec if value_serializer is None else resolve_codec(value_serializer),
            default=default,
            store=store,
        )
        self.global_tables[table_name] = table
        return table

    def set_global_table(
        self, table: SetTable, *, name: str | None = None, store: StoreKind = "rocksdb"
    ) -> SetGlobalTable:
        """Every worker's read-only copy of the set table ``table``, all partitions (Faust's
        ``SetGlobalTable``), kept from its changelog like a global table (name:
        ``<table>-global`` unless ``name=``); ``copy[key]`` is a read-only set of members."""
        if not isinstance(table, SetTable):
            raise ConfigurationError(
                f"set_global_table takes a set table (app.set_table), got {table!r}"
            )
        declared = self.global_table(
            table.changelog,
            name=name or f"{table.name}-global",
            key_serializer=table.key_codec,
            value_serializer=table.value_codec,
            store=store,
        )
        copy = SetGlobalTable(
            declared.name, declared.source, declared.key_codec, declared.value_codec, store=store
        )
        self.global_tables[copy.name] = copy
        return copy

    def _infer_table_writers(self) -> None:
        """A table declared without ``copartitioned_with`` is co-partitioned with the topics
        of the agents whose code uses it by name (see :mod:`streamjoin.table_inference`):
        where an agent's code makes it certain, as Faust users expect."""
        undeclared = {name for name, table in self.tables.items() if not table.writers}
        if not undeclared:
            return
        for agent in list(self.agents.values()):
            for used in used_of_kind(agent.fun, Table):
                table: Table | None = self.tables.get(used.name)
                if table is None or table is not used or table.name not in undeclared:
                    continue
                for topic in agent.topics:
                    self.attach_reader(table, topic)
                log.debug(
                    "table %r: co-partitioned with %s (agent %s uses it)",
                    table.name,
                    ", ".join(t.name for t in agent.topics),
                    agent.name,
                )

    def attach_reader(self, table: Table, topic: Topic) -> None:
        """Let agents of ``topic`` read ``table`` (co-partitions them).

        Counts nobody gave are settled at start for the whole co-partition group (an
        existing topic's count, else one given, else the app's ``topic_partitions``)."""
        if topic.partitions is None:
            topic.partitions = table.changelog.partitions
        table.writers = table.writers | {topic.name}
        self.copartition(table.changelog, topic)

    def on_table_update(self, table: Table, listener: Callable[[Any], Awaitable[None]]) -> None:
        """Call ``listener(key)`` after a topic-backed table's key was updated."""
        feed = self._feeds.get(table.name)
        if feed is None:
            raise ConfigurationError(f"table {table.name!r} is not read from a topic")
        if isinstance(table, TtlTable):
            raise ConfigurationError(
                f"table {table.name!r} has ttl_ms: table-table and foreign-key joins follow "
                "every change of their tables, and an expiry is not one they see (their "
                "results would keep expired rows); join it with streams only"
            )
        feed.listeners.append(listener)

    def read_in_order(
        self,
        table: Table,
        stream: Topic,
        handler: Callable[[Event], Awaitable[object] | None],
        *,
        join: str,
        on_error: OnError,
    ) -> bool:
        """Have ``handler`` called for each event of ``stream`` by the agent of the topic
        table ``table``, in timestamp order with the table's rows (what it returns, if not
        None, is awaited); False (nothing done) when ``table`` is not a topic table."""
        feed = self._feeds.get(table.name)
        if feed is None:
            return False
        feed.add_reader(join, stream, handler, on_error)
        self._declare_feed_agent(feed)
        return True

    def _declare_feed_agent(self, feed: TopicTableFeed) -> None:
        """(Re)declare the topic table's agent over its source and the streams joined with it."""
        self.agents.pop(feed.agent_name, None)
        streams = [t for name, t in feed.streams.items() if name != feed.source.name]
        dead_letter = None
        if feed.on_error == "dead_letter":
            dead_letter = f"{self.id}-{feed.table.name}-dead-letters"
        self.agent(
            [feed.source, *streams],
            name=feed.agent_name,
            on_error=feed.on_error,
            dead_letter=dead_letter,
        )(feed.run)
        self.agents[feed.agent_name].ties_first = frozenset({feed.source.name})

    def join(
        self,
        left: Topic | Table,
        right: Topic | Table | GlobalTable,
        *,
        window: timedelta | int | None = None,
        grace: timedelta | int = 0,
        how: str = "inner",
        output: Topic | str | None = None,
        name: str | None = None,
        left_timestamp: Callable[[Event], int] | None = None,
        right_timestamp: Callable[[Event], int] | None = None,
        on_error: OnError = "stop",
        close_idle_after: timedelta | float | None = None,
        foreign_key: Callable[[Any], Any] | None = None,
        key: Callable[[Event], Any] | None = None,
    ) -> Callable[[Callable[[Any, Any, Any], Any]], Callable[[Any, Any, Any], Any]]:
        """Declare a join; decorate ``fun(key, left_value, right_value) -> output value``.

        * ``(topic, topic)``: windowed stream-stream join. Events match when their keys are
          equal and their event times differ by at most ``window``; events up to ``grace``
          late are still joined. ``how``: ``inner``, ``left`` or ``outer`` (unmatched sides
          are emitted once, with None for the missing side, when their window closes).
        * ``(topic, table)``: stream-table join: each event with the table's value for its
          key (``inner`` skips events without one, ``left`` passes None): for an
          ``app.topic_table``, as of the event's timestamp (the table's agent reads the
          stream too, in timestamp order with the table's topic); for a table written by
          agents, its current value.
        * ``(table, table)``: the join of two ``app.topic_table`` tables, maintained as a
          table named after the join; every change is emitted (None when a row disappears).
        * ``(table, table, foreign_key=lambda left_value: ...)``: the foreign-key join of two
          ``app.topic_table`` tables (``inner`` or ``left``), kept as a table keyed by the
          left key; eventually consistent through internal subscription and response
          topics (docs/joins.md, "Foreign-key joins").

        The function's non-None results are sent to ``output`` keyed like the inputs.
        Event time is the record timestamp unless ``left_timestamp``/``right_timestamp``
        extract it from the event. ``close_idle_after`` (a timedelta or seconds; left and
        outer stream-stream joins): a partition that receives nothing for that long moves
        its stream time on with the wall clock, so its unmatched results are emitted
        without new input (docs/joins.md, "Idle partitions").
        """
        if how not in ("inner", "left", "outer"):
            raise ConfigurationError(f"how must be 'inner', 'left' or 'outer', got {how!r}")
        return declare_join(
            self,
            left,
            right,
            window=window,
            grace=grace,
            how=how,  # type: ignore[arg-type]
            output=output,
            name=name,
            left_timestamp=left_timestamp,
            right_timestamp=right_timestamp,
            on_error=on_error,
            close_idle_after=close_idle_after,
            foreign_key=foreign_key,
            key=key,
        )

    def group_by(
        self,
        topic: Topic | str,
        key: Callable[[Event], Any] | str,
        *,
        name: str,
        partitions: int | None = None,
        key_serializer: str | Codec | type | None = None,
    ) -> Topic:
        """Repartition ``topic`` by a new key into ``<app id>-<name>-repartition``.

        ``key``: a function of the event, or the name of a field of the value (Faust's
        ``stream.group_by(Order.account)`` is ``app.group_by(orders, "account", ...)``).
        The returned topic has ``partitions`` partitions (so it can be co-partitioned with
        another input), the new key, and the original values and timestamps.
        """
        if isinstance(key, str):
            key = field_key(key, f"group_by {name!r}")
        source = self.topic(topic) if isinstance(topic, str) else topic
        target = self.topic(
            f"{self.id}-{name}-repartition",
            key_serializer=key_serializer if key_serializer is not None else source.key_codec,
            value_serializer=source.value_codec,
            partitions=partitions,
        )

        async def repartition(stream: Stream) -> None:
            async for batch in stream.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
                for event in batch:
                    new_key = key(event)
                    try:
                        await target.send(
                            key=new_key, value=event.value, timestamp_ms=event.timestamp
                        )
                    except EncodeError as exc:
                        misfit = _repartition_key_misfit(name, target, new_key, exc)
                        if misfit is None:
                            raise
                        raise misfit from exc

        self.agent(source, name=f"{name}.repartition")(repartition)
        return target

    def through(
        self,
        topic: Topic | str,
        into: Topic | str,
        *,
        partitions: int | None = None,
    ) -> Topic:
        """Forward every record of ``topic`` into ``into`` (same key, value, timestamp and
        headers) and return ``into`` for agents to read: Faust's ``stream.through(topic)``,
        declared before the worker starts. Use it to change the partition count, or to
        hand a stream to other apps through a topic of its own.

        ``into`` given by name is declared with ``topic``'s codecs (and ``partitions``); a
        declared topic keeps its own codecs (the records are re-encoded with them). Sends
        keep the guarantees of any agent's sends (at-least-once or exactly-once).
        """
        source = self.topic(topic) if isinstance(topic, str) else topic
        if isinstance(into, Topic):
            if partitions is not None:
                raise ConfigurationError(
                    f"through({source.name!r}, {into.name!r}): partitions= is for a topic "
                    "given by name; declare it on the topic instead"
                )
            target = into
        else:
            target = self.topic(
                into,
                key_serializer=source.key_codec,
                value_serializer=source.value_codec,
                partitions=partitions,
            )
        if target.name == source.name:
            raise ConfigurationError(
                f"through({source.name!r}, ...): forwarding a topic into itself would loop"
            )

        async def forward(stream: Stream) -> None:
            async for batch in stream.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
                for event in batch:
                    await target.send(
                        key=event.key,
                        value=event.value,
                        headers=event.headers,
                        timestamp_ms=event.timestamp,
                    )

        self.agent(source, name=f"{source.name}.through.{target.name}")(forward)
        return target

    def aggregate(
        self,
        topic: Topic | str,
        *,
        window: WindowSpec | DynamicWindows,
        agg: Aggregator | Mapping[str, Aggregator],
        name: str,
        key: Callable[[Event], Any] | None = None,
        key_serializer: str | Codec | type | None = None,
        partitions: int | None = None,
        emit: Literal["update", "close"] = "update",
        emit_to: Topic | str | None = None,
        on_window_close: WindowCloseCallback | None = None,
        close_idle_after: timedelta | float | None = None,
        timestamp: Callable[[Event], int] | None = None,
        on_error: OnError = "stop",
    ) -> AggregateTable:
        """Aggregate ``topic`` per key and window into the windowed table ``name``.

        ``window``: tumbling, hopping, sliding or session windows
        (:mod:`streamjoin.state.windows`). ``agg``: an aggregator from
        :mod:`streamjoin.aggregations` (``Count()``, ``Sum(field)``, ``Min``, ``Max``,
        ``Mean``, ``Latest``, ``Collect``, ``Reduce(fn, initial)``) or a dict of them by
        name (results are dicts). ``key``: a function of the event giving the key to
        aggregate by; the stream is repartitioned by it first (``app.group_by``, topic
        ``<id>-<name>-repartition``, with ``partitions`` and ``key_serializer``).
        ``emit="update"`` sends every changed window's result to ``emit_to``;
        ``emit="close"`` sends each window's final result once, when it closes, to
        ``emit_to`` and/or ``on_window_close(key, (start, end), result)``
        (``close_idle_after``: tumbling and hopping windows, as for tables). Result records
        are keyed by the key, their value ``{"start", "end", "value"}``. ``timestamp``
        extracts event time from the event (default: the record timestamp). The returned
        table is queryable like any windowed table and shows results (docs/windows.md,
        "Aggregations").
        """
        return declare_aggregation(
            self,
            topic,
            window=window,
            agg=agg,
            name=name,
            key=key,
            key_serializer=key_serializer,
            partitions=partitions,
            emit=emit,
            emit_to=emit_to,
            on_window_close=on_window_close,
            close_idle_after=close_idle_after,
            timestamp=timestamp,
            on_error=on_error,
        )

    def timer(
        self,
        interval: timedelta | float,
        *,
        on_leader: bool = False,
        on_error: OnTimerError = "stop",
        name: str | None = None,
    ) -> Callable[[S], S]:
        """Decorate ``async def f()`` (or ``f(app)``) to run every ``interval`` while the
        worker runs (Faust's ``app.timer``; docs/timers.md).

        ``interval``: a ``timedelta``, or a number of **seconds** (as in Faust), more
        than 0. The first run is one interval after the worker starts; runs never overlap,
        and ticks a slow run overran are skipped. ``on_leader``: only the group's leader
        runs it (asked at every tick). ``on_error``: ``"stop"`` (default: the worker stops
        with :class:`~streamjoin.errors.TimerFailed`) or ``"skip"`` (logged, counted, the
        timer keeps ticking).
        """
        where = f"app.timer({interval!r})"
        schedule = Every(interval_seconds(interval, where))
        return self._scheduled(where, name, on_error, on_leader, schedule)

    def crontab(
        self,
        cron_format: str,
        *,
        timezone: str | tzinfo | None = None,
        on_leader: bool = False,
        on_error: OnTimerError = "stop",
        name: str | None = None,
    ) -> Callable[[S], S]:
        """Decorate ``async def f()`` (or ``f(app)``) to run at the times of a cron
        expression (Faust's ``app.crontab``): five fields, or six with seconds last.
        ``timezone``: an IANA name or a ``tzinfo`` (default UTC). A bad expression or an
        unknown timezone is a :class:`ConfigurationError`. ``on_leader`` and ``on_error``
        as for :meth:`timer`.
        """
        where = f"app.crontab({cron_format!r})"
        schedule = Crontab.parse(cron_format, timezone, where)
        return self._scheduled(where, name, on_error, on_leader, schedule)

    def task(
        self,
        fun: S | None = None,
        *,
        on_leader: bool = False,
        on_error: OnTimerError = "stop",
        name: str | None = None,
    ) -> Any:
        """``@app.task`` (or ``@app.task(on_leader=True)``): ``async def f()`` (or
        ``f(app)``) started once when the worker starts and cancelled when it stops
        (Faust's ``app.task``). ``on_leader``: started while this worker leads the group,
        cancelled when it stops leading. ``on_error`` as for :meth:`timer` (``"skip"``:
        the error is logged and the task stays ended).
        """
        register = self._scheduled("app.task", name, on_error, on_leader, None)
        return register if fun is None else register(fun)

    def _scheduled(
        self,
        where: str,
        name: str | None,
        on_error: str,
        on_leader: bool,
        schedule: Every | Crontab | None,
    ) -> Callable[[S], S]:
        """The decorator of a timer (``schedule``) or app task (None): checks the function
        and the name (one namespace for both), keeps the declaration."""
        policy = check_on_error(on_error, where)

        def register(fun: S) -> S:
            declared = name or f"{fun.__module__}.{fun.__qualname__}"
            if declared in self.timers or declared in self.app_tasks:
                raise ConfigurationError(f"{where}: {declared!r} is declared twice")
            call = scheduled_function(fun, self, where)
            if schedule is None:
                self.app_tasks[declared] = AppTask(declared, call, on_leader, policy)
            else:
                self.timers[declared] = Timer(declared, call, schedule, on_leader, policy)
            return fun

        return register

    def punctuate(
        self,
        target: Callable[..., Any] | str | Topic | Table,
        *,
        every: timedelta | float | None = None,
        every_ms: int | None = None,
        type: PunctuationType = "stream_time",
        name: str | None = None,
    ) -> Callable[[P], P]:
        """Decorate ``def f(context)`` or ``async def f(context)`` to run for each task of
        an agent (Kafka Streams' punctuation; docs/timers.md, "Punctuation (per task)").

        ``target``: the agent (its function or name), or a topic or table exactly one
        declared agent reads. ``every``: a ``timedelta`` or seconds (or ``every_ms``).
        ``type="stream_time"``: when the task's stream time (its largest record timestamp)
        reaches a multiple of the interval, before that record is processed (a jump over
        several multiples runs it once, for the latest); ``"wall_clock"``: every interval
        per running task, records or not. The function gets a
        :class:`~streamjoin.punctuation.PunctuationContext`; it reads and writes the task's
        table partitions and sends like an agent, as part of the task's commit; an error
        follows the agent's ``on_error``.
        """
        where = f"app.punctuate({getattr(target, '__qualname__', target)!r})"
        interval = interval_ms(every, every_ms, where)
        agent = agent_punctuated(target, self.agents, self.copartition_groups, where)

        def register(fun: P) -> P:
            declared = name or f"{fun.__module__}.{fun.__qualname__}"
            if declared in self.punctuations:
                raise ConfigurationError(f"{where}: punctuation {declared!r} is declared twice")
            self.punctuations[declared] = Punctuation(declared, fun, agent, interval, type)
            return fun

        return register

    def page(
        self,
        path: str,
        *,
        methods: Sequence[str] | str = ("GET",),
        public: bool = False,
        name: str | None = None,
    ) -> Callable[[V], V]:
        """Decorate ``async def view(request, **path_params)`` to answer ``path`` (an
        aiohttp path template, ``/count/{word}``) on the worker's web server (Faust's
        ``app.page``; docs/web.md). The view gets the aiohttp request and, as keywords,
        the path parameters it names; it returns an aiohttp response, or anything JSON can
        carry (sent as JSON). The bearer ``query_token`` is asked, as for table queries,
        unless ``public=True``. A path of the worker's own routes, or a path and method
        declared twice, is a ConfigurationError.
        """

        def register(fun: V) -> V:
            view = declare_view(
                path,
                fun,
                methods=methods,
                public=public,
                name=name,
                declared=self.views,
                route=table_route_of(fun),
            )
            self.views.append(view)
            return fun

        return register

    def table_route(
        self, table: Table, *, match_info: str | None = None, query_param: str | None = None
    ) -> Callable[[V], V]:
        """Decorate a view (with ``@app.page``) to answer it on the worker owning a key of
        ``table`` (Faust's ``app.table_route``): the key is the path parameter
        ``match_info`` or the query parameter ``query_param``, parsed by the table's key
        codec. Elsewhere the request is forwarded to the owner (or redirected with
        ``?redirect=1``), or answered 503 while the key's partition moves (docs/web.md).
        """
        route = make_table_route(table, match_info, query_param, self.tables)

        def attach(fun: V) -> V:
            attach_route(self.views, fun, route)
            return fun

        return attach

    def command(self, *options: Any, name: str | None = None, help: str | None = None) -> Any:
        """``@app.command(click.option("--n", type=int), ...)`` on ``def f(n)`` or
        ``async def f(n)``: a subcommand ``streamjoin -A <module:app> f --n 3`` (its name:
        ``name``, else the function's with ``-`` for ``_``; its help: ``help``, else the
        docstring). Options and arguments are click's, given here as Faust does (click's
        decorators stacked under this one work too); the function gets their values as
        keywords, and a first parameter ``self`` gets a
        :class:`~streamjoin.app_commands.CommandContext` (Faust's signature). To send,
        use ``async with app.producing():`` (docs/cli.md)."""
        return command_decorator(self.commands, options, name, help)

    @property
    def changelog_topics(self) -> frozenset[str]:
        return frozenset(t.changelog.name for t in self.tables.values())

    def copartition(self, *topics: Topic | str) -> tuple[str, ...]:
        """Declare topics whose partition p must be processed by the same worker."""
        names = tuple(sorted({t if isinstance(t, str) else t.name for t in topics}))
        if len(names) < 2:
            raise ConfigurationError("copartition() needs at least two distinct topics")
        for n in names:
            if n not in self.topics:
                self.topic(n)
        # Overlapping declarations merge into one group: p of all of them goes together.
        merged = set(names)
        others = list(self.copartition_groups)
        changed = True
        while changed:
            changed = False
            kept = []
            for group in others:
                if merged & set(group):
                    merged |= set(group)
                    changed = True
                else:
                    kept.append(group)
            others = kept
        self.copartition_groups = [*others, tuple(sorted(merged))]
        return tuple(sorted(merged))

    # ------------------------------------------------------------------ running

    @property
    def runtime_link(self) -> RuntimeLink:
        """How this app's declarations reach a running worker (for runners and test drivers)."""
        return self._link

    def topology(self) -> Topology:
        """The declarations, frozen: what a worker (or a Spark job) runs."""
        self._infer_table_writers()
        return Topology.freeze(
            self.id,
            topics=self.topics,
            agents=self.agents,
            tables=self.tables,
            joins=self.joins,
            table_sources=self.table_sources,
            copartition_groups=self.copartition_groups,
            timers=self.timers,
            app_tasks=self.app_tasks,
            punctuations=tuple(self.punctuations.values()),
            global_tables=self.global_tables,
        )

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._worker.finished

    def check_copartitioning(self, counts: Mapping[str, int]) -> None:
        self.topology().check_copartitioning(counts)

    async def start(self) -> None:
        """Create topics, start the producer, the agents and the consumer."""
        if self._worker is not None:
            raise LifecycleError(f"{self!r} is already running")
        if self._producing:
            raise LifecycleError(f"{self!r} is producing (app.producing()): leave that first")
        from streamjoin.runtime.worker import Worker

        worker = Worker(
            self.topology(),
            self.config,
            link=self._link,
            on_failure=self._failed,
            views=self.views,
        )
        await worker.start()
        self._worker = worker

    @contextlib.asynccontextmanager
    async def producing(self, *, create_topics: bool = True) -> AsyncIterator[App]:
        """``async with app.producing():`` sends to the app's topics (``await
        topic.send(...)``) without running the app: only its producer (idempotent,
        ``acks=all``) starts; no agents, group, state or web server. For scripts and
        ``@app.command`` functions. The declared topics are created and checked as a
        worker's start does (``create_topics=False``: each must exist already, else
        :class:`~streamjoin.errors.UnknownTopicError`). Leaving the block waits until every
        record sent is acknowledged or failed: await a send's delivery to know which."""
        if self._worker is not None or self._producing:
            what = "running" if self._worker is not None else "producing"
            raise LifecycleError(f"{self!r} is already {what}")
        from streamjoin.runtime.worker import start_producer

        self._producing = True
        try:
            sender = await start_producer(
                self.topology(), self.config, self._link, create_topics=create_topics
            )
            try:
                yield self
                await sender.flush()
            finally:
                try:
                    await sender.stop()
                finally:
                    self._link.disconnect()
        finally:
            self._producing = False

    async def serve(self) -> int:
        """Run the app in your own asyncio program (``asyncio.run(app.serve())``) until
        SIGINT (Ctrl-C) or SIGTERM or a fatal error, and stop it cleanly, as ``streamjoin
        worker`` does: no ``KeyboardInterrupt`` traceback, one log line for a failure.
        Returns the worker's exit code (0: stopped by a signal, everything committed; 1: a
        fatal error; 3: it could not start). The signal handlers need the main thread."""
        from streamjoin.runtime.run import serve

        return await serve(self, shutdown_timeout=self.config.shutdown_timeout)

    async def stop(self) -> None:
        """Finish in-flight events, commit, leave the group (unless static), stop clients."""
        worker, self._worker = self._worker, None
        if worker is not None:
            self._last_worker = worker
            await worker.stop()
            await worker.stopped()  # (a fatal error's stop, already under way, finishes too)

    async def wait(self) -> None:
        """Until the app stops; re-raises the error that made it stop, if any."""
        worker = self._worker or self._last_worker
        if worker is None:
            return
        try:
            await worker.wait_stopped()
        finally:
            if self._worker is worker:
                self._worker, self._last_worker = None, worker

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped (or is stopping) the app, if any (running or last run)."""
        worker = self._worker or self._last_worker
        return None if worker is None else worker.failure

    def _failed(self, exc: BaseException) -> None:
        """The worker is stopping after ``exc``: an ``async with app:`` body still running
        is cancelled (``__aexit__`` raises ``exc`` in its place)."""
        body = self._body
        if body is not None and not body.done() and body is not asyncio.current_task():
            self._body_cancelled = True
            body.cancel()

    @property
    def assignment(self) -> set[tuple[str, int]]:
        """Partitions this worker owns right now (active)."""
        return set() if self._worker is None else self._worker.assignment

    def locate(self, table: str | Table, key: Any) -> Location:
        """Where ``key`` of ``table`` lives right now: its partition (the key codec's bytes
        and murmur2, as writes use), the query address (``host``) of its active owner and
        those of its standbys, from the group's current assignment (docs/queries.md).

        Raises :class:`QueryUnavailable` while the assignment is in flux (a rebalance, or
        the first moments after one; without a web server, also on the first call, which
        starts keeping the group's routing table) and :class:`LifecycleError` when not
        running."""
        name = table.name if isinstance(table, Table) else table
        worker = self._worker
        if worker is None or worker.queries is None:
            raise LifecycleError(
                f"{self!r} locates keys while it runs, and only when it declares tables"
            )
        return worker.queries.locate(name, key)

    def join_stats(self, name: str) -> JoinStats:
        """Counters of the stream-stream join ``name`` on this worker (running or last run)."""
        if name not in self.joins:
            raise ConfigurationError(
                f"app {self.id!r} has no join {name!r} (joins: {', '.join(self.joins) or 'none'})"
            )
        worker = self._worker or self._last_worker
        found = None if worker is None else worker.join_stats.get(name)
        return JoinStats() if found is None else found

    def rebalance_metrics(self) -> dict[str, float | int | None]:
        """This worker's rebalance metrics (the KIP-429 names: ``rebalance-latency-avg``,
        ``rebalance-total``, ``last-rebalance-seconds-ago``, ...), running or last run;
        empty before the worker joined a group."""
        worker = self._worker or self._last_worker
        return {} if worker is None else worker.rebalance_metrics()

    def transaction_metrics(self) -> dict[str, int]:
        """Exactly-once: ``transactions-committed`` and ``transactions-aborted`` of this
        worker (running or last run); empty under at-least-once."""
        worker = self._worker or self._last_worker
        return {} if worker is None else worker.transaction_metrics()

    def metrics(self) -> dict[str, Any]:
        """This worker's metrics and status as a plain dict (running or last run; empty
        before the first start): the values ``/metrics`` and ``/status.json`` serve. See
        docs/operations.md for the keys."""
        worker = self._worker or self._last_worker
        return {} if worker is None else worker.metrics()

    @property
    def web_url(self) -> str | None:
        """Where the running worker serves its status page (None: no ``web_port``)."""
        return None if self._worker is None else self._worker.web_url

    async def __aenter__(self) -> App:
        await self.start()
        self._body, self._body_cancelled = asyncio.current_task(), False
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the app; raise the error that stopped it, if one did (the body was cancelled
        when it happened while the body ran)."""
        body, cancelled = self._body, self._body_cancelled
        self._body, self._body_cancelled = None, False
        worker = self._worker
        await self.stop()
        failure = None if worker is None else worker.failure
        if failure is None:
            return
        if cancelled and isinstance(exc, asyncio.CancelledError):
            uncancel = getattr(body, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()
            raise failure from None
        if exc is None:
            raise failure


def _default_replication(config: AppConfig) -> int | None:
    """A topic's replication factor when its declaration does not say: the app's, or None
    for "auto" (decided when the topic is created: min(3, brokers in the cluster))."""
    setting = config.topic_replication_factor
    return None if setting == "auto" else setting


def _repartition_key_misfit(
    name: str, target: Topic, key: Any, exc: EncodeError
) -> EncodeError | None:
    """The error of a ``group_by`` key its repartition topic's key codec cannot encode,
    naming the topic and the fix (None: the key encodes; ``exc`` was about the value)."""
    try:
        target.key_codec.dumps(key)
    except EncodeError:
        pass
    else:
        return None
    codec = target.key_codec.name
    return EncodeError(
        f"group_by {name!r}: the key {key!r} ({type(key).__qualname__}) does not fit the key "
        f"codec {codec!r} of the repartition topic {target.name!r} ({exc}); give group_by "
        f"(or app.aggregate with key=) a key_serializer= that encodes it, e.g. "
        f'key_serializer="json", or make the key function return what {codec!r} takes'
    )


def _bound(codec: Codec, topic: str, is_key: bool) -> Codec:
    """``codec`` as used for ``topic``'s keys or values: a codec naming its schema after its
    topic (a schema-registry codec's subject) has a ``bind`` hook returning such a copy."""
    bind = getattr(codec, "bind", None)
    return codec if bind is None else cast(Codec, bind(topic, is_key))


def _redeclaration_conflicts(
    existing: Topic,
    *,
    key_codec: Codec | None,
    value_codec: Codec | None,
    partitions: int | None,
    replication_factor: int | None,
    config: Mapping[str, str] | None,
) -> list[str]:
    """Each setting given again that differs from ``existing``'s, as ``"<setting> a and b"``
    (None: not given again)."""
    out = []
    if partitions is not None and existing.partitions not in (None, partitions):
        out.append(f"{existing.partitions} and {partitions} partitions")
    for setting, old, new in (
        ("key_serializer", existing.key_codec, key_codec),
        ("value_serializer", existing.value_codec, value_codec),
    ):
        if new is not None and new != old:
            out.append(f"{setting} {old.name!r} and {new.name!r}")
    if replication_factor is not None and replication_factor != existing.replication_factor:
        declared = existing.replication_factor or "auto"
        out.append(f"replication_factor {declared} and {replication_factor}")
    if config is not None and dict(config) != dict(existing.config):
        out.append(f"config {dict(existing.config)} and {dict(config)}")
    return out


__all__ = [
    "PROCESSING_GUARANTEES",
    "App",
    "parse_broker_url",
]
