"""The broker a benchmark runs against: a loopback broker the user names, or a fresh LocalKafka.

Benchmarks flood the broker, so an address given by the user must resolve to loopback only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Iterator


def check_loopback(bootstrap: str) -> str:
    """``bootstrap`` unchanged if every server in it resolves to loopback; else SystemExit."""
    for server in bootstrap.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise SystemExit(f"--bootstrap: {server!r} is not host:port")
        host = host.strip("[]")
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, int(port))}
        except OSError as exc:
            raise SystemExit(f"--bootstrap: cannot resolve {host!r}: {exc}") from exc
        for address in addresses:
            if not ipaddress.ip_address(str(address).split("%")[0]).is_loopback:
                raise SystemExit(
                    f"--bootstrap: {server!r} resolves to {address}, not a loopback "
                    "address; this benchmark only runs against a local broker"
                )
    return bootstrap


@contextlib.contextmanager
def broker(
    bootstrap: str | None, progress: Callable[[str], None], *, heap: str | None = None
) -> Iterator[str]:
    """The bootstrap address of ``bootstrap`` (checked) or of a LocalKafka (with ``heap``,
    else its default) started for the duration of the block."""
    if bootstrap:
        yield check_loopback(bootstrap)
        return
    from streamjoin.local_kafka import LocalKafka

    with LocalKafka(progress=progress, **({} if heap is None else {"heap": heap})) as kafka:
        yield kafka.bootstrap_servers
