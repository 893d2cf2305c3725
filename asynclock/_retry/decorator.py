"""retry_on_lock_conflict: retry a coroutine when its lock is busy, with a decided ending.

The decorator only: its pieces (waits, exhaustion policies, :class:`Retrying`) are in
``_retry/retrying.py``, shared with the job-queue integrations.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal, ParamSpec, TypeVar, cast, overload

from asynclock._retry.retrying import (
    ExhaustionSpec,
    Retrying,
    RetryStatistics,
    WaitSpec,
    check_coroutine_function,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

P = ParamSpec("P")

R = TypeVar("R")

__all__ = ["ExhaustionSpec", "RetryStatistics", "WaitSpec", "retry_on_lock_conflict"]


@overload
def retry_on_lock_conflict(
    *,
    wait: WaitSpec = ...,
    attempts: int = ...,
    on_exhaustion: Literal["raise", "process_without_lock"] = ...,
    jitter: float = ...,
    lock_ttl: float | None = ...,
    fair: bool = ...,
    fair_window: float = ...,
) -> Callable[
    [Callable[P, Coroutine[object, object, R]]], Callable[P, Coroutine[object, object, R]]
]: ...


@overload
def retry_on_lock_conflict(
    *,
    wait: WaitSpec = ...,
    attempts: int = ...,
    on_exhaustion: Literal["drop"] | Callable[..., object],
    jitter: float = ...,
    lock_ttl: float | None = ...,
    fair: bool = ...,
    fair_window: float = ...,
) -> Callable[
    [Callable[P, Coroutine[object, object, R]]],
    Callable[P, Coroutine[object, object, R | None]],
]: ...


def retry_on_lock_conflict(
    *,
    wait: WaitSpec = 1.0,
    attempts: int = 3,
    on_exhaustion: ExhaustionSpec = "raise",
    jitter: float = 0.15,
    lock_ttl: float | None = None,
    fair: bool = False,
    fair_window: float = 2.0,
) -> Callable[
    [Callable[P, Coroutine[object, object, R]]], Callable[P, Coroutine[object, object, R | None]]
]:
    """Retry an ``async def`` when it raises :class:`LockAcquisitionError`.

    Anything else the function raises passes through at once, and ``asyncio.CancelledError``
    is never retried. Every call counts its own executions, so concurrent calls never share a
    counter.

    Args:
        wait: how long to wait after a conflict, before the next execution:

            * seconds (``float``), plus a random fraction of up to ``jitter`` of it, so that
              workers that collided do not collide again in step;
            * a callable ``executions -> seconds`` (``executions`` is 1 after the first failed
              execution), deterministic, no jitter: ``wait=lambda n: n`` waits 1 s, then 2 s;
            * ``"lock_ttl"``: exactly the conflict's ``retry_after``, the holder's remaining TTL
              as the server reported it.
        attempts: total executions, counting the first (Rails' ``retry_on`` semantics):
            ``attempts=3`` runs the function at most 3 times.
        on_exhaustion: what happens after the last failed execution:

            * ``"raise"``: re-raise the last ``LockAcquisitionError``;
            * ``"process_without_lock"``: run the function once more with every
              :class:`AsyncLock` entered inside it (in its task and the tasks it starts)
              granted without acquiring, and log a warning. Meant for locks that only dampen
              a race the data layer tolerates, so a message is never dropped;
            * ``"drop"``: log a warning and return ``None``;
            * a callable (sync or async) given the call's original ``*args, **kwargs``; its
              return value is returned.
        jitter: the random fraction added to a constant ``wait`` (0.15: up to +15%).
        lock_ttl: the TTL of the lock the function takes. When given, the decorator refuses
            (``ValueError`` at decoration time) a retry window shorter than it: falling back
            while the holder's lock may still be valid reopens the race (see the docs' retry
            page for the timeline).
        fair: take turns across processes: a call that met a lock busy earlier gets it before
            one that met it later (a per-key line in the state, see the docs' jobs page). Needs
            a state with the :class:`~asynclock.state.FairState` capability (memory, Redis).
        fair_window: with ``fair``, seconds a call's place in a key's line is kept beyond its
            own wait, so a call that vanished blocks the key for at most its wait plus this.

    Raises:
        TypeError: the decorated object is not an ``async def`` function, or a bad type.
        ValueError: ``attempts < 1``, a negative wait, an unknown ``on_exhaustion``, or a retry
            window shorter than ``lock_ttl``.

    Example:
        >>> import asyncio, asynclock
        >>> state = asynclock.MemoryState()
        >>> @asynclock.retry_on_lock_conflict(wait=lambda n: 0.01 * n, attempts=3,
        ...                                   on_exhaustion="process_without_lock")
        ... async def handle(contact: str) -> str:
        ...     async with asynclock.AsyncLock(state, f"contact:{contact}", ttl=3.0,
        ...                                    blocking=False):
        ...         return f"handled {contact}"
        >>> asyncio.run(handle("42"))
        'handled 42'
    """
    retrying = Retrying(
        wait=wait,
        attempts=attempts,
        on_exhaustion=on_exhaustion,
        jitter=jitter,
        lock_ttl=lock_ttl,
        fair=fair,
        fair_window=fair_window,
    )

    def decorate(
        function: Callable[P, Coroutine[object, object, R]],
    ) -> Callable[P, Coroutine[object, object, R | None]]:
        if isinstance(function, (classmethod, staticmethod)):
            # decorator written above @classmethod/@staticmethod: wrap the function inside and
            # give back the same kind of descriptor (a classmethod object is not callable)
            descriptor = cast("type[classmethod[object, ..., object]]", type(function))
            return cast(
                "Callable[P, Coroutine[object, object, R | None]]",
                descriptor(decorate(function.__func__)),
            )
        check_coroutine_function(function, "functions")

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            return await retrying.run(function, args, kwargs)

        wrapper.statistics = retrying.counters.snapshot  # type: ignore[attr-defined]
        return wrapper

    return decorate
