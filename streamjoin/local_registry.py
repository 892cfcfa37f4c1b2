"""A real Confluent-compatible schema registry, provisioned by the project itself like the broker.

The registry is Apicurio Registry 3 (Apache License 2.0), whose Confluent-compatible API
(``/apis/ccompat/v7``) is what Confluent's clients talk to (and streamjoin's schema-registry
codecs will). Its release is on Maven Central as a ready-built Quarkus application
(``apicurio-registry-app-<v>-all.tar.gz``): it is fetched once with ``mvn dependency:copy``
into the per-user cache, unpacked there, and run as a plain ``java -jar quarkus-run.jar`` on
free loopback ports, with its storage in memory (an H2 database inside the JVM: every start is
an empty registry). No Docker, no build. It needs Java 21+, which it looks for beyond
``JAVA_HOME`` and ``PATH`` (the broker keeps running on Java 17).

The pure parts (cache layout, the Maven coordinates, the JVM's argv and settings, choosing a
Java) are plain functions so they can be unit-tested; :class:`LocalRegistry` is the thin shell
that runs the process. Use it as a context manager in scripts, or through the pytest plugin's
``schema_registry_url`` fixture (:mod:`streamjoin.testing.pytest_plugin`).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from streamjoin.errors import ProvisioningError
from streamjoin.local_kafka import (
    FAST_START_FLAGS,
    LOOPBACK,
    Progress,
    StartedByHand,
    _quiet,
    _spawn,
    end_process,
    free_port,
    parse_java_major,
)
from streamjoin.maven import default_cache_dir, file_lock, find_maven

#: Apicurio Registry release the project tests against.
APICURIO_VERSION = "3.3.3"
#: The release's ready-built Quarkus application ("fast-jar" layout) on Maven Central.
APICURIO_GROUP = "io.apicurio"
APICURIO_ARTIFACT = "apicurio-registry-app"
#: Apicurio Registry 3.3's classes are Java 21 class files (version 65); Java 17 refuses them.
MIN_JAVA_MAJOR = 21
#: Where the Confluent-compatible API is served.
CCOMPAT_PATH = "/apis/ccompat/v7"
#: Where Debian (and most Linux distributions) install JDKs, tried after JAVA_HOME and PATH.
JVM_ROOT = Path("/usr/lib/jvm")

_COMPLETE_MARKER = ".complete"
_RUN_JAR = "quarkus-run.jar"


# --------------------------------------------------------------------------- pure helpers


def registry_dir(cache_dir: Path, version: str = APICURIO_VERSION) -> Path:
    """Where one Apicurio Registry version lives inside the cache."""
    return cache_dir / "apicurio-registry" / version


def distribution_coordinates(version: str = APICURIO_VERSION) -> str:
    """``group:artifact:version:type:classifier`` of the release's application archive."""
    return f"{APICURIO_GROUP}:{APICURIO_ARTIFACT}:{version}:tar.gz:all"


def distribution_file_name(version: str = APICURIO_VERSION) -> str:
    """The archive's file name once Maven copied it."""
    return f"{APICURIO_ARTIFACT}-{version}-all.tar.gz"


def cached_run_jar(app_dir: Path) -> Path | None:
    """The unpacked application's launcher, or None when the cache is missing or incomplete."""
    run_jar = app_dir / _RUN_JAR
    if not (app_dir / _COMPLETE_MARKER).exists() or not run_jar.exists():
        return None
    return run_jar


@dataclass(frozen=True)
class RegistrySettings:
    """What makes one local registry: its two loopback ports and its JDBC pool size.

    ``port`` serves the APIs (``url``); ``management_port`` serves Quarkus's health and
    metrics (``/health/ready``), which Apicurio always splits off onto a second port.
    """

    port: int
    management_port: int
    host: str = LOOPBACK
    connections: int = 2

    @property
    def url(self) -> str:
        """The registry's base URL (clients append ``/apis/ccompat/v7``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API's base URL, what Confluent clients call the registry URL."""
        return self.url + CCOMPAT_PATH


