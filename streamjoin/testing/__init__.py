"""Testing support: a real local Apache Kafka broker and pytest fixtures for it."""

from streamjoin.testing.kafka import (
    BrokerStartError,
    JavaNotFoundError,
    KafkaProvisioningError,
    KafkaResolutionError,
    LocalKafka,
    MavenNotFoundError,
    resolve_kafka,
)

__all__ = [
    "BrokerStartError",
    "JavaNotFoundError",
    "KafkaProvisioningError",
    "KafkaResolutionError",
    "LocalKafka",
    "MavenNotFoundError",
    "resolve_kafka",
]
