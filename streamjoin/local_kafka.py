"""A real, single-node Apache Kafka (KRaft) broker provisioned by the project itself.

No Docker engine exists on our machines, so the broker's jars are resolved from
Maven Central once (with ``mvn dependency:copy-dependencies`` on a generated
``pom.xml``) into a per-user cache, and the broker runs as a plain ``java``
process on loopback with free ports in a temporary directory.

The pure parts (config rendering, cache layout, port choice, Java version
parsing) are plain functions so they can be unit-tested; :class:`LocalKafka` is
the thin shell that runs processes. Use it as a context manager in scripts and
benchmarks, through the pytest plugin (:mod:`streamjoin.testing.pytest_plugin`),
or from the ``streamjoin dev-broker`` command (which is why it is not under
``testing/``: nothing outside ``testing/`` imports from it). Its jars come through
:mod:`streamjoin.maven`, as Spark's Kafka connector's do.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TypeVar

from streamjoin.errors import BrokerExitedError, KafkaProvisioningError
from streamjoin.maven import copy_dependencies, default_cache_dir, file_lock, find_maven

#: Apache Kafka release the project tests against (KRaft only since 4.0).
KAFKA_VERSION = "4.3.0"
SCALA_VERSION = "2.13"
#: log4j2's SLF4J 1.x binding, so the broker's SLF4J logs reach our log file.
LOG4J_VERSION = "2.24.3"
#: Kafka 4.x brokers need Java 17 or newer.
MIN_JAVA_MAJOR = 17
LOOPBACK = "127.0.0.1"

_COMPLETE_MARKER = ".complete"
#: in a kept data dir: the ports it last ran on ("<client> <controller> <internal>";
#: older dirs have "<client> <controller>")
PORTS_FILE = "ports"

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    """Default progress sink: say nothing."""


# --------------------------------------------------------------------------- pure helpers


def kafka_libs_dir(cache_dir: Path, version: str = KAFKA_VERSION) -> Path:
    """Where the jars of one Kafka version live inside the cache."""
    return cache_dir / "kafka" / f"{SCALA_VERSION}-{version}" / "libs"


def render_pom(version: str = KAFKA_VERSION) -> str:
    """A throwaway POM whose runtime dependencies are exactly the broker's classpath."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.streamjoin.dev</groupId>
  <artifactId>local-kafka</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{SCALA_VERSION}</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{LOG4J_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""


def parse_java_major(version_output: str) -> int:
    """The major version from ``java -version`` output (``1.8.0_x`` -> 8, ``17.0.2`` -> 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        raise KafkaProvisioningError(
            f"could not read the Java version from `java -version`: {version_output.strip()!r}"
        )
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        return int(match.group(2))
    return major


#: Linux's default ephemeral (outgoing connection) port range, when /proc does not say
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
#: where the broker's ports are picked: below the ephemeral range, so an outgoing
#: connection's local port never takes a restarting broker's port
LISTEN_PORT_RANGE = (10000, 30000)


def parse_port_range(text: str) -> tuple[int, int] | None:
    """``/proc/sys/net/ipv4/ip_local_port_range`` ("32768\t60999") -> (32768, 60999);
    None when the text is not a port range."""
    parts = text.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    low, high = int(parts[0]), int(parts[1])
    if not 0 < low <= high <= 65535:
        return None
    return low, high


def ephemeral_port_range(
    proc_file: Path = Path("/proc/sys/net/ipv4/ip_local_port_range"),
) -> tuple[int, int]:
    """The OS's ephemeral port range (Linux's /proc), else Linux's default."""
    try:
        parsed = parse_port_range(proc_file.read_text())
    except OSError:
        parsed = None
    return DEFAULT_EPHEMERAL_RANGE if parsed is None else parsed


