"""streamjoin: correct, fast, stateful joins over Kafka for asyncio Python."""

__version__ = "0.1.0"

__all__ = ["__version__"]
