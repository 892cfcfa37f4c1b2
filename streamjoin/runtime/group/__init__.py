"""The consumer group, as this worker takes part in it.

Owns: our membership protocol (join, sync, heartbeat), the group's committed offsets,
the adapter that runs the pure assignor as the group leader, rebalance metrics, and the
exactly-once transaction with the KIP-447 requests aiokafka lacks. May import the pure
cores (assignor, codecs), ``runtime.ops.metrics`` and ``runtime.tasks.offset_ledger``;
never the tasks' processing, the transport services or the worker.
"""