def registry_properties(settings: RegistrySettings) -> dict[str, str]:
    """The JVM system properties that put the registry on loopback and keep it small.

    Both listeners bind ``settings.host`` only (Quarkus's default is every interface); the
    JDBC pool of the in-memory database shrinks from Apicurio's 20 connections; the access log
    (a line per request) is off.
    """
    pool = str(settings.connections)
    return {
        "quarkus.http.host": settings.host,
        "quarkus.http.port": str(settings.port),
        "quarkus.management.host": settings.host,
        "quarkus.management.port": str(settings.management_port),
        "quarkus.http.access-log.enabled": "false",
        "apicurio.storage.kind": "sql",
        "apicurio.storage.sql.kind": "h2",
        "apicurio.datasource.jdbc.initial-size": pool,
        "apicurio.datasource.jdbc.min-size": pool,
        "apicurio.datasource.jdbc.max-size": str(max(settings.connections, 10)),
    }


def registry_command(
    java: str,
    run_jar: Path,
    settings: RegistrySettings,
    *,
    heap: str = "256m",
    jvm_flags: Sequence[str] = FAST_START_FLAGS,
    overrides: Mapping[str, str] | None = None,
) -> list[str]:
    """The ``java`` argv that runs the registry; ``overrides`` are more system properties
    (Apicurio's or Quarkus's settings), applied last."""
    props = registry_properties(settings)
    props.update(overrides or {})
    return [
        java,
        f"-Xmx{heap}",
        "-Djava.awt.headless=true",
        *jvm_flags,
        *(f"-D{key}={value}" for key, value in props.items()),
        "-jar",
        str(run_jar),
    ]


def pick_java(versions: Sequence[tuple[str, int]], minimum: int = MIN_JAVA_MAJOR) -> str | None:
    """The first ``java`` (in the order given) whose major version is at least ``minimum``."""
    for java, major in versions:
        if major >= minimum:
            return java
    return None


#: What a JVM says when another process took its port between our probe and its bind.
_PORT_TAKEN = ("seems to be in use by another process", "Address already in use")


def exited_for_a_taken_port(log_text: str) -> bool:
    """Whether a registry that exited during startup lost a race for its port (worth a retry
    on new ports), rather than failing for good (a Java too old, a bad setting)."""
    return any(sign in log_text for sign in _PORT_TAKEN)


def java_candidates(env: Mapping[str, str], jvm_root: Path = JVM_ROOT) -> list[str]:
    """``java`` executables in the order they are tried: ``$JAVA_HOME``, ``$PATH``, then
    every JDK under ``jvm_root`` (newest name last, so a default one comes first)."""
    found: list[str] = []
    if env.get("JAVA_HOME"):
        found.append(str(Path(env["JAVA_HOME"]) / "bin" / "java"))
    on_path = shutil.which("java", path=env.get("PATH"))
    if on_path:
        found.append(on_path)
    found.extend(sorted(glob.glob(str(jvm_root / "*" / "bin" / "java"))))
    unique: dict[str, str] = {}  # by real path: /usr/bin/java is often one of the JDKs
    for java in found:
        if os.access(java, os.X_OK):
            unique.setdefault(os.path.realpath(java), java)
    return list(unique.values())


# --------------------------------------------------------------------------- resolution


_FOUND_JAVA: dict[tuple[str | None, str | None], str] = {}


def find_registry_java(env: Mapping[str, str] | None = None) -> str:
    """A ``java`` that runs the registry (Java 21+), the first of :func:`java_candidates`;
    remembered per ``JAVA_HOME`` and ``PATH`` (each candidate costs a JVM start to ask)."""
    env = os.environ if env is None else env
    key = (env.get("JAVA_HOME"), env.get("PATH"))
    if key not in _FOUND_JAVA:
        _FOUND_JAVA[key] = _first_new_enough_java(env)
    return _FOUND_JAVA[key]


