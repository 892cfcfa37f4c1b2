"""The fault proxy (streamjoin/testing/fault_proxy.py) against a local echo server: each
fault as a client and the server see it, and the pacing core on its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest

from streamjoin.errors import ConfigurationError, LifecycleError
from streamjoin.local_kafka import LOOPBACK
from streamjoin.testing.fault_proxy import BrokerProxies, FaultProxy, Faults, Pacing

#: how long a test watches for something that must not happen (it can only hide a
#: failure, never cause one)
QUIET = 0.3


@dataclass
class EchoServer:
    """Echoes what it reads; remembers its connections and how each one ended."""

    port: int = 0
    accepted: int = 0
    received: bytearray = field(default_factory=bytearray)
    endings: list[str] = field(default_factory=list)  #: "eof" or "reset", per connection
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        ending = "eof"
        try:
            while data := await reader.read(65_536):
                self.received += data
                writer.write(data)
                await writer.drain()
        except OSError:
            ending = "reset"
        except asyncio.CancelledError:  # the test ended first
            ending = "cancelled"
        self.endings.append(ending)
        self.ended.set()
        writer.close()


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    server = EchoServer()
    listener = await asyncio.start_server(server.serve, LOOPBACK, 0)
    server.port = listener.sockets[0].getsockname()[1]
    yield server
    listener.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy((LOOPBACK, echo.port)) as started:
        yield started


async def connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(LOOPBACK, proxy.port)


async def round_trip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), 10)


async def wait_until(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


async def test_without_faults_bytes_pass_both_ways_and_are_counted(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    reader, writer = await connect(proxy)
    payload = bytes(range(256)) * 1000
    assert await round_trip(reader, writer, payload) == payload
    stats = proxy.stats()
    assert (stats.connections, stats.open_connections) == (1, 1)
    assert stats.bytes_upstream == stats.bytes_downstream == len(payload)
    writer.close()
    await echo.ended.wait()
    assert echo.endings == ["eof"]  # the client's FIN reached the server as a FIN
    await wait_until(lambda: proxy.stats().open_connections == 0)


async def test_latency_delays_each_direction_and_keeps_order_under_jitter(
    proxy: FaultProxy,
) -> None:
    reader, writer = await connect(proxy)
    proxy.latency(100, jitter_ms=50)
    assert proxy.faults == Faults(latency_s=0.1, jitter_s=0.05)
    started = time.monotonic()
    assert await round_trip(reader, writer, b"ping") == b"ping"
    assert time.monotonic() - started >= 0.2  # 100 ms each way
    messages = [f"<{i}>".encode() for i in range(200)]
    for message in messages:  # many small writes, each held a different time
        writer.write(message)
        await asyncio.sleep(0)
    echoed = await asyncio.wait_for(reader.readexactly(sum(map(len, messages))), 10)
    assert echoed == b"".join(messages)
    writer.close()


async def test_bandwidth_limits_bytes_per_second_each_way(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    proxy.bandwidth(50_000)
    payload = b"x" * 25_000
    started = time.monotonic()
    assert await round_trip(reader, writer, payload) == payload
    # pieces of 2,500 bytes: all but the first wait for the link
    assert time.monotonic() - started >= (25_000 - 2_500) / 50_000
    proxy.bandwidth(None)
    assert proxy.faults.bytes_per_s is None
    writer.close()


async def test_reset_ends_every_open_connection_with_an_rst_on_both_sides(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    clients = [await connect(proxy) for _ in range(3)]
    for reader, writer in clients:
        assert await round_trip(reader, writer, b"hi") == b"hi"
    proxy.reset()
    for reader, _ in clients:
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(10), 10)
    await wait_until(lambda: len(echo.endings) == 3)
    assert echo.endings == ["reset"] * 3
    assert proxy.stats().resets == 3
    reader, writer = await connect(proxy)  # the proxy itself goes on
    assert await round_trip(reader, writer, b"again") == b"again"
    writer.close()


async def test_blackhole_holds_bytes_and_new_connections_until_healed(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer, b"before") == b"before"
    proxy.blackhole()
    writer.write(b"during")
    late_reader, late_writer = await connect(proxy)  # accepted, but never reaches the server
    late_writer.write(b"new")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(10), QUIET)
    assert bytes(echo.received) == b"before"
    assert echo.accepted == 1
    proxy.heal()
    assert await asyncio.wait_for(reader.readexactly(6), 10) == b"during"
    assert await asyncio.wait_for(late_reader.readexactly(3), 10) == b"new"
    assert echo.accepted == 2
    writer.close()
    late_writer.close()


async def test_refuse_resets_new_connections_and_leaves_open_ones_alone(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer, b"open") == b"open"  # accepted by the proxy
    proxy.refuse()
    with pytest.raises(ConnectionResetError):  # at the connect, or at the first read
        refused_reader, _ = await connect(proxy)
        await asyncio.wait_for(refused_reader.read(10), 10)
    assert await round_trip(reader, writer, b"still") == b"still"
    assert echo.accepted == 1
    proxy.heal()
    new_reader, new_writer = await connect(proxy)
    assert await round_trip(new_reader, new_writer, b"ok") == b"ok"
    writer.close()
    new_writer.close()


async def test_half_open_closes_the_server_side_and_never_answers_the_client(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer, b"hello") == b"hello"
    proxy.half_open()
    await asyncio.wait_for(echo.ended.wait(), 10)
    assert echo.endings == ["eof"]  # the server saw its side closed
    writer.write(b"anyone?")  # the client's side is open: writes go nowhere
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(10), QUIET)  # no answer, and no end either
    assert bytes(echo.received) == b"hello"
    assert proxy.stats().open_connections == 1
    writer.close()  # the client gives up
    await wait_until(lambda: proxy.stats().open_connections == 0)
    new_reader, new_writer = await connect(proxy)  # new connections are served again
    assert await round_trip(new_reader, new_writer, b"ok") == b"ok"
    new_writer.close()


async def test_a_server_that_is_down_is_a_reset_for_the_client() -> None:
    with FaultProxy((LOOPBACK, 1)) as proxy, pytest.raises(ConnectionResetError):
        reader, _ = await connect(proxy)  # nothing listens on port 1
        await asyncio.wait_for(reader.read(10), 10)


def test_controls_check_their_arguments_and_need_a_started_proxy() -> None:
    proxy = FaultProxy((LOOPBACK, 1))
    with pytest.raises(LifecycleError, match="not started"):
        proxy.blackhole()
    with proxy:
        with pytest.raises(ConfigurationError, match="latency must be >= 0 ms"):
            proxy.latency(-1)
        with pytest.raises(ConfigurationError, match="bandwidth must be > 0"):
            proxy.bandwidth(0)
        with pytest.raises(LifecycleError, match="already started"):
            proxy.start()
        proxy.latency(5)
        proxy.bandwidth(1_000)
        proxy.blackhole()
        proxy.refuse()
        proxy.heal()
        assert proxy.faults == Faults()


def test_pacing_keeps_order_whatever_the_jitter() -> None:
    draws = iter([0.9, 0.0, 0.5, 0.0])
    pacing = Pacing(random_fraction=lambda: next(draws))
    faults = Faults(latency_s=0.1, jitter_s=0.1)
    releases = [pacing.release_at(t, faults) for t in (0.0, 0.01, 0.02, 0.5)]
    assert releases == pytest.approx([0.19, 0.19, 0.19, 0.6])
    assert releases == sorted(releases)


def test_pacing_spaces_pieces_by_the_bandwidth_and_queues_behind_earlier_chunks() -> None:
    pacing = Pacing()
    faults = Faults(bytes_per_s=1_000)
    assert pacing.schedule(0.0, 120, faults) == [(0.0, 50), (0.05, 50), (0.1, 20)]
    # read at once after it: waits for the link to send the first chunk's 120 bytes
    ((send_at, size),) = pacing.schedule(0.0, 10, faults)
    assert send_at == pytest.approx(0.12)
    assert size == 10
    assert pacing.schedule(5.0, 10, faults) == [(5.0, 10)]  # an idle link sends at once
    assert Pacing().schedule(1.0, 10**6, Faults()) == [(1.0, 10**6)]


async def test_broker_proxies_give_each_broker_a_proxy_that_keeps_its_port(
    echo: EchoServer,
) -> None:
    other = EchoServer()
    listener = await asyncio.start_server(other.serve, LOOPBACK, 0)
    proxies = BrokerProxies()
    try:
        advertised = proxies(1, echo.port)  # as LocalKafka(advertise=proxies) calls it
        assert proxies(2, echo.port) != advertised
        reader, writer = await asyncio.open_connection(LOOPBACK, advertised)
        assert await round_trip(reader, writer, b"one") == b"one"
        writer.close()
        # the broker came back on another port: same proxy, same advertised port
        assert proxies(1, listener.sockets[0].getsockname()[1]) == advertised
        reader, writer = await asyncio.open_connection(LOOPBACK, advertised)
        assert await round_trip(reader, writer, b"two") == b"two"
        assert bytes(other.received) == b"two"
        proxies.blackhole()
        assert all(proxies[n].faults.blackholed for n in (1, 2))
        proxies.heal()
        assert (proxies.stats().connections, proxies.stats().bytes_upstream) == (2, 6)
        writer.close()
    finally:
        proxies.stop()
        listener.close()