def listen_port_candidates(
    ephemeral: tuple[int, int], preferred: tuple[int, int] = LISTEN_PORT_RANGE
) -> range:
    """Ports to listen on that are outside ``ephemeral``: ``preferred`` cut below the
    ephemeral range (or above it, when the ephemeral range starts too low)."""
    low, high = preferred
    eph_low, eph_high = ephemeral
    below = range(max(low, 1024), min(high, eph_low - 1) + 1)
    if len(below) >= 100:
        return below
    above = range(max(eph_high + 1, 1024), 65536)
    if len(above) >= 100:
        return above
    raise KafkaProvisioningError(
        f"no port range outside the ephemeral range {eph_low}-{eph_high} to listen on"
    )


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server can listen on ``port`` of ``host`` right now. With SO_REUSEADDR, as
    the broker's JVM binds: connections of a stopped broker lingering in TIME_WAIT do not
    make its port look taken (a restart keeps its address); a listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(
    host: str = LOOPBACK,
    exclude: frozenset[int] = frozenset(),
    *,
    candidates: range | None = None,
) -> int:
    """A TCP port that is free on ``host`` right now, outside the OS's ephemeral range
    (random among ``candidates``, by default :func:`listen_port_candidates`)."""
    pool = listen_port_candidates(ephemeral_port_range()) if candidates is None else candidates
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(pool)
        if port not in exclude and port_is_free(port, host):
            return port
    raise KafkaProvisioningError(
        f"no free TCP port found on {host} in {pool.start}-{pool.stop - 1}"
    )


def stored_cluster_id(log_dir: Path) -> str | None:
    """The cluster id in ``<log_dir>/meta.properties`` (None: the storage is not formatted).

    A restart on kept data must format with this id (the storage tool refuses another).
    """
    meta = log_dir / "meta.properties"
    try:
        text = meta.read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "cluster.id" and value.strip():
            return value.strip()
    raise KafkaProvisioningError(f"{meta} has no cluster.id; remove the data dir to start afresh")


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64 without padding (22 chars).

    Never one starting with "-" (1 in 64 would): the storage tool's argument parser reads it
    as an option. Kafka's own ``Uuid.randomUuid`` skips those for the same reason.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


#: The listener clients use (``bootstrap_servers``); its security protocol is a parameter.
CLIENT_LISTENER = "CLIENT"
#: The listener brokers talk to each other on, and our readiness probes and admin queries use:
#: always PLAINTEXT, so a secured or proxied CLIENT listener never blocks them.
INTERNAL_LISTENER = "INTERNAL"
CONTROLLER_LISTENER = "CONTROLLER"


@dataclass(frozen=True)
class BrokerSettings:
    """What makes one local KRaft node: its ports, data directory, quorum and config overrides.

    ``quorum`` maps every controller's node id to its controller port (empty: a quorum of this
    node alone). ``advertised_client_port`` is the port clients are told to use for the CLIENT
    listener (a fault proxy's, say); None: the listener's own port.
    """

    client_port: int
    internal_port: int
    controller_port: int
    log_dir: Path
    host: str = LOOPBACK
    node_id: int = 1
    quorum: Mapping[int, int] = field(default_factory=dict)
    advertised_client_port: int | None = None
    client_protocol: str = "PLAINTEXT"
    overrides: Mapping[str, str] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        """The CLIENT address clients are told to use (the advertised one)."""
        port = (
            self.client_port if self.advertised_client_port is None else self.advertised_client_port
        )
        return f"{self.host}:{port}"

    @property
    def internal_bootstrap_servers(self) -> str:
        """The INTERNAL (PLAINTEXT) address: inter-broker traffic, readiness and admin queries."""
        return f"{self.host}:{self.internal_port}"

    @property
    def quorum_voters(self) -> str:
        """``controller.quorum.voters``: ``id@host:port`` for every controller."""
        voters = self.quorum or {self.node_id: self.controller_port}
        return ",".join(f"{node}@{self.host}:{port}" for node, port in sorted(voters.items()))


