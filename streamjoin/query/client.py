"""``TableClient`` (standard library) and ``AsyncTableClient`` (aiohttp): read tables of a
running app over HTTP, from any process.

It asks the workers' ``GET /tables/<table>/<key>`` endpoint. Hosts are tried in turn:
a host that cannot be reached is skipped; a ``503`` (rebalance, restore) is retried
after the ``Retry-After`` it names, within ``retry_for`` seconds in all; redirects
(``307`` to the owner) are followed. Other answers end the call: the value, or the
error the endpoint named (404, 400, 401) as the matching :class:`QueryError`. Those
decisions are :class:`~streamjoin.query.retries.ReadRetries`, one loop for both clients:
each only asks a URL and says what came back.

HTTPS: hosts given as ``https://host:port``, or as ``host:port`` with a ``ca_file`` (or
a client certificate, or ``insecure``), are asked over TLS, and the server's certificate
and name are verified (against ``ca_file``, else the system's CAs). A server whose
certificate cannot be verified ends the read at once (retrying cannot fix it), and a
redirect from HTTPS to plain HTTP is refused: the token would travel in clear.
"""

from __future__ import annotations

import functools
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from yarl import URL

if TYPE_CHECKING:
    import aiohttp

from streamjoin.errors import ConfigurationError, QueryFailed
from streamjoin.query.retries import Answer, Done, ReadRetries, Unreachable
from streamjoin.query.tls import PathLike, client_context

__all__ = ["AsyncTableClient", "TableClient", "query_url"]

#: redirects followed per request (an owner never redirects again: one is the norm)
_MAX_REDIRECTS = 3


def query_url(
    base: str,
    table: str,
    key: str,
    *,
    from_ms: int | None = None,
    to_ms: int | None = None,
    allow_stale: bool = False,
    redirect: bool = False,
    scheme: str = "http",
) -> str:
    """The endpoint's URL for one read (``base`` is ``host:port``, asked with ``scheme``,
    or ``http(s)://host:port``)."""
    if "://" not in base:
        base = f"{scheme}://{base}"
    params: dict[str, str] = {}
    if from_ms is not None:
        params["from"] = str(from_ms)
    if to_ms is not None:
        params["to"] = str(to_ms)
    if allow_stale:
        params["allow_stale"] = "1"
    if redirect:
        params["redirect"] = "1"
    path = f"/tables/{urllib.parse.quote(table, safe='')}/{urllib.parse.quote(key, safe='')}"
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    return base.rstrip("/") + path + query


