"""The consumer group, as this worker takes part in it.

Owns: our membership protocol (the decisions in ``protocol``, pure; the asyncio shell in
``membership``), the group's committed offsets (``group_offsets``), the adapter that runs
the pure assignor as the group leader, rebalance metrics, and the exactly-once
transaction with the KIP-447 requests aiokafka lacks. May import the pure cores,
``runtime.metrics``, ``runtime.table_state.flush`` (a transaction sends changelog
writes) and the transport (the transactional sender extends the producer); never tasks,
the group member or the worker.
"""
