"""streamjoin: correct, fast, stateful joins over Kafka for asyncio Python.

``streamjoin.App`` is imported lazily so that the pure modules (assignor,
codecs, partitioner) can be used without loading the Kafka runtime.
``streamjoin.errors`` (every error, under :class:`StreamjoinError`) imports
nothing and is loaded right away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamjoin import errors
from streamjoin.errors import StreamjoinError

__version__ = "0.3.0"

if TYPE_CHECKING:
    from streamjoin.app import App
    from streamjoin.events import Event
    from streamjoin.runtime.tasks.agent_runtime import Stream
    from streamjoin.stream import EventBatch

__all__ = ["App", "Event", "EventBatch", "Stream", "StreamjoinError", "__version__", "errors"]


def __getattr__(name: str) -> Any:
    if name == "App":
        from streamjoin.app import App

        return App
    if name == "Event":
        from streamjoin.events import Event

        return Event
    if name == "Stream":
        from streamjoin.runtime.tasks.agent_runtime import Stream

        return Stream
    if name == "EventBatch":
        from streamjoin.stream import EventBatch

        return EventBatch
    raise AttributeError(f"module 'streamjoin' has no attribute {name!r}")