def key_text(key: Any) -> str:
    """A key's text form: strings as they are, bytes as UTF-8, anything else as JSON."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes | bytearray):
        return bytes(key).decode("utf-8")
    return json.dumps(key, separators=(",", ":"))


def _host_list(hosts: Sequence[str], client: str) -> list[str]:
    """``hosts`` as a list of ``host:port`` (a comma-separated string is split)."""
    if isinstance(hosts, str):
        hosts = [h for h in hosts.split(",") if h.strip()]
    if not hosts:
        raise ConfigurationError(f"{client} needs at least one host:port")
    return [h.strip() for h in hosts]


def _tls(
    hosts: list[str],
    ca_file: PathLike | None,
    cert_file: PathLike | None,
    key_file: PathLike | None,
    insecure: bool,
) -> ssl.SSLContext | None:
    """The clients' TLS context (None: no TLS setting given; ``https://`` hosts are then
    verified against the system's CAs). TLS settings with a plain ``http://`` host are
    refused: the token would travel in clear."""
    if ca_file is None and cert_file is None and key_file is None and not insecure:
        return None
    plain = [h for h in hosts if h.lower().startswith("http://")]
    if plain:
        raise ConfigurationError(
            f"TLS settings (ca_file, cert_file, key_file, insecure) are for HTTPS, but "
            f"{', '.join(plain)} is plain HTTP: write https://, or leave the scheme out"
        )
    return client_context(ca_file, cert_file=cert_file, key_file=key_file, insecure=insecure)


def _downgrade(from_url: str, to_url: str) -> bool:
    return from_url.lower().startswith("https://") and to_url.lower().startswith("http://")


def _refuse_downgrade(from_url: str, to_url: str) -> QueryFailed:
    return QueryFailed(
        f"{from_url} redirected to {to_url}: refused, a redirect from HTTPS to plain HTTP "
        "would send the token in clear (give every worker the same web_tls_* settings)"
    )


def _tls_failure(url: str, exc: BaseException) -> QueryFailed:
    return QueryFailed(
        f"{url}: the server's TLS certificate was not accepted ({exc}); check ca_file (the "
        "CA that signed the workers' web_tls_cert) and that the host name is in the "
        "certificate"
    )


class _Reads:
    """What both clients keep between reads: the hosts, taken in turn, and how to retry."""

    def __init__(
        self, hosts: list[str], retry_for: float, redirect: bool, tls: ssl.SSLContext | None
    ) -> None:
        self.hosts = hosts
        self._retry_for = retry_for
        self._redirect = redirect
        self._next = 0
        self._tls = tls
        #: ``host:port`` hosts are asked over HTTPS when a TLS setting was given
        self._scheme = "http" if tls is None else "https"

    def _retries(
        self,
        table: str,
        key: Any,
        from_ms: int | None,
        to_ms: int | None,
        allow_stale: bool,
    ) -> ReadRetries:
        """The retry loop of one read of ``key`` (each client drives it with its I/O)."""
        url_of = functools.partial(
            query_url,
            table=table,
            key=key_text(key),
            from_ms=from_ms,
            to_ms=to_ms,
            allow_stale=allow_stale,
            redirect=self._redirect,
            scheme=self._scheme,
        )
        return ReadRetries(self.hosts, self._next, self._retry_for, url_of)


class TableClient(_Reads):
    """Reads tables through any of ``hosts`` (``"host:port"`` of workers' web servers).

    ``token`` is the bearer token the workers want (``query_token``), if any.
    ``ca_file`` is the CA (PEM) that signed the workers' ``web_tls_cert``: with it,
    ``host:port`` hosts are asked over HTTPS (so are ``https://`` hosts, verified against
    the system's CAs without it); ``cert_file``/``key_file`` are this client's certificate
    where the workers want one (``web_tls_client_ca``). ``insecure=True`` skips verifying
    the workers' certificates (logged as a warning; for a test set-up, never production).
    ``redirect=True`` asks a worker that does not own the key for a redirect to the owner
    (one more round trip from here) instead of letting it forward the read (one more hop
    between workers): use it when the client reaches every worker directly.
    """

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 5.0,
        retry_for: float = 10.0,
        redirect: bool = False,
        ca_file: PathLike | None = None,
        cert_file: PathLike | None = None,
        key_file: PathLike | None = None,
        insecure: bool = False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        host_list = _host_list(hosts, "TableClient")
        tls = _tls(host_list, ca_file, cert_file, key_file, insecure)
        super().__init__(host_list, retry_for, redirect, tls)
        self._token = token
        self._timeout = timeout
        self._sleep = sleep
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=tls), _NoDowngrade()
        )

    def get(
        self,
        table: str,
        key: Any,
        *,
        from_ms: int | None = None,
        to_ms: int | None = None,
        allow_stale: bool = False,
    ) -> dict[str, Any]:
        """The endpoint's JSON answer for ``key`` (``value``, or ``windows`` for a windowed
        table, with ``partition``, ``served_by``, ``stale`` and ``lag``).

        Raises :class:`KeyNotFound`, :class:`UnknownTableError`, :class:`QueryKeyError`,
        :class:`QueryUnauthorized`; :class:`QueryUnavailable` when every retry within
        ``retry_for`` got a 503; :class:`QueryFailed` when no host answered.
        """
        retries = self._retries(table, key, from_ms, to_ms, allow_stale)
        url = retries.url
        while True:
            step = retries.decide(self._fetch(url))
            self._next = retries.turn
            if isinstance(step, Done):
                return step.body
            if step.wait is not None:
                self._sleep(step.wait)
            url = step.url

    def value(self, table: str, key: Any, *, allow_stale: bool = False) -> Any:
        """Just the value of ``key`` (:class:`KeyNotFound` when there is none)."""
        return self.get(table, key, allow_stale=allow_stale)["value"]

    def _fetch(self, url: str) -> Answer | Unreachable:
        try:
            return self._answer(url)
        except OSError as exc:  # refused, unreachable, timed out
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise _tls_failure(url, reason) from None
            return Unreachable(exc, _hint(url, str(exc)))

    def _answer(self, url: str) -> Answer:
        """What the host answered (urllib follows redirects itself)."""
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self._token is not None:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                return Answer(response.status, response.read(), None, url)
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, exc.read(), exc.headers.get("Retry-After"), exc.url)


class _NoDowngrade(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, except from HTTPS to plain HTTP."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        if _downgrade(req.full_url, newurl):
            raise _refuse_downgrade(req.full_url, newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


#: how urllib and aiohttp say a server closed the connection without answering
_CLOSED = ("closed connection without response", "Server disconnected")


def _hint(url: str, text: str) -> str:
    """Why a host could not be asked (``text``), with a hint where a plain HTTP request met
    HTTPS or a server wanting a client certificate got none (both only close the connection)."""
    if any(closed in text for closed in _CLOSED):
        if url.lower().startswith("http://"):
            text += " (does it serve HTTPS? then use https:// and a ca_file)"
        else:
            text += " (does it want a client certificate? cert_file and key_file)"
    return text


class AsyncTableClient(_Reads):
    """:class:`TableClient` for asyncio code (aiohttp, one keep-alive session): the same
    hosts in turn, redirects, bounded 503 retries and errors. ``async with`` it, or call
    :meth:`close`."""

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        token: str | None = None,
        timeout: float = 5.0,
        retry_for: float = 10.0,
        redirect: bool = False,
        ca_file: PathLike | None = None,
        cert_file: PathLike | None = None,
        key_file: PathLike | None = None,
        insecure: bool = False,
    ) -> None:
        import aiohttp

        host_list = _host_list(hosts, "AsyncTableClient")
        tls = _tls(host_list, ca_file, cert_file, key_file, insecure)
        super().__init__(host_list, retry_for, redirect, tls)
        headers = {"Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self._headers = headers
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncTableClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def get(
        self,
        table: str,
        key: Any,
        *,
        from_ms: int | None = None,
        to_ms: int | None = None,
        allow_stale: bool = False,
    ) -> dict[str, Any]:
        """As :meth:`TableClient.get`."""
        import asyncio

        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers=self._headers,
                connector=aiohttp.TCPConnector(ssl=self._tls or True),
            )
        retries = self._retries(table, key, from_ms, to_ms, allow_stale)
        url = retries.url
        while True:
            outcome: Answer | Unreachable
            try:
                status, raw, retry_after = await self._fetch(self._session, url)
            except aiohttp.ClientConnectorCertificateError as exc:
                raise _tls_failure(url, exc.certificate_error) from None
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcome = Unreachable(exc, _hint(url, repr(exc)))
            else:
                outcome = Answer(status, raw, retry_after, url)
            step = retries.decide(outcome)
            self._next = retries.turn
            if isinstance(step, Done):
                return step.body
            if step.wait is not None:
                await asyncio.sleep(step.wait)
            url = step.url

    async def value(self, table: str, key: Any, *, allow_stale: bool = False) -> Any:
        """Just the value of ``key`` (:class:`KeyNotFound` when there is none)."""
        return (await self.get(table, key, allow_stale=allow_stale))["value"]

    async def _fetch(
        self, session: aiohttp.ClientSession, url: str
    ) -> tuple[int, bytes, str | None]:
        """Status, body and Retry-After of ``url``, following redirects here: aiohttp drops
        the Authorization header on a redirect to another host:port, and every worker of
        the app wants the same token."""
        first = url
        for _ in range(_MAX_REDIRECTS + 1):
            async with session.get(url, allow_redirects=False) as response:
                raw = await response.read()
                location = response.headers.get("Location")
                if response.status in (301, 302, 303, 307, 308) and location:
                    target = str(response.url.join(URL(location)))
                    if _downgrade(url, target):
                        raise _refuse_downgrade(url, target)
                    url = target
                    continue
                return response.status, raw, response.headers.get("Retry-After")
        raise QueryFailed(f"{first}: more than {_MAX_REDIRECTS} redirects")
