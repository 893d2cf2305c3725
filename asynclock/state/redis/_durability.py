"""Whether the Redis server keeps what it confirmed: RedisState's
:class:`~asynclock.state.DurabilityCheck`.

Redis answers a write once it is in memory. It is still there after a restart or a crash only
if the server keeps an append-only file (``appendonly yes``): with ``appendfsync always`` it
loses nothing it confirmed, with ``everysec`` up to about a second of writes. RDB snapshots
(``save``) lose everything since the last one. So the durable inbox's promise ("an accepted
event survives any crash") holds on Redis only with an append-only file, and a server that
reports none (``INFO persistence``: ``aof_enabled:0``) gets one warning per state, naming the
setting and how to silence it (``check_persistence=False``: a server made durable by other
means, such as a managed service's own log or replicas).

The check is one ``INFO persistence`` per master (the one server; under Sentinel the master it
names; every master of a cluster), made by the first ``accept`` or ``serve()`` of a state and
never again once it got an answer: an accept after it sends nothing more. ``INFO`` does not
tell the ``appendfsync`` policy (``CONFIG GET`` does, but managed services refuse it), so
``appendfsync no`` is not detected.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from redis import exceptions as redis_errors

from asynclock._errors import StateUnavailableError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["PersistenceCheck", "aof_enabled"]

logger = logging.getLogger("asynclock")

#: the warning, with ``%s``: where, then the masters without an append-only file
NO_AOF = (
    "asynclock: %s keeps no append-only file (INFO persistence: aof_enabled:0 on %s): "
    "events accepted into the durable inbox live in the server's memory only, and a restart "
    "or crash of the server loses them. Set `appendonly yes` with `appendfsync everysec` (a "
    "crash loses up to about a second of writes) or `appendfsync always` (nothing confirmed "
    "is lost). If the server is durable by other means (a managed service's own log, "
    "replicas=N with failover), silence this with RedisState(..., check_persistence=False). "
    "See docs/inbox.md, 'What durable means on each server'."
)


def aof_enabled(reply: object) -> bool | None:
    """``aof_enabled`` of an ``INFO persistence`` reply (RESP2 or RESP3 text); ``None`` when
    the reply has no such field (a service that answers a partial INFO)."""
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    for line in text.splitlines():
        name, _, value = line.strip().partition(":")
        if name == "aof_enabled":
            return value.strip() == "1"
    return None


class PersistenceCheck:
    """One state's check of its server's persistence (see the module).

    Invariant: once settled (an answer was read, or the check is off) :meth:`run` returns
    ``True`` without I/O; at most one check is in flight at a time.
    """

    __slots__ = ("_running", "_settled")

    def __init__(self, *, enabled: bool) -> None:
        self._settled = not enabled
        self._running = False

    async def run(
        self, where: str, info: Callable[[], Awaitable[list[tuple[str, object]]]]
    ) -> bool:
        """Read ``INFO persistence`` of every master through ``info`` (address, reply) and
        log what it shows; whether the check is settled (see
        :meth:`asynclock.state.DurabilityCheck.check_durability`)."""
        if self._settled:
            return True
        if self._running:
            return False
        self._running = True
        try:
            replies = await info()
        except StateUnavailableError as exc:
            logger.debug("asynclock: %s: persistence not checked yet: %s", where, exc)
            return False
        except redis_errors.ResponseError as exc:  # INFO refused (ACL, a renamed command)
            self._settled = True
            logger.info(
                "asynclock: %s refused INFO persistence (%s): whether it keeps what it "
                "confirmed is not checked (see docs/inbox.md, 'What durable means on each "
                "server'; check_persistence=False skips the check)",
                where,
                exc,
            )
            return True
        finally:
            self._running = False
        self._settled = True
        found = [(address, aof_enabled(reply)) for address, reply in replies]
        without = [address for address, enabled in found if enabled is False]
        if without:
            logger.warning(NO_AOF, where, ", ".join(without))
        elif any(enabled is None for _, enabled in found):
            logger.info(
                "asynclock: %s reports no aof_enabled in INFO persistence: whether it keeps "
                "what it confirmed is not checked (see docs/inbox.md, 'What durable means "
                "on each server')",
                where,
            )
        return True
