"""Kafka I/O: fetching (the aiokafka consumer), producing, topic administration, liveness.

Owns the aiokafka clients that move records and the checks of what a topic accepts.
Knows nothing of tasks, agents or the group protocol: the worker tells the fetcher which
partitions to read and where to start. May import ``streamjoin.events``, codecs, errors
and ``runtime.metrics``.
"""
