"""Did the brokers refuse us? A login checked once at start, and refusals told apart.

aiokafka turns a refused login into "Unable to bootstrap" (the broker's reason only in
its log) and retries it like an outage, so :func:`check_login` logs in once, directly,
before any client starts: a wrong password, an unknown user or a broker certificate that
does not verify is an :class:`~streamjoin.errors.AccessRefused` at once, not a minute of
retries. :func:`refusal_of` finds a refusal (an authorization error Kafka answered, or a
refused login) behind any error, described for the operator: what was refused, never a
credential.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn

from streamjoin.errors import AccessRefused, GroupMembershipError
from streamjoin.runtime.transport.liveness import bootstrap_addresses

__all__ = ["REFUSALS", "check_login", "refusal_of"]

#: Kafka's answers that an ACL is missing: retrying them as configured cannot succeed
REFUSALS: tuple[type[Exception], ...] = (
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.GroupAuthorizationFailedError,
    kafka_errors.TransactionalIdAuthorizationFailed,
    kafka_errors.ClusterAuthorizationFailedError,
)

ACLS_HINT = "`streamjoin acls -A MODULE:APP` lists the ACLs the app needs"
#: the client options a connection takes (the rest are for producers, consumers...)
_CONNECTION_OPTIONS = (
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "sasl_kerberos_service_name",
    "sasl_kerberos_domain_name",
    "sasl_oauth_token_provider",
)


async def check_login(bootstrap: str, timeout: float = 10.0, **client_kwargs: Any) -> None:
    """Log in to the first bootstrap server that answers, as the clients will; raise
    :class:`AccessRefused` when the login is refused. Nothing to check for PLAINTEXT;
    a server that does not answer is left to the clients' own retries."""
    protocol = str(client_kwargs.get("security_protocol", "PLAINTEXT")).upper()
    if protocol == "PLAINTEXT":
        return
    options = {k: client_kwargs[k] for k in _CONNECTION_OPTIONS if k in client_kwargs}
    user = client_kwargs.get("sasl_plain_username")
    for host, port in bootstrap_addresses(bootstrap):
        try:
            conn = await asyncio.wait_for(
                create_conn(host, port, request_timeout_ms=int(timeout * 1000), **options),
                timeout,
            )
        except (asyncio.TimeoutError, kafka_errors.KafkaConnectionError, ConnectionError):
            continue
        except Exception as exc:
            refused = refusal_of(exc, user=user)
            if refused is not None:
                raise refused from None
            raise
        conn.close()
        return


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _names(exc: BaseException) -> str:
    """The resources an aiokafka authorization error names (its args: a name or a set)."""
    names: list[str] = []
    for arg in exc.args:
        if isinstance(arg, str):
            names.append(arg)
        elif isinstance(arg, Iterable):
            names.extend(str(a) for a in arg)
    return ", ".join(repr(n) for n in sorted(set(names)))


def refusal_of(exc: BaseException, *, user: object = None) -> AccessRefused | None:
    """The refusal behind ``exc`` (itself or a cause), described; None if it is not one."""
    who = f" for user {user!r}" if isinstance(user, str) and user else ""
    for error in _chain(exc):
        if isinstance(error, AccessRefused):
            return error
        if isinstance(
            error, kafka_errors.SaslAuthenticationFailed | kafka_errors.AuthenticationFailedError
        ):
            return AccessRefused(
                f"the brokers refused the login{who} (SASL authentication failed: wrong "
                "password or unknown user)"
            )
        if isinstance(error, kafka_errors.UnsupportedSaslMechanismError):
            return AccessRefused(
                f"the brokers refused the login{who}: {error.args[0] if error.args else error}"
            )
        if isinstance(error, ssl.SSLCertVerificationError):
            return AccessRefused(
                f"TLS: the broker's certificate could not be verified ({error.verify_message}); "
                "is ssl_cafile the CA that signed it, and the address one it names?"
            )
        if isinstance(error, kafka_errors.TopicAuthorizationFailedError):
            return AccessRefused(
                f"the brokers refused access to topic {_names(error) or '(unnamed)'}{who} "
                f"(TOPIC_AUTHORIZATION_FAILED); {ACLS_HINT}"
            )
        if isinstance(error, kafka_errors.GroupAuthorizationFailedError):
            return AccessRefused(
                f"the brokers refused access to consumer group {_names(error) or '(unnamed)'}"
                f"{who} (GROUP_AUTHORIZATION_FAILED: READ on the group is needed); {ACLS_HINT}"
            )
        if isinstance(error, kafka_errors.TransactionalIdAuthorizationFailed):
            return AccessRefused(
                f"the brokers refused the transactional id{who} "
                f"(TRANSACTIONAL_ID_AUTHORIZATION_FAILED: WRITE on transactional ids with the "
                f"app id as prefix is needed under exactly-once); {ACLS_HINT}"
            )
        if isinstance(error, GroupMembershipError) and "GROUP_AUTHORIZATION_FAILED" in str(error):
            return AccessRefused(f"the brokers refused{who}: {error}; {ACLS_HINT}")
        if isinstance(error, kafka_errors.ClusterAuthorizationFailedError):
            return AccessRefused(
                f"the brokers refused a cluster operation{who} (CLUSTER_AUTHORIZATION_FAILED); "
                f"{ACLS_HINT}"
            )
    return None
