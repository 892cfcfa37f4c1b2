"""A TCP proxy that injects network faults between clients and one upstream server.

Tests put it between a worker and its broker (``LocalKafka(advertise=...)`` makes the broker
advertise the proxy's port, so every connection a client opens, bootstrap or not, goes through
it) and then make the network slow, cut or broken while the worker runs:

- :meth:`FaultProxy.latency`: each chunk of bytes is held ``ms`` (plus up to ``jitter_ms``)
  in each direction before it is passed on; order is always kept, as TCP keeps it;
- :meth:`FaultProxy.bandwidth`: at most that many bytes a second in each direction;
- :meth:`FaultProxy.reset`: every open connection is reset (RST, to both sides) at once;
- :meth:`FaultProxy.blackhole`: nothing is forwarded in either direction and new connections
  are accepted but never reach the server: a network partition. Bytes are held, not dropped
  (TCP retransmits until the path is back), so a connection that outlives the cut carries
  on after :meth:`FaultProxy.heal`; clients that time out close theirs meanwhile;
- :meth:`FaultProxy.refuse`: new connections are reset as soon as they are accepted;
- :meth:`FaultProxy.half_open`: the server side of every open connection is closed while the
  client side stays open and is never answered (what a client sees when a firewall or NAT
  forgets its connection, or the server's host died without a word);
- :meth:`FaultProxy.heal`: all of the above off; held bytes flow again.

The proxy runs its own event loop in a background thread, so synchronous tests, asyncio
tests (on another loop) and worker subprocesses can all use it; its controls are thread-safe
and take effect before they return. This is the imperative shell; :class:`Pacing` (when
each chunk may be delivered) is the pure part.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from streamjoin.errors import ConfigurationError, LifecycleError
from streamjoin.local_kafka import LOOPBACK, LocalKafka, StartedByHand

__all__ = [
    "BrokerProxies",
    "FaultProxy",
    "Faults",
    "Pacing",
    "ProxyStats",
    "broker_behind_proxy",
]

#: bytes read from a socket at a time
CHUNK = 65_536
#: chunks read ahead of delivery per direction: bounds what the proxy buffers, so a slow
#: direction pushes back on its sender as a slow network would
READ_AHEAD = 16
#: seconds a control waits for the proxy's loop to apply it
CONTROL_TIMEOUT = 10.0

T = TypeVar("T")


@dataclass(frozen=True)
class Faults:
    """The faults in force; replaced as a whole by each control."""

    latency_s: float = 0.0
    jitter_s: float = 0.0
    bytes_per_s: float | None = None
    blackholed: bool = False
    refusing: bool = False


@dataclass(frozen=True)
class ProxyStats:
    """What went through the proxy since it started."""

    connections: int  #: connections accepted
    open_connections: int
    bytes_upstream: int  #: client -> server, forwarded
    bytes_downstream: int  #: server -> client, forwarded
    resets: int  #: connections ended by :meth:`FaultProxy.reset` or :meth:`FaultProxy.refuse`


@dataclass
class Pacing:
    """When the bytes of one direction may be sent (pure: times in, times out).

    Latency and jitter hold a chunk from when it was read, but never past a chunk read after
    it (order is kept, as TCP keeps it); a bandwidth limit keeps the link busy ``size /
    bytes_per_s`` per chunk and trickles the chunk out in pieces of a twentieth of a second."""

    random_fraction: Callable[[], float] = random.random
    _last_release: float = field(default=0.0, init=False)
    _link_free: float = field(default=0.0, init=False)  #: when the bytes so far are sent

    def release_at(self, read_at: float, faults: Faults) -> float:
        """When a chunk read at ``read_at`` has waited out the latency."""
        held = faults.latency_s + faults.jitter_s * self.random_fraction()
        self._last_release = max(read_at + held, self._last_release)
        return self._last_release

    def schedule(self, ready_at: float, size: int, faults: Faults) -> list[tuple[float, int]]:
        """``(send at, bytes)`` pieces for a chunk of ``size`` bytes released at
        ``ready_at``: all at once without a bandwidth limit, else spaced by the limit."""
        rate = faults.bytes_per_s
        if not rate:
            return [(ready_at, size)]
        start = max(ready_at, self._link_free)
        piece = max(1, int(rate / 20))
        pieces = [(start + sent / rate, min(piece, size - sent)) for sent in range(0, size, piece)]
        self._link_free = start + size / rate
        return pieces


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST instead of a FIN (SO_LINGER 0): the peer sees a connection reset."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One proxied connection: the client's socket, the server's, and the two pumps."""

    def __init__(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        self.client_reader = client_reader
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.pumps: list[asyncio.Task[None]] = []
        self.half_open = False
        self.swallowing: asyncio.Task[None] | None = None
        self.handler = asyncio.current_task()  #: the proxy's task serving this connection

    def reset(self) -> None:
        """Both sides get an RST."""
        for task in (*self.pumps, self.swallowing, self.handler):
            if task is not None:
                task.cancel()
        _abort(self.client)
        if self.server is not None:
            _abort(self.server)

    def drop_server_side(self) -> None:
        """Half-open: close towards the server; keep the client's socket, swallow what it
        sends and never answer."""
        self.half_open = True
        for task in self.pumps:
            task.cancel()
        if self.server is not None:
            self.server.close()
        self.swallowing = asyncio.ensure_future(self._swallow())

    async def _swallow(self) -> None:
        with contextlib.suppress(OSError):
            while await self.client_reader.read(CHUNK):
                pass
        self.client.close()


class FaultProxy(StartedByHand):
    """A loopback TCP proxy to ``upstream`` with switchable network faults (see the module
    docstring). ``with FaultProxy(("127.0.0.1", 9092)) as proxy: proxy.port``."""

    def __init__(self, upstream: tuple[str, int], *, host: str = LOOPBACK, port: int = 0) -> None:
        self.upstream = upstream
        self.host = host
        self._requested_port = port
        self._faults = Faults()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._flowing: asyncio.Event | None = None  #: set unless black-holed
        self._lock = threading.Lock()
        self._connections = 0
        self._bytes = {"up": 0, "down": 0}
        self._resets = 0
        self.port = 0

    # -- lifecycle

    def start(self) -> FaultProxy:
        """Listen (on ``port``, or a free one: see :attr:`port`) and start forwarding."""
        if self._thread is not None:
            raise LifecycleError("the fault proxy is already started")
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # handed to the starting thread
                failure.append(exc)
                loop.close()
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(
            target=run, name=f"fault-proxy-{self.upstream}", daemon=True
        )
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = self._loop = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Close the listener and every connection (with a reset) and end the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(LifecycleError, TimeoutError):
            self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CONTROL_TIMEOUT)
        self._loop = self._thread = None

    @property
    def address(self) -> str:
        """``host:port`` clients connect to."""
        return f"{self.host}:{self.port}"

    # -- controls (thread-safe; each is in force when it returns)

    def latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        """Hold each chunk ``ms`` (plus a random 0..``jitter_ms``) in each direction, so a
        round trip gains twice that; order is kept."""
        if ms < 0 or jitter_ms < 0:
            raise ConfigurationError(
                f"latency must be >= 0 ms, got {ms} ms (jitter {jitter_ms} ms)"
            )
        self._set(latency_s=ms / 1000, jitter_s=jitter_ms / 1000)

    def bandwidth(self, bytes_per_s: float | None) -> None:
        """At most ``bytes_per_s`` bytes a second in each direction (``None``: no limit)."""
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ConfigurationError(f"bandwidth must be > 0 bytes/s or None, got {bytes_per_s}")
        self._set(bytes_per_s=bytes_per_s)

    def blackhole(self, on: bool = True) -> None:
        """Forward nothing either way and let new connections hang (``on=False`` ends it)."""
        self._set(blackholed=on)

    def refuse(self, on: bool = True) -> None:
        """Reset each new connection as soon as it is accepted (open ones are left alone)."""
        self._set(refusing=on)

    def reset(self) -> None:
        """Reset every open connection now (RST to both sides)."""
        self._call(self._reset_all())

    def half_open(self) -> None:
        """Close the server side of every open connection; the client side stays open and
        unanswered until the client gives up on it."""
        self._call(self._half_open_all())

    def heal(self) -> None:
        """No latency, bandwidth limit, black hole or refusal; held bytes flow again."""
        self._set(**asdict(Faults()))

    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(
                connections=self._connections,
                open_connections=len(self._links),
                bytes_upstream=self._bytes["up"],
                bytes_downstream=self._bytes["down"],
                resets=self._resets,
            )

    @property
    def faults(self) -> Faults:
        return self._faults

    # -- the loop's side

    def _set(self, **changes: Any) -> None:
        async def apply() -> None:  # (on the proxy's loop: controls apply one at a time)
            self._faults = faults = replace(self._faults, **changes)
            if self._flowing is not None:
                if faults.blackholed:
                    self._flowing.clear()
                else:
                    self._flowing.set()

        self._call(apply())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None:
            coro.close()
            raise LifecycleError("the fault proxy is not started")
        if threading.current_thread() is self._thread:
            coro.close()
            raise LifecycleError("fault proxy controls must be called from outside its own loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(CONTROL_TIMEOUT)

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, self.host, self._requested_port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        handlers = [link.handler for link in self._links if link.handler is not None]
        for link in list(self._links):
            link.reset()
        self._links.clear()
        if handlers:
            await asyncio.wait(handlers, timeout=CONTROL_TIMEOUT / 2)

    async def _reset_all(self) -> None:
        links = list(self._links)
        for link in links:
            link.reset()
        self._links.difference_update(links)
        with self._lock:
            self._resets += len(links)

    async def _half_open_all(self) -> None:
        for link in self._links:
            if not link.half_open:
                link.drop_server_side()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # the connection's own task, awaited by nobody: ending it by a reset is its normal
        # end (and asyncio 3.11's server callback cannot take a cancelled task)
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self._connections += 1
        if self._faults.refusing:
            with self._lock:
                self._resets += 1
            _abort(writer)
            return
        link = _Link(reader, writer)
        self._links.add(link)
        try:
            await self._flowing_now()  # black-holed: a new connection hangs here
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                _abort(writer)  # the server refused: so does the proxy
                return
            link.server = up_writer
            link.pumps = [
                asyncio.ensure_future(self._pump(link, reader, up_writer, "up")),
                asyncio.ensure_future(self._pump(link, up_reader, writer, "down")),
            ]
            await asyncio.gather(*link.pumps, return_exceptions=True)
            if link.swallowing is not None:  # half-open: until the client gives up
                await asyncio.gather(link.swallowing, return_exceptions=True)
        finally:
            self._links.discard(link)
            if link.server is not None:
                link.server.close()
            writer.close()

    async def _flowing_now(self) -> None:
        if self._flowing is not None:
            await self._flowing.wait()

    async def _pump(
        self,
        link: _Link,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        direction: str,
    ) -> None:
        """Read from ``source`` and deliver to ``sink`` as the faults say. An end of stream
        is passed on as one (FIN) once what came before it is delivered; a reset, or a
        failed write, resets the whole connection."""
        loop = asyncio.get_running_loop()
        pacing = Pacing()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(READ_AHEAD)
        deliver = asyncio.ensure_future(self._deliver(queue, sink, direction, pacing))
        try:
            while True:
                await self._flowing_now()
                data = await source.read(CHUNK)
                if not data:
                    break
                await queue.put((pacing.release_at(loop.time(), self._faults), data))
            await queue.put(None)
            await deliver
            if sink.can_write_eof() and not sink.is_closing():
                sink.write_eof()
        except OSError:
            link.reset()
        finally:
            deliver.cancel()

    async def _deliver(
        self,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        sink: asyncio.StreamWriter,
        direction: str,
        pacing: Pacing,
    ) -> None:
        loop = asyncio.get_running_loop()
        while (item := await queue.get()) is not None:
            released, data = item
            sent = 0
            for send_at, size in pacing.schedule(released, len(data), self._faults):
                if (wait := send_at - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await self._flowing_now()
                with self._lock:  # (counted as handed to the socket: before the peer reads it)
                    self._bytes[direction] += size
                sink.write(data[sent : sent + size])
                sent += size
                await sink.drain()


class BrokerProxies:
    """A :class:`FaultProxy` in front of each broker's CLIENT listener: pass it as
    ``LocalKafka(advertise=...)`` (or to a cluster) and the brokers advertise the proxies,
    so every connection a client opens after bootstrapping goes through one too.

    The controls apply to every proxy at once; ``proxies[node_id]`` is one broker's. Test
    clients that must not be affected (producers of test traffic, checkers) connect to
    the brokers' INTERNAL listener (``internal_bootstrap_servers``) instead."""

    def __init__(self) -> None:
        self.proxies: dict[int, FaultProxy] = {}

    def __call__(self, node_id: int, client_listen_port: int) -> int:
        """The port broker ``node_id`` advertises: its proxy's (started on first use)."""
        proxy = self.proxies.get(node_id)
        if proxy is None:
            proxy = self.proxies[node_id] = FaultProxy((LOOPBACK, client_listen_port)).start()
        else:
            proxy.upstream = (LOOPBACK, client_listen_port)
        return proxy.port

    def __getitem__(self, node_id: int) -> FaultProxy:
        return self.proxies[node_id]

    def _each(self, control: Callable[[FaultProxy], None]) -> None:
        for proxy in self.proxies.values():
            control(proxy)

    def latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        self._each(lambda proxy: proxy.latency(ms, jitter_ms))

    def bandwidth(self, bytes_per_s: float | None) -> None:
        self._each(lambda proxy: proxy.bandwidth(bytes_per_s))

    def blackhole(self, on: bool = True) -> None:
        self._each(lambda proxy: proxy.blackhole(on))

    def refuse(self, on: bool = True) -> None:
        self._each(lambda proxy: proxy.refuse(on))

    def reset(self) -> None:
        self._each(FaultProxy.reset)

    def half_open(self) -> None:
        self._each(FaultProxy.half_open)

    def heal(self) -> None:
        self._each(FaultProxy.heal)

    def stats(self) -> ProxyStats:
        """All proxies' counters added up."""
        each = [proxy.stats() for proxy in self.proxies.values()]
        return ProxyStats(
            *(sum(getattr(s, name) for s in each) for name in ProxyStats.__dataclass_fields__)
        )

    def stop(self) -> None:
        self._each(FaultProxy.stop)
        self.proxies.clear()


@contextlib.contextmanager
def broker_behind_proxy(**options: Any) -> Iterator[tuple[LocalKafka, BrokerProxies]]:
    """A started :class:`~streamjoin.local_kafka.LocalKafka` (``options`` are its keywords)
    whose clients all go through a :class:`FaultProxy`; both stopped on exit. Clients of
    ``kafka.bootstrap_servers`` are proxied, of ``kafka.internal_bootstrap_servers`` not."""
    proxies = BrokerProxies()
    kafka = LocalKafka(advertise=proxies, **options)
    try:
        kafka.start()
        yield kafka, proxies
    finally:
        kafka.stop()
        proxies.stop()
