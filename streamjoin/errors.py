"""Every error streamjoin raises, under one root (imports nothing from streamjoin)."""

from __future__ import annotations


class StreamjoinError(Exception):
    """Root of every error streamjoin raises on purpose."""


class ConfigurationError(StreamjoinError, ValueError):
    """The app's declarations or settings are inconsistent; the message says how to fix them."""


class CopartitioningError(ConfigurationError):
    """Topics declared co-partitioned have different partition counts."""


class TransportNotReady(StreamjoinError, RuntimeError):
    """A send before the app was started (or after it stopped)."""


class TableAccessError(StreamjoinError, RuntimeError):
    """A table was used where its partition is not owned or not co-partitioned."""


class AgentFailed(StreamjoinError, RuntimeError):
    """An agent hit an error under the ``stop`` policy; the worker must stop."""