#: Defaults for a fast single-node development broker.
DEV_BROKER_DEFAULTS: Mapping[str, str] = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "5",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "num.partitions": "1",
    # Declared topics are created explicitly; a typo must not silently create a
    # one-partition topic that breaks co-partitioning.
    "auto.create.topics.enable": "false",
    "log.retention.hours": "-1",
}


def render_server_properties(settings: BrokerSettings) -> str:
    """``server.properties`` for a combined broker+controller KRaft node on loopback, with
    CLIENT, INTERNAL and CONTROLLER listeners; ``settings.overrides`` are merged last."""
    host = settings.host
    protocol = settings.client_protocol.upper()
    props: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": str(settings.node_id),
        "controller.quorum.voters": settings.quorum_voters,
        "listeners": (
            f"{CLIENT_LISTENER}://{host}:{settings.client_port},"
            f"{INTERNAL_LISTENER}://{host}:{settings.internal_port},"
            f"{CONTROLLER_LISTENER}://{host}:{settings.controller_port}"
        ),
        "advertised.listeners": (
            f"{CLIENT_LISTENER}://{settings.bootstrap_servers},"
            f"{INTERNAL_LISTENER}://{settings.internal_bootstrap_servers}"
        ),
        "controller.listener.names": CONTROLLER_LISTENER,
        "inter.broker.listener.name": INTERNAL_LISTENER,
        "listener.security.protocol.map": (
            f"{CLIENT_LISTENER}:{protocol},{INTERNAL_LISTENER}:PLAINTEXT,"
            f"{CONTROLLER_LISTENER}:PLAINTEXT"
        ),
        "log.dirs": str(settings.log_dir),
    }
    props.update(DEV_BROKER_DEFAULTS)
    props.update(settings.overrides)
    lines = ["# generated by streamjoin.local_kafka"]
    lines.extend(f"{key}={value}" for key, value in props.items())
    return "\n".join(lines) + "\n"


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def check_client_protocol(protocol: str) -> str:
    """The CLIENT listener's security protocol, upper-cased; a clear error for anything else."""
    upper = protocol.upper()
    if upper not in SECURITY_PROTOCOLS:
        raise KafkaProvisioningError(
            f"client_protocol={protocol!r} is not a Kafka security protocol; "
            f"use one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    return upper


def parse_saved_ports(text: str) -> tuple[int, int, int | None] | None:
    """A kept data dir's ports file: ``"<client> <controller> <internal>"``, or the older
    ``"<client> <controller>"`` (internal None: pick a new one); None when unreadable."""
    parts = text.split()
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        return None
    ports = [int(p) for p in parts]
    if len(set(ports)) != len(ports):
        return None
    return ports[0], ports[1], ports[2] if len(ports) == 3 else None


def render_log4j2_config(log_file: Path) -> str:
    """log4j2 properties sending the broker's logs to one file, INFO for startup facts only."""
    return f"""status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = info
"""


def java_command(
    java: str,
    classpath: list[Path],
    main_class: str,
    args: list[str],
    *,
    heap: str = "768m",
    log4j_config: Path | None = None,
    jvm_flags: Sequence[str] = ("-XX:+UseG1GC",),
) -> list[str]:
    """The ``java`` argv for one of Kafka's main classes."""
    cmd = [java, f"-Xmx{heap}", "-Djava.awt.headless=true", *jvm_flags]
    if log4j_config is not None:
        cmd.append(f"-Dlog4j2.configurationFile={log4j_config}")
    cmd += ["-cp", os.pathsep.join(str(p) for p in classpath), main_class, *args]
    return cmd


#: JVM flags for a broker that starts fast and stays light (tests, the local cluster): the
#: C1 compiler only and the serial collector take about 40% less CPU to start, at some cost
#: in peak throughput (benchmarks keep the defaults: G1 and the C2 compiler).
FAST_START_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def class_data_archive(cache_dir: Path, version: str, java: str) -> Path:
    """Where the broker's class-data-sharing archive for this Kafka version and this JVM is
    kept (an archive only fits the exact JVM build and classpath that wrote it)."""
    real = Path(java).resolve()
    try:
        stamp = real.stat()
        key = f"{real}:{stamp.st_size}:{stamp.st_mtime_ns}"
    except OSError:
        key = str(real)
    digest = uuid.uuid5(uuid.NAMESPACE_URL, key).hex[:12]
    return kafka_libs_dir(cache_dir, version).parent / f"broker-cds-{digest}.jsa"


def class_data_flags(archive: Path, scratch: Path) -> list[str]:
    """Use the class-data-sharing archive when it exists (about a third less CPU to start
    the JVM); else have this JVM write one to ``scratch`` when it exits."""
    if archive.exists():
        return [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", "-Xlog:cds=off"]
    return [f"-XX:ArchiveClassesAtExit={scratch}", "-Xlog:cds=off"]


# --------------------------------------------------------------------------- resolution


def find_java(env: Mapping[str, str] | None = None) -> str:
    """Path of a Java 17+ ``java``: ``$JAVA_HOME/bin/java`` first, then ``$PATH``."""
    env = os.environ if env is None else env
    candidates: list[str] = []
    if env.get("JAVA_HOME"):
        candidates.append(str(Path(env["JAVA_HOME"]) / "bin" / "java"))
    on_path = shutil.which("java", path=env.get("PATH"))
    if on_path:
        candidates.append(on_path)
    for java in candidates:
        if not os.access(java, os.X_OK):
            continue
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
        major = parse_java_major(out.stderr + out.stdout)
        if major >= MIN_JAVA_MAJOR:
            return java
        raise KafkaProvisioningError(
            f"{java} is Java {major}; Apache Kafka {KAFKA_VERSION} needs Java "
            f"{MIN_JAVA_MAJOR} or newer. Install one (Debian/Ubuntu: "
            f"`apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    raise KafkaProvisioningError(
        "Java was not found (no JAVA_HOME, no `java` on PATH). The local Kafka broker needs "
        f"Java {MIN_JAVA_MAJOR}+: install it (Debian/Ubuntu: "
        "`apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
    )


_FOUND_JAVA: dict[tuple[str | None, str | None], str] = {}


def _java_for_this_environment() -> str:
    """:func:`find_java` once per JAVA_HOME and PATH (it runs ``java -version``): a
    cluster's nodes, and every restart of one, would otherwise each pay a JVM start."""
    key = (os.environ.get("JAVA_HOME"), os.environ.get("PATH"))
    if key not in _FOUND_JAVA:
        _FOUND_JAVA[key] = find_java()
    return _FOUND_JAVA[key]


def cached_classpath(libs: Path) -> list[Path] | None:
    """The cached jars, or None when the cache is missing or incomplete."""
    if not (libs / _COMPLETE_MARKER).exists():
        return None
    jars = sorted(libs.glob("*.jar"))
    return jars or None


def resolve_kafka(
    version: str = KAFKA_VERSION,
    cache_dir: Path | None = None,
    progress: Progress = _quiet,
) -> list[Path]:
    """The broker's classpath, resolved from Maven Central into the cache on first use.

    Later calls return the cached jars without touching the network.
    """
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    libs = kafka_libs_dir(cache_dir, version)
    cached = cached_classpath(libs)
    if cached is not None:
        return cached
    with file_lock(libs.parent / ".lock"):
        cached = cached_classpath(libs)  # another process may have finished meanwhile
        if cached is not None:
            return cached
        mvn = find_maven()
        progress(
            f"Resolving Apache Kafka {version} and its dependencies from Maven Central "
            f"into {libs} (once; later runs reuse it)..."
        )
        started = time.monotonic()
        staging = libs.parent / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        result = copy_dependencies(mvn, render_pom(version), staging)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise KafkaProvisioningError(
                f"resolving org.apache.kafka:kafka_{SCALA_VERSION}:{version} from Maven "
                f"Central failed (exit {result.returncode}). Check network access to Maven "
                f"Central and that the version exists. Maven said:\n{tail}"
            )
        if not any(staging.glob(f"kafka_{SCALA_VERSION}-*.jar")):
            raise KafkaProvisioningError(
                f"Maven finished but {staging} holds no kafka_{SCALA_VERSION} jar"
            )
        (staging / _COMPLETE_MARKER).write_text(version + "\n")
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        jars = sorted(libs.glob("*.jar"))
        progress(f"Resolved {len(jars)} jars in {time.monotonic() - started:.1f}s.")
        return jars


# --------------------------------------------------------------------------- readiness


async def _probe_ready(bootstrap_servers: str, timeout: float) -> bool:
    """Metadata answers, and the group coordinator is up (which creates ``__consumer_offsets``,
    so the first consumer group of a test does not race its creation)."""
    from aiokafka import AIOKafkaClient
    from aiokafka.client import CoordinationType
    from aiokafka.errors import KafkaError

    client = AIOKafkaClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=5000)
    deadline = time.monotonic() + timeout
    try:
        await asyncio.wait_for(client.bootstrap(), timeout)
        if not client.cluster.brokers():
            return False
        while True:
            try:
                await client.coordinator_lookup(CoordinationType.GROUP, "streamjoin-readiness")
                return True
            except KafkaError:
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.2)
    finally:
        await client.close()


