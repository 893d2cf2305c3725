"""The JSON form of an :class:`~asynclock.Event`: what the state stores of it.

An inbox entry holds one (``EventDispatcher.accept``), and so does a supersede hand-over (the
events an interrupted call covered, left in the state for the newer call in another process).
"""

from __future__ import annotations

import json

from asynclock._events.event import Event

__all__ = ["decode", "encode"]


def encode(event: Event) -> str:
    """``event`` as the JSON text an inbox entry stores.

    Raises:
        TypeError: ``event.raw`` is not JSON-serializable (the message names the field).
    """
    fields = {
        "type": event.type,
        "adapter": event.adapter,
        "channel_id": event.channel_id,
        "thread_id": event.thread_id,
        "message_id": event.message_id,
    }
    raw = dict(event.raw)
    try:
        return json.dumps({**fields, "raw": raw}, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"accept() stores the event as JSON: {_unserializable(raw)} is not "
            f"JSON-serializable ({exc})"
        ) from exc


def _unserializable(raw: dict[str, object]) -> str:
    """Name the first field of ``raw`` that JSON cannot hold (for the error message)."""
    for name, value in raw.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):  # noqa: PERF203 - only on the error path
            return f"Event.raw[{name!r}] ({type(value).__name__})"
    return "Event.raw"


def decode(payload: str) -> Event:
    """The event an inbox entry stores."""
    data = json.loads(payload)
    return Event(
        type=data["type"],
        adapter=data["adapter"],
        channel_id=data["channel_id"],
        thread_id=data["thread_id"],
        message_id=data["message_id"],
        raw=data["raw"],
    )
