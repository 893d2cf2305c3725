"""Fair turns: a retried call (or job) takes the locks it meets busy in first-conflict order.

The retry decorators set the current :class:`Turn` (a context variable, like the grant of
``process_without_lock``) for one execution; :class:`AsyncLock` then acquires through the
state's :class:`~asynclock.state.FairState` line instead of a plain acquire. The turn's id is the
same across the retries of one job (its job id), so its place in a key's line, taken at its first
conflict, survives the re-enqueue and the worker that ran it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import TYPE_CHECKING, final

from asynclock.state._protocol import FairState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from asynclock.state._protocol import Grant, State

logger = logging.getLogger("asynclock")

_current: contextvars.ContextVar[Turn | None] = contextvars.ContextVar(
    "asynclock_turn", default=None
)


@final
class Turn:
    """One execution's turn: its id, how long a refusal keeps its places, the lines it is in.

    Invariant: ``lines`` holds every (state, key) whose line this turn may still be in, so the
    execution can leave them all when it stops waiting (success, exhaustion, any other error).
    """

    __slots__ = ("hold", "id", "kept", "lines")

    def __init__(self, turn_id: str, hold: float) -> None:
        self.id = turn_id
        self.hold = hold
        self.kept = False
        self.lines: dict[tuple[int, str], tuple[FairState, str]] = {}

    def keep(self) -> None:
        """The call will execute again (re-enqueued): keep its places in the lines."""
        self.kept = True

    async def acquire(self, state: State, key: str, owner: str, ttl: float) -> Grant:
        """Acquire ``key`` in turn (see :meth:`FairState.fair_acquire`)."""
        if not isinstance(state, FairState):
            raise NotImplementedError(
                f"fair retries need a state with the FairState capability (fair_acquire, "
                f"fair_leave); {type(state).__name__} does not have it yet: use MemoryState "
                "or RedisState, or pass fair=False to retry_on_lock_conflict"
            )
        grant = await state.fair_acquire(key, owner, ttl, turn=self.id, hold=self.hold)
        where = (id(state), key)
        if grant.token is None:
            self.lines[where] = (state, key)
        else:
            self.lines.pop(where, None)
        return grant

    async def leave(self) -> None:
        """Leave every line this turn is in; a failure is logged (the place expires anyway)."""
        lines, self.lines = list(self.lines.values()), {}
        for state, key in lines:
            await self._leave(state, key)

    async def _leave(self, state: FairState, key: str) -> None:
        try:
            await state.fair_leave(key, self.id)
        except Exception:  # the place's hold bounds the harm: log, never mask the job's end
            logger.warning(
                "asynclock: could not leave the line of %r (turn %s); it expires by itself",
                key,
                self.id,
                exc_info=True,
            )


def current_turn() -> Turn | None:
    """The turn of the execution running in this context, if its retries are fair."""
    return _current.get()


@contextlib.asynccontextmanager
async def take_turns(
    turn_id: str, wait_bound: Callable[[], float | None], *, fair: bool, window: float
) -> AsyncIterator[Turn]:
    """Run one execution in turn ``turn_id``, when ``fair``.

    ``wait_bound()`` is the longest wait before the call's next execution (``None``: unknown),
    asked only when ``fair``. A refusal keeps the turn's place for that wait plus ``window``
    seconds (its queue latency allowance), counted from the holder's expiry (``wait="lock_ttl"``
    waits exactly that long, so it adds only the window). Unless :meth:`Turn.keep` was called (the call will
    execute again), the turn leaves every line it joined on the way out.
    """
    if not fair:
        yield Turn(turn_id, window)  # never consulted: no context variable is set
        return
    turn = Turn(turn_id, (wait_bound() or 0.0) + window)
    token = _current.set(turn)
    try:
        yield turn
    finally:
        _current.reset(token)
        if not turn.kept:
            await turn.leave()
