"""Giving up on an aiokafka client's connections to one broker that went silent.

A connection whose far end is gone without a word (half-open: a firewall or NAT forgot it,
the broker's host died) looks healthy to the client: nothing fails, answers just never
come. aiokafka notices only when a request waits out its ``request_timeout_ms``, and the
group client's is the rebalance timeout plus 5 s (a JoinGroup may be held that long), so a
heartbeat, an offset commit or a transaction's request would wait over a minute on it.
When the group coordinator answers no heartbeat for a session timeout, the membership
closes the worker's connections to that broker (its own client's, the fetcher's, the
producer's and the changelog reader's) with :func:`drop_connections`: what waits on them
fails at once (and is retried), and the next request opens a new connection.

aiokafka has no public call for this: the client's connection table (``_conns``, keyed by
``(node id, connection group)``) is touched here only, behind a seam check; without it
nothing is closed and the requests wait out their timeout as before (logged once).
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka.conn import CloseReason

log = logging.getLogger("streamjoin.consumer")

__all__ = ["drop_connections"]

#: every broker: :func:`drop_connections` closes the connections to all of them
ALL_NODES = None

_warned_seam = False


def drop_connections(client: Any, node_id: int | None) -> int:
    """Close every connection ``client`` (an ``AIOKafkaClient``) holds to ``node_id``
    (:data:`ALL_NODES`: to every broker); returns how many it closed."""
    global _warned_seam
    conns = getattr(client, "_conns", None)
    if not isinstance(conns, dict):
        if not _warned_seam:
            _warned_seam = True
            log.warning(
                "this aiokafka keeps no connection table streamjoin knows: connections to a "
                "silent broker are given up only after request_timeout_ms"
            )
        return 0
    closed = 0
    for key, conn in list(conns.items()):
        if not (isinstance(key, tuple) and key):
            continue
        if key[0] == node_id or (node_id is ALL_NODES and isinstance(key[0], int)):
            conn.close(reason=CloseReason.CONNECTION_TIMEOUT)
            closed += 1
    return closed
