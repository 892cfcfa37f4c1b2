"""Tasks and their processing, whatever the transport.

Owns the task lifecycle (``task``), each task's offset ledger, the timestamp alignment
of co-partitioned inputs, the agent actors with their queues, and ``TaskProcessing``
(delivery, commits, revocation). The Kafka worker and the in-memory test driver both run
it. May import declarations, ``state``, ``runtime.table_state`` (flushing) and
``runtime.metrics``; never the group, and of the transport only the ``Sent`` handle
of ``out_batches`` (acknowledgements read a send's batch future directly: hot path).
"""