def _first_new_enough_java(env: Mapping[str, str], jvm_root: Path = JVM_ROOT) -> str:
    """Ask each candidate its version, in order, until one is new enough."""
    versions: list[tuple[str, int]] = []
    for java in java_candidates(env, jvm_root):
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
        versions.append((java, parse_java_major(out.stderr + out.stdout)))
        chosen = pick_java(versions)
        if chosen is not None:
            return chosen
    seen = ", ".join(f"{java} (Java {major})" for java, major in versions) or "none"
    raise ProvisioningError(
        f"no Java {MIN_JAVA_MAJOR}+ found for the local schema registry (found: {seen}). "
        f"Install a JDK {MIN_JAVA_MAJOR} or newer (Temurin, or `apt-get install "
        f"openjdk-{MIN_JAVA_MAJOR}-jre-headless` where "
        "the distribution has it; Debian 12 does not) under /usr/lib/jvm, or set JAVA_HOME to it."
    )


def _unpack(archive: Path, target: Path) -> None:
    """Unpack the release archive, refusing members that would land outside ``target``."""
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")


def resolve_registry(
    version: str = APICURIO_VERSION,
    cache_dir: Path | None = None,
    progress: Progress = _quiet,
) -> Path:
    """The registry's ``quarkus-run.jar``, fetched from Maven Central into the cache on first
    use (a 158 MB archive); later calls return the cached one without touching the network."""
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    home = registry_dir(cache_dir, version)
    app_dir = home / "app"
    cached = cached_run_jar(app_dir)
    if cached is not None:
        return cached
    with file_lock(home / ".lock"):
        cached = cached_run_jar(app_dir)  # another process may have finished meanwhile
        if cached is not None:
            return cached
        mvn = find_maven()
        progress(
            f"Fetching Apicurio Registry {version} from Maven Central into {home} "
            "(once; later runs reuse it)..."
        )
        started = time.monotonic()
        download = home / "download"
        shutil.rmtree(download, ignore_errors=True)
        result = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "dependency:copy",
                f"-Dartifact={distribution_coordinates(version)}",
                f"-DoutputDirectory={download}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        archive = download / distribution_file_name(version)
        if result.returncode != 0 or not archive.exists():
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise ProvisioningError(
                f"fetching {distribution_coordinates(version)} from Maven Central failed "
                f"(exit {result.returncode}). Check network access to Maven Central and that "
                f"the version exists. Maven said:\n{tail}"
            )
        staging = home / "app.partial"
        shutil.rmtree(staging, ignore_errors=True)
        _unpack(archive, staging)
        if not (staging / _RUN_JAR).exists():
            raise ProvisioningError(
                f"{archive.name} holds no {_RUN_JAR}; is {version} an Apicurio Registry 3 release?"
            )
        (staging / _COMPLETE_MARKER).write_text(version + "\n")
        shutil.rmtree(app_dir, ignore_errors=True)
        staging.rename(app_dir)
        shutil.rmtree(download, ignore_errors=True)
        progress(f"Fetched Apicurio Registry {version} in {time.monotonic() - started:.1f}s.")
        return app_dir / _RUN_JAR


# --------------------------------------------------------------------------- readiness


def registry_answers(url: str, timeout: float = 2.0) -> bool:
    """True when the Confluent-compatible API at ``url`` lists its subjects (HTTP 200)."""
    try:
        with urllib.request.urlopen(url + CCOMPAT_PATH + "/subjects", timeout=timeout) as reply:
            json.loads(reply.read())
            return bool(reply.status == 200)
    except (OSError, ValueError):
        return False


# --------------------------------------------------------------------------- the registry


