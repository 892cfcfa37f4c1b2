"""Testing support: a real local Apache Kafka broker and pytest fixtures for it."""

from streamjoin.local_kafka import LocalKafka, resolve_kafka

__all__ = ["LocalKafka", "resolve_kafka"]
