"""An app's settings, validated once into a frozen value (pure: no I/O).

:class:`AppConfig`'s keywords are the settings: ``App(id, **settings)`` is
``AppConfig(id, **settings)``, and the CLI's overrides (``--broker``, ``--state-dir``,
``--instance-id``) and ``app.configure(...)`` go through :meth:`AppConfig.replace`,
so a setting is declared once, here, and checked the same way wherever it comes from.
Credentials in the client options are held as :class:`Secret` and never appear in a
repr or a log.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from streamjoin.codecs import Codec, resolve_codec
from streamjoin.errors import ConfigurationError

if TYPE_CHECKING:
    from streamjoin.state.rocksdb import RocksDBOptions

__all__ = [
    "DEFAULT_COMMIT_INTERVAL",
    "PROCESSING_GUARANTEES",
    "REBALANCE_PROTOCOLS",
    "SETTING_NAMES",
    "AppConfig",
    "Secret",
    "check_setting_names",
    "parse_broker_url",
]

#: "at_least_once": a crash replays what was processed since the last commit;
#: "exactly_once": each commit is one Kafka transaction (outputs, changelogs, offsets)
PROCESSING_GUARANTEES = ("at_least_once", "exactly_once")
#: commit_interval when the app does not set one (Kafka Streams' defaults: a transaction
#: holds back read_committed readers until it commits, so exactly-once commits often)
DEFAULT_COMMIT_INTERVAL = {"at_least_once": 1.0, "exactly_once": 0.1}
#: "cooperative": incremental rebalancing (KIP-429); "eager": every rebalance revokes everything
REBALANCE_PROTOCOLS = ("cooperative", "eager")
_APP_ID = re.compile(r"[A-Za-z0-9._-]+")
_BROKER_SCHEME = re.compile(r"^(kafka|tcp)://", re.IGNORECASE)
#: client option names whose values are credentials (or hold them: a JAAS line, a PEM key)
_SECRET_OPTION = re.compile(
    r"password|passwd|secret|token|credential|jaas|private.?key|keystore.?key|api.?key",
    re.IGNORECASE,
)


class Secret:
    """A credential: usable by the client, invisible in reprs, logs and error messages."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def reveal(self) -> Any:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("secret", id(self)))


def parse_broker_url(broker: str) -> str:
    """``kafka://h1:9092,h2:9092`` (scheme optional, per host or once) -> ``h1:9092,h2:9092``."""
    if not isinstance(broker, str):
        raise ConfigurationError(
            f"broker must be a string like 'kafka://host:9092', got {broker!r}"
        )
    servers = []
    for part in broker.split(","):
        part = _BROKER_SCHEME.sub("", part.strip()).rstrip("/")
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigurationError(
                f"broker {broker!r}: expected host:port entries like 'kafka://127.0.0.1:9092', "
                f"got {part!r}"
            )
        servers.append(part)
    if not servers:
        raise ConfigurationError(f"broker {broker!r} names no host:port")
    return ",".join(servers)


def _hide_secrets(options: Mapping[str, Any] | None, what: str) -> Mapping[str, Any]:
    if options is None:
        return MappingProxyType({})
    if not isinstance(options, Mapping):
        raise ConfigurationError(  # (not its repr: it may hold credentials)
            f"{what} must be a mapping of option names, got a {type(options).__name__}"
        )
    out: dict[str, Any] = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise ConfigurationError(f"{what}: option names are strings, got {name!r}")
        hidden = _SECRET_OPTION.search(name) and value is not None
        out[name] = Secret(value) if hidden and not isinstance(value, Secret) else value
    return MappingProxyType(out)


