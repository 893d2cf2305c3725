"""asynclock for aiogram 3: event isolation, per-chat dispatch, and a durable webhook.

* :class:`EventIsolation`: aiogram's ``events_isolation`` (``Dispatcher(events_isolation=...)``)
  on asynclock's locks, a drop-in for ``RedisEventIsolation`` on every state.
* :class:`UpdateMiddleware`: an outer middleware on updates that runs each one through an
  :class:`~asynclock.EventDispatcher` (dedupe by ``update_id``, per-chat conflict policies,
  ``ctx.token``); :func:`telegram_event` is its update -> event mapping.
* :class:`InboxRequestHandler` + :class:`UpdateFeeder`: the durable webhook. The update is stored
  in the inbox before Telegram gets its 200; workers (``asynclock worker``) feed stored updates
  to the ``Dispatcher``, in order per chat.

Requires the ``aiogram`` extra: ``pip install 'asynclock[aiogram]'``.
"""

from __future__ import annotations

try:
    import aiogram  # noqa: F401 - only to name the extra when aiogram is missing
except ImportError as error:  # pragma: no cover - the dev extra installs it
    raise ImportError(
        "asynclock.integrations.aiogram needs aiogram 3: pip install 'asynclock[aiogram]'"
    ) from error

from asynclock.integrations.aiogram._inbox import InboxRequestHandler, UpdateFeeder
from asynclock.integrations.aiogram._isolation import EventIsolation, isolation_token
from asynclock.integrations.aiogram._update import (
    UpdateInProgressError,
    UpdateMiddleware,
    telegram_event,
)

__all__ = (
    "EventIsolation",
    "InboxRequestHandler",
    "UpdateFeeder",
    "UpdateInProgressError",
    "UpdateMiddleware",
    "isolation_token",
    "telegram_event",
)