def broker_answers_metadata(bootstrap_servers: str, timeout: float = 10.0) -> bool:
    """True when the broker answers metadata requests and its group coordinator is available.

    Runs in its own thread and event loop so it works from sync code and from
    inside a running event loop alike.
    """
    outcome: list[bool] = []

    def probe() -> None:
        try:
            outcome.append(asyncio.run(_probe_ready(bootstrap_servers, timeout)))
        except Exception:
            outcome.append(False)

    thread = threading.Thread(target=probe, name="kafka-readiness-probe", daemon=True)
    thread.start()
    thread.join(timeout + 10)
    return bool(outcome and outcome[0])


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to SIGKILL the broker if the Python process that started it dies."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except Exception:
        pass


#: Linux's parent-death signal follows the *thread* that forked the child, not the process:
#: a broker started from a short-lived thread (``asyncio.to_thread``, a pool starting a
#: cluster's nodes in parallel) would be killed when that thread ends. Every broker is
#: therefore forked from this one thread, which lives as long as the Python process.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-spawner")


def _spawn(cmd: list[str], stdout: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start a broker process that dies with this Python process (and only then)."""

    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            cmd,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    return _SPAWNER.submit(popen).result()


def end_process(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM for a controlled shutdown; SIGKILL if it is still running after ``timeout``."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# --------------------------------------------------------------------------- the broker


_Started = TypeVar("_Started", bound="StartedByHand")


class StartedByHand:
    """``with`` and ``async with`` for local servers started and stopped by blocking calls
    (under asyncio, start and stop run in a thread so the loop keeps running)."""

    def start(self: _Started) -> _Started:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Started) -> _Started:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self: _Started) -> _Started:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)


class LocalKafka(StartedByHand):
    """One KRaft node (broker and controller) on loopback, started and stopped by us.

    ``with LocalKafka() as kafka: kafka.bootstrap_servers`` in scripts;
    ``async with LocalKafka() as kafka:`` in asyncio code (start/stop run in a
    thread so the loop keeps running).

    Three listeners: CLIENT (``bootstrap_servers``, security protocol ``client_protocol``),
    INTERNAL (PLAINTEXT: inter-broker traffic, readiness probe, admin queries;
    ``internal_bootstrap_servers``) and CONTROLLER. ``advertise(node_id, client_listen_port)``
    is called before the broker starts (again only when the port changes) and returns the
    port advertised for CLIENT, so a fault proxy can sit between clients and the broker.
    ``format_args`` are extra arguments to ``kafka-storage format`` (``--add-scram ...``).
    ``node_id``, ``quorum`` and ``cluster_id`` make it one node of a
    :class:`~streamjoin.local_cluster.LocalKafkaCluster`.
    """

    def __init__(
        self,
        *,
        version: str = KAFKA_VERSION,
        cache_dir: Path | None = None,
        data_dir: Path | None = None,
        broker_port: int | None = None,
        internal_port: int | None = None,
        controller_port: int | None = None,
        overrides: Mapping[str, str] | None = None,
        advertise: Callable[[int, int], int] | None = None,
        client_protocol: str = "PLAINTEXT",
        format_args: Sequence[str] = (),
        node_id: int = 1,
        quorum: Mapping[int, int] | None = None,
        cluster_id: str | None = None,
        startup_timeout: float = 90.0,
        shutdown_timeout: float = 20.0,
        heap: str = "768m",
        fast_start: bool = False,
        progress: Progress = _quiet,
    ) -> None:
        self.version = version
        self.cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        self._requested_data_dir = data_dir
        self._requested_port = broker_port
        self._requested_internal_port = internal_port
        self._requested_controller_port = controller_port
        self._overrides = dict(overrides or {})
        self._advertise = advertise
        self._advertised: tuple[int, int] | None = None  #: (listen port, advertised port)
        self.client_protocol = check_client_protocol(client_protocol)
        self._format_args = list(format_args)
        self.node_id = node_id
        self._quorum = dict(quorum or {})
        self._cluster_id = cluster_id
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
        self.heap = heap
        self.fast_start = fast_start
        self._progress = progress
        self._archive_scratch: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self.settings: BrokerSettings | None = None
        self.workdir: Path | None = None
        self._attempt = 1

    # -- public

    @property
    def bootstrap_servers(self) -> str:
        """The CLIENT listener's advertised address (a fault proxy's, with ``advertise``)."""
        return self._running_settings().bootstrap_servers

    @property
    def internal_bootstrap_servers(self) -> str:
        """The INTERNAL listener's address: PLAINTEXT, never proxied."""
        return self._running_settings().internal_bootstrap_servers

    @property
    def client_listen_port(self) -> int:
        """The port the CLIENT listener binds (where a fault proxy forwards to)."""
        return self._running_settings().client_port

    @property
    def log_file(self) -> Path | None:
        return None if self.workdir is None else self.workdir / "broker.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalKafka:
        """Resolve jars, format storage, launch the broker and wait until it answers metadata."""
        if self._proc is not None:
            raise KafkaProvisioningError("the local broker is already started")
        java = _java_for_this_environment()
        classpath = resolve_kafka(self.version, self.cache_dir, self._progress)
        if self._requested_data_dir is None:
            if self._tmpdir is None:
                self._tmpdir = tempfile.TemporaryDirectory(prefix="streamjoin-kafka-")
            self.workdir = Path(self._tmpdir.name)
        else:
            self.workdir = self._requested_data_dir
            self.workdir.mkdir(parents=True, exist_ok=True)
        # A free port can be taken by someone else between our probe and the broker's bind:
        # retry with new ports when the broker dies at startup (not when it hangs).
        attempts = 1 if self._fixed_ports() else 3
        for attempt in range(1, attempts + 1):
            self._attempt = attempt
            started = time.monotonic()
            try:
                self._launch(java, classpath)
                self._wait_ready(started)
                break
            except BrokerExitedError as exc:
                self.stop(cleanup=False)
                if attempt == attempts:
                    self._cleanup()
                    raise
                self._progress(f"broker exited during startup ({exc}); retrying with new ports")
                if self._tmpdir is not None:  # our own scratch data only, never a user's dir
                    shutil.rmtree(self.workdir / "data", ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        self._progress(
            f"Kafka ready at {self.bootstrap_servers} in {time.monotonic() - started:.1f}s"
        )
        return self

    def stop(self, *, cleanup: bool = True) -> None:
        """Controlled shutdown (SIGTERM); SIGKILL if it hangs past ``shutdown_timeout``."""
        proc, self._proc = self._proc, None
        end_process(proc, self.shutdown_timeout)
        self._keep_class_data_archive()
        if cleanup:
            self._cleanup()

    def kill(self) -> None:
        """Crash the broker (SIGKILL, no controlled shutdown), keeping its data: a later
        :meth:`start` on the same ``data_dir`` recovers it as after a crash of the broker
        process (not of the machine: what it wrote survives in the OS's page cache)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._keep_class_data_archive()  # none written: a killed JVM does not get to

    def _cleanup(self) -> None:
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    # -- internals

    def _running_settings(self) -> BrokerSettings:
        if self.settings is None or self._proc is None:
            raise KafkaProvisioningError("the local broker is not running; call start() first")
        return self.settings

    def _fixed_ports(self) -> bool:
        return any(
            p is not None
            for p in (
                self._requested_port,
                self._requested_internal_port,
                self._requested_controller_port,
            )
        )

    def _choose_ports(self) -> tuple[int, int, int]:
        """(client, controller, internal): requested ones, else the previous run's (this
        object's, or a kept data dir's), else free ones."""
        saved = self._previous_ports() or self._saved_ports()
        saved_client, saved_controller, saved_internal = saved or (None, None, None)
        client = self._requested_port or saved_client or free_port()
        taken = {client}
        controller = self._requested_controller_port or saved_controller
        if controller is None or controller in taken:
            controller = free_port(exclude=frozenset(taken))
        taken.add(controller)
        internal = self._requested_internal_port or saved_internal
        if internal is None or internal in taken:
            internal = free_port(exclude=frozenset(taken))
        return client, controller, internal

    def _advertised_port(self, client_port: int) -> int | None:
        if self._advertise is None:
            return None
        if self._advertised is None or self._advertised[0] != client_port:
            self._advertised = (client_port, self._advertise(self.node_id, client_port))
        return self._advertised[1]

    def _launch(self, java: str, classpath: list[Path]) -> None:
        if self.workdir is None:
            raise KafkaProvisioningError("no work directory")
        client_port, controller_port, internal_port = self._choose_ports()
        self.settings = BrokerSettings(
            client_port=client_port,
            internal_port=internal_port,
            controller_port=controller_port,
            log_dir=self.workdir / "data",
            node_id=self.node_id,
            quorum=self._quorum,
            advertised_client_port=self._advertised_port(client_port),
            client_protocol=self.client_protocol,
            overrides=self._overrides,
        )
        props = self.workdir / "server.properties"
        props.write_text(render_server_properties(self.settings))
        log4j = self.workdir / "log4j2.properties"
        log4j.write_text(render_log4j2_config(self.workdir / "broker.log"))
        self._format_storage(java, classpath, props, log4j)
        if self._tmpdir is None:
            (self.workdir / PORTS_FILE).write_text(
                f"{client_port} {controller_port} {internal_port}\n"
            )
        self._progress(f"Starting Apache Kafka {self.version} on {self.settings.bootstrap_servers}")
        with (self.workdir / "stdout.log").open("wb") as stdout:
            self._proc = _spawn(
                java_command(
                    java,
                    classpath,
                    "kafka.Kafka",
                    [str(props)],
                    heap=self.heap,
                    log4j_config=log4j,
                    jvm_flags=self._jvm_flags(java),
                ),
                stdout,
            )

    @property
    def writes_class_data_archive(self) -> bool:
        """This broker's JVM writes the class data archive when stopped (not when killed)."""
        return self._archive_scratch is not None

    def _jvm_flags(self, java: str) -> list[str]:
        flags = list(FAST_START_FLAGS if self.fast_start else ("-XX:+UseG1GC",))
        archive = class_data_archive(self.cache_dir, self.version, java)
        scratch = archive.with_name(f"{archive.name}.{uuid.uuid4().hex[:8]}.tmp")
        self._archive_scratch = None if archive.exists() else scratch
        return flags + class_data_flags(archive, scratch)

    def _format_jvm_flags(self, java: str) -> list[str]:
        """The storage tool runs for a second: the fast-start flags, and the broker's class
        data archive when there is one (it holds most of the tool's classes too)."""
        archive = class_data_archive(self.cache_dir, self.version, java)
        flags = list(FAST_START_FLAGS)
        if archive.exists():
            flags += [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", "-Xlog:cds=off"]
        return flags

    def _keep_class_data_archive(self) -> None:
        """After a controlled stop: keep the archive the JVM wrote, unless another broker's
        came first (an atomic rename: brokers starting meanwhile see all of it or none)."""
        scratch, self._archive_scratch = self._archive_scratch, None
        if scratch is None or not scratch.exists():
            return
        final = scratch.with_name(scratch.name.rsplit(".", 2)[0])
        try:
            if final.exists():
                scratch.unlink()
            else:
                os.replace(scratch, final)
        except OSError:
            scratch.unlink(missing_ok=True)

    def _previous_ports(self) -> tuple[int, int, int] | None:
        """The ports of this object's previous run (a restart after stop or kill), when free."""
        if self.settings is None or self._attempt > 1:
            return None
        previous = self.settings
        ports = (previous.client_port, previous.controller_port, previous.internal_port)
        return ports if all(port_is_free(p) for p in ports) else None

    def _saved_ports(self) -> tuple[int, int, int | None] | None:
        """A kept data dir's previous ports, when they are free again (a stable address)."""
        if self._tmpdir is not None or self.workdir is None or self._attempt > 1:
            return None
        try:
            saved = parse_saved_ports((self.workdir / PORTS_FILE).read_text())
        except OSError:
            return None
        if saved is None or not all(port_is_free(p) for p in saved if p is not None):
            return None
        return saved

    def _format_storage(self, java: str, classpath: list[Path], props: Path, log4j: Path) -> None:
        """Format the log dir once; kept data is formatted already (no JVM start for it)."""
        if self.settings is None:
            raise KafkaProvisioningError("broker settings were not made")
        stored = stored_cluster_id(self.settings.log_dir)
        if stored is not None:
            if self._cluster_id is not None and stored != self._cluster_id:
                raise KafkaProvisioningError(
                    f"{self.settings.log_dir} belongs to cluster {stored}, not "
                    f"{self._cluster_id}; remove the data dir to start afresh"
                )
            return
        cluster_id = self._cluster_id or new_cluster_id()
        cmd = java_command(
            java,
            classpath,
            "kafka.tools.StorageTool",
            ["format", "-t", cluster_id, "-c", str(props), *self._format_args],
            heap="256m",
            log4j_config=log4j,
            jvm_flags=self._format_jvm_flags(java),
        )
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            raise KafkaProvisioningError(
                f"formatting KRaft storage failed (exit {result.returncode}):\n"
                f"{(result.stdout + result.stderr).strip()[-2000:]}"
            )

    def _log_tail(self, lines: int = 30) -> str:
        chunks: list[str] = []
        for name in ("stdout.log", "broker.log"):
            path = None if self.workdir is None else self.workdir / name
            if path is not None and path.exists():
                text = path.read_text(errors="replace").strip().splitlines()[-lines:]
                if text:
                    chunks.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(chunks) or "(no broker output)"

    def _wait_ready(self, started: float) -> None:
        """Until the broker answers over INTERNAL (a secured or proxied CLIENT listener
        must not stall the start)."""
        if self._proc is None or self.settings is None:
            raise KafkaProvisioningError("broker process was not started")
        deadline = started + self.startup_timeout
        host, port = self.settings.host, self.settings.internal_port
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise BrokerExitedError(
                    f"the Kafka broker exited with code {code} during startup:\n{self._log_tail()}"
                )
            if _port_open(host, port) and broker_answers_metadata(
                self.settings.internal_bootstrap_servers
            ):
                return
            time.sleep(0.25)
        raise KafkaProvisioningError(
            f"the Kafka broker did not answer metadata requests on {host}:{port} within "
            f"{self.startup_timeout:.0f}s:\n{self._log_tail()}"
        )