def reveal(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options as the Kafka clients take them (secrets revealed)."""
    return {k: v.reveal() if isinstance(v, Secret) else v for k, v in options.items()}


def _int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigurationError(f"{name} must be an int >= {low}, got {value!r}")


def _check_web(port: Any, host: Any, status_log_interval: Any) -> None:
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
    ):
        raise ConfigurationError(
            f"web_port must be a port number 0-65535 (0: any free port) or None, got {port!r}"
        )
    if not isinstance(host, str) or not host.strip():
        raise ConfigurationError(f"web_host must be a host name or address, got {host!r}")
    interval = status_log_interval
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0
    ):
        raise ConfigurationError(
            f"status_log_interval must be > 0 (seconds) or None (none), got {interval!r}"
        )


@dataclass(frozen=True)
class AppConfig:
    """Every setting of an App, validated (see :class:`streamjoin.App` for what each means).

    The one declaration of the settings, their types and defaults: ``App(id, **settings)``
    takes exactly these keywords. After validation the values are normalized (the broker
    URL parsed, ``state_dir`` a Path, credentials :class:`Secret`, mappings read-only).
    """

    id: str
    _: KW_ONLY
    broker: str = "kafka://127.0.0.1:9092"
    #: default codecs of topics: a codec name, a Codec or a dataclass type (None: the default)
    key_serializer: str | Codec | type | None = "raw"
    value_serializer: str | Codec | type | None = "json"
    commit_interval: float | None = None
    processing_guarantee: str = "at_least_once"
    transaction_timeout_ms: int = 10_000
    standby_replicas: int = 0
    state_dir: str | os.PathLike[str] | None = None
    group_instance_id: str | None = None
    topic_partitions: int = 8
    #: replicas of the topics streamjoin creates without a replication_factor of their own
    #: (changelogs, repartition topics, outputs): "auto" = min(3, brokers in the cluster)
    topic_replication_factor: int | Literal["auto"] = "auto"
    client_options: Mapping[str, Any] = field(default_factory=dict)
    consumer_options: Mapping[str, Any] = field(default_factory=dict)
    producer_options: Mapping[str, Any] = field(default_factory=dict)
    capacity: int = 1
    tags: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None
    align_idle_ms: int = 0
    align_max_idle_ms: int = 5_000
    rebalance_protocol: str = "cooperative"
    high_availability: bool = False
    acceptable_recovery_lag: int = 10_000
    max_warmup_replicas: int = 2
    probing_rebalance_interval: float = 600.0
    web_port: int | None = None
    web_host: str = "127.0.0.1"
    #: the bearer token ``GET /tables/...`` wants (a :class:`Secret` once validated)
    query_token: Secret | str | None = None
    #: HTTPS for the web server: its certificate (then its chain) and private key, PEM files
    web_tls_cert: str | os.PathLike[str] | None = None
    web_tls_key: str | os.PathLike[str] | None = None
    #: the password of an encrypted ``web_tls_key`` (a :class:`Secret` once validated)
    web_tls_key_password: Secret | str | None = None
    #: mutual TLS: clients (other workers too) must present a certificate this CA signed
    web_tls_client_ca: str | os.PathLike[str] | None = None
    #: the CAs other workers' HTTPS servers are verified against when a read is forwarded
    #: (None: the system's trusted CAs)
    web_tls_ca: str | os.PathLike[str] | None = None
    status_log_interval: float | None = 30.0
    startup_timeout: float = 60.0
    shutdown_timeout: float = 30.0
    #: tuning of every RocksDB store (None: RocksDBOptions' defaults)
    rocksdb: RocksDBOptions | None = None
    #: ``key_serializer`` / ``value_serializer`` resolved (derived, not settings)
    key_codec: Codec = field(init=False, repr=False)
    value_codec: Codec = field(init=False, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalized values are written once, here
        if not isinstance(self.id, str) or not _APP_ID.fullmatch(self.id):
            raise ConfigurationError(
                f"app id {self.id!r} must be non-empty and use only letters, digits, '.', '_', "
                "'-' (it names the consumer group and internal topics)"
            )
        set_(self, "broker", parse_broker_url(self.broker))
        set_(self, "key_codec", _codec(self.key_serializer, default="raw"))
        set_(self, "value_codec", _codec(self.value_serializer, default="json"))
        if self.rocksdb is not None:
            from streamjoin.state.rocksdb import RocksDBOptions  # (loads rocksdict: only if set)

            if not isinstance(self.rocksdb, RocksDBOptions):
                raise ConfigurationError(
                    "rocksdb must be a streamjoin.state.RocksDBOptions (or None for its "
                    f"defaults), got {type(self.rocksdb).__qualname__}"
                )
        if self.processing_guarantee not in PROCESSING_GUARANTEES:
            raise ConfigurationError(
                f"processing_guarantee {self.processing_guarantee!r} is not supported; "
                f"choose one of {PROCESSING_GUARANTEES}"
            )
        if self.commit_interval is None:
            set_(self, "commit_interval", DEFAULT_COMMIT_INTERVAL[self.processing_guarantee])
        interval = self.commit_interval
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise ConfigurationError(f"commit_interval must be > 0 (seconds), got {interval!r}")
        _int("transaction_timeout_ms", self.transaction_timeout_ms, 1_000)
        if self.exactly_once and self.transaction_timeout_ms < interval * 1000 * 2:
            raise ConfigurationError(
                f"transaction_timeout_ms ({self.transaction_timeout_ms}) must be at least twice "
                f"the commit_interval ({interval} s): a transaction lasts about one interval"
            )
        _int("standby_replicas", self.standby_replicas, 0)
        if self.rebalance_protocol not in REBALANCE_PROTOCOLS:
            raise ConfigurationError(
                f"rebalance_protocol {self.rebalance_protocol!r} is not supported; "
                f"choose one of {REBALANCE_PROTOCOLS}"
            )
        if not isinstance(self.high_availability, bool):
            raise ConfigurationError(
                f"high_availability must be True or False, got {self.high_availability!r}"
            )
        _int("acceptable_recovery_lag", self.acceptable_recovery_lag, 0)
        _int("max_warmup_replicas", self.max_warmup_replicas, 0)
        probing = self.probing_rebalance_interval
        if isinstance(probing, bool) or not isinstance(probing, int | float) or probing <= 0:
            raise ConfigurationError(
                f"probing_rebalance_interval must be > 0 (seconds), got {probing!r}"
            )
        _check_web(self.web_port, self.web_host, self.status_log_interval)
        self._check_web_tls()
        token = self.query_token
        if isinstance(token, str):
            if not token.strip():
                raise ConfigurationError("query_token must be a non-empty string or None")
            set_(self, "query_token", Secret(token))
        elif token is not None and not isinstance(token, Secret):
            raise ConfigurationError(
                f"query_token must be a string or None, got {type(token).__name__}"
            )
        for name in ("startup_timeout", "shutdown_timeout"):
            seconds = getattr(self, name)
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
                raise ConfigurationError(f"{name} must be > 0 (seconds), got {seconds!r}")
        _int("capacity", self.capacity, 1)
        _int("topic_partitions", self.topic_partitions, 1)
        if self.topic_replication_factor != "auto":
            replication = self.topic_replication_factor
            if isinstance(replication, bool) or not isinstance(replication, int) or replication < 1:
                raise ConfigurationError(
                    'topic_replication_factor must be "auto" (min(3, brokers in the cluster)) '
                    f"or an int >= 1, got {replication!r}"
                )
        _int("align_idle_ms", self.align_idle_ms, 0)
        _int("align_max_idle_ms", self.align_max_idle_ms, 0)
        state_dir = self.state_dir if self.state_dir is not None else f"{self.id}-data"
        if not isinstance(state_dir, str | os.PathLike):
            raise ConfigurationError(f"state_dir must be a path, got {state_dir!r}")
        set_(self, "state_dir", Path(state_dir))
        for name in ("group_instance_id", "host"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigurationError(f"{name} must be a non-empty string, got {value!r}")
        tags: object = self.tags
        if tags is None:  # App(tags=None) means none
            set_(self, "tags", {})
        if not isinstance(self.tags, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.tags.items()
        ):
            raise ConfigurationError(f"tags must map strings to strings, got {self.tags!r}")
        set_(self, "tags", MappingProxyType(dict(self.tags)))
        for name in ("client_options", "consumer_options", "producer_options"):
            set_(self, name, _hide_secrets(getattr(self, name), name))

    @classmethod
    def from_options(cls, id: str, **settings: Any) -> AppConfig:
        """``AppConfig(id, **settings)`` for settings not checked statically (``App(...)``
        keywords, CLI options): an unknown name is a :class:`ConfigurationError` naming it."""
        check_setting_names(settings)
        return cls(id, **settings)

    def replace(self, **changes: Any) -> AppConfig:
        """A copy with ``changes`` applied and validated like the original."""
        check_setting_names(changes)
        return dataclasses.replace(self, **changes)

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly_once"

    @property
    def commit_seconds(self) -> float:
        """``commit_interval`` (always set after validation)."""
        return self.commit_interval if self.commit_interval is not None else 1.0

    @property
    def state_path(self) -> Path:
        """``state_dir`` as a Path (always set after validation)."""
        return Path(self.state_dir if self.state_dir is not None else f"{self.id}-data")

    def query_token_value(self) -> str | None:
        """The query token, revealed (for the endpoint's check only)."""
        token = self.query_token
        if isinstance(token, Secret):
            value: str = token.reveal()
            return value
        return token

    @property
    def web_tls(self) -> bool:
        """Whether the web server serves HTTPS (``web_tls_cert`` and ``web_tls_key`` set)."""
        return self.web_tls_cert is not None

    def _check_web_tls(self) -> None:
        set_ = object.__setattr__
        cert, key = self.web_tls_cert, self.web_tls_key
        if (cert is None) != (key is None):
            raise ConfigurationError(
                "web_tls_cert and web_tls_key go together (HTTPS needs the certificate and "
                f"its private key); only {'web_tls_cert' if key is None else 'web_tls_key'} is set"
            )
        for name in ("web_tls_cert", "web_tls_key", "web_tls_client_ca", "web_tls_ca"):
            path = getattr(self, name)
            if path is None:
                continue
            if not isinstance(path, str | os.PathLike) or not str(path).strip():
                raise ConfigurationError(f"{name} must be the path of a PEM file, got {path!r}")
            if cert is None:
                raise ConfigurationError(
                    f"{name} is a setting of HTTPS: it needs web_tls_cert and web_tls_key"
                )
            set_(self, name, Path(path))
        password = self.web_tls_key_password
        if password is None:
            return
        if cert is None:
            raise ConfigurationError(
                "web_tls_key_password is a setting of HTTPS: it needs web_tls_cert and web_tls_key"
            )
        if isinstance(password, str):
            set_(self, "web_tls_key_password", Secret(password))
        elif not isinstance(password, Secret):
            raise ConfigurationError(
                f"web_tls_key_password must be a string or None, got {type(password).__name__}"
            )

    def secret_values(self) -> list[str]:
        """Every credential of these settings, revealed: what logs must never show (the
        query token, the key password, the client options held as :class:`Secret`)."""
        found = [self.query_token, self.web_tls_key_password]
        for options in (self.client_options, self.consumer_options, self.producer_options):
            found.extend(options.values())
        out = []
        for value in found:
            revealed = value.reveal() if isinstance(value, Secret) else None
            if isinstance(revealed, bytes):
                revealed = revealed.decode("utf-8", "replace")
            if isinstance(revealed, str) and revealed:
                out.append(revealed)
        return out

    def client_kwargs(self) -> dict[str, Any]:
        """The options every Kafka client gets, credentials revealed (TLS files such as
        ``ssl_cafile`` made into an ``ssl_context``: see :mod:`streamjoin.client_security`)."""
        from streamjoin.client_security import client_kwargs

        return client_kwargs(reveal(self.client_options))


#: the settings' names: AppConfig's keywords (``id`` aside)
SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(AppConfig) if f.init) - {"id"}


def check_setting_names(names: Iterable[str]) -> None:
    """Refuse setting names AppConfig does not have, naming each (and the closest known one:
    a typo such as ``brokers=`` would otherwise be a TypeError far from its cause)."""
    unknown = sorted(set(names) - SETTING_NAMES)
    if not unknown:
        return
    described = []
    for name in unknown:
        close = difflib.get_close_matches(name, SETTING_NAMES, n=1)
        described.append(f"{name} (did you mean {close[0]!r}?)" if close else name)
    raise ConfigurationError(f"unknown App settings: {', '.join(described)}")


def _codec(serializer: str | Codec | type | None, *, default: str) -> Codec:
    """A key/value serializer setting as a codec (a bad one is a ConfigurationError)."""
    try:
        return resolve_codec(serializer, default=default)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(str(exc)) from exc