class LocalRegistry(StartedByHand):
    """One Apicurio Registry on loopback with in-memory storage, started and stopped by us.

    ``with LocalRegistry() as registry: registry.ccompat_url`` in scripts;
    ``async with LocalRegistry() as registry:`` in asyncio code. Every start is an empty
    registry (its storage is the JVM's memory). ``overrides`` are more Apicurio or Quarkus
    settings, as system properties (e.g. ``{"apicurio.ccompat.legacy-id-mode.enabled":
    "true"}``).
    """

    def __init__(
        self,
        *,
        version: str = APICURIO_VERSION,
        cache_dir: Path | None = None,
        port: int | None = None,
        management_port: int | None = None,
        overrides: Mapping[str, str] | None = None,
        heap: str = "256m",
        startup_timeout: float = 120.0,
        shutdown_timeout: float = 10.0,
        progress: Progress = _quiet,
    ) -> None:
        self.version = version
        self.cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        self._requested_port = port
        self._requested_management_port = management_port
        self._overrides = dict(overrides or {})
        self.heap = heap
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
        self._progress = progress
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self.settings: RegistrySettings | None = None
        self.workdir: Path | None = None

    # -- public

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the registry's base URL."""
        return self._running_settings().url

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API (``<url>/apis/ccompat/v7``): the URL to give Confluent
        clients as ``schema.registry.url``."""
        return self._running_settings().ccompat_url

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def log_file(self) -> Path | None:
        return None if self.workdir is None else self.workdir / "registry.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalRegistry:
        """Fetch the registry once, launch it and wait until its Confluent API answers."""
        if self._proc is not None:
            raise ProvisioningError("the local schema registry is already started")
        java = find_registry_java()
        run_jar = resolve_registry(self.version, self.cache_dir, self._progress)
        self._tmpdir = tempfile.TemporaryDirectory(prefix="streamjoin-registry-")
        self.workdir = Path(self._tmpdir.name)
        fixed = self._requested_port is not None or self._requested_management_port is not None
        # A free port can be taken between our probe and the JVM's bind: retry with new ones
        # when the registry dies during startup (not when it hangs).
        attempts = 1 if fixed else 3
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            started = time.monotonic()
            try:
                self._launch(java, run_jar)
                exited = self._wait_ready(started)
            except BaseException:
                self.stop()
                raise
            if exited is None:
                break
            self._terminate()
            if attempt == attempts or not exited_for_a_taken_port(exited):
                self._cleanup()
                raise ProvisioningError(exited)
            self._progress("the registry exited during startup; retrying with new ports")
        self._progress(
            f"Schema registry ready at {self.ccompat_url} in {time.monotonic() - started:.1f}s"
        )
        return self

    def stop(self) -> None:
        """SIGTERM (Quarkus shuts down in well under a second); SIGKILL past
        ``shutdown_timeout``. Removes the work directory and its logs."""
        self._terminate()
        self._cleanup()

    # -- internals

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        end_process(proc, self.shutdown_timeout)

    def _cleanup(self) -> None:
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def _running_settings(self) -> RegistrySettings:
        if self.settings is None or self._proc is None:
            raise ProvisioningError("the local schema registry is not running; call start() first")
        return self.settings

    def _choose_settings(self) -> RegistrySettings:
        port = self._requested_port or free_port()
        management = self._requested_management_port
        if management is None or management == port:
            management = free_port(exclude=frozenset({port}))
        return RegistrySettings(port=port, management_port=management)

    def _launch(self, java: str, run_jar: Path) -> None:
        if self.workdir is None:
            raise ProvisioningError("no work directory")
        self.settings = self._choose_settings()
        cmd = registry_command(
            java, run_jar, self.settings, heap=self.heap, overrides=self._overrides
        )
        self._progress(f"Starting Apicurio Registry {self.version} on {self.settings.url}")
        with (self.workdir / "registry.log").open("wb") as log:
            self._proc = _spawn(cmd, log)

    def _log_tail(self, lines: int = 30) -> str:
        path = self.log_file
        if path is None or not path.exists():
            return "(no registry output)"
        text = path.read_text(errors="replace").strip().splitlines()[-lines:]
        return "\n".join(text) or "(no registry output)"

    def _wait_ready(self, started: float) -> str | None:
        """Until the Confluent API answers (None); what went wrong when the JVM exited."""
        if self._proc is None or self.settings is None:
            raise ProvisioningError("the registry process was not started")
        deadline = started + self.startup_timeout
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                return (
                    f"the schema registry exited with code {code} during startup:\n"
                    f"{self._log_tail()}"
                )
            if registry_answers(self.settings.url):
                return None
            time.sleep(0.25)
        raise ProvisioningError(
            f"the schema registry did not answer on {self.settings.ccompat_url} within "
            f"{self.startup_timeout:.0f}s:\n{self._log_tail()}"
        )
