"""The parts of ``retry_on_lock_conflict``: wait functions, exhaustion policies, ``Retrying``.

Built like tenacity, from small pieces: the ``wait`` argument is normalised to a function
``(executions, error) -> seconds`` and ``on_exhaustion`` to a policy object; :class:`Retrying`
holds one decoration's checked pieces and counters. The core decorator (``_retry/decorator.py``) sleeps
between executions; the job-queue integrations (``asynclock.integrations``) re-enqueue instead.
Unlike tenacity, every call keeps its own counters (no state shared between concurrent calls,
tenacity#93), and ``CancelledError`` is never retried (tenacity#529).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar, cast, final

from asynclock._errors import LockAcquisitionError
from asynclock._lock.grant import grant_all, reset_grant
from asynclock._lock.turn import Turn, take_turns
from asynclock._validate import check_ttl
from asynclock._waits import wait_by_executions

if TYPE_CHECKING:
    import contextlib

R = TypeVar("R")

logger = logging.getLogger("asynclock")

ExhaustionName = Literal["raise", "process_without_lock", "drop"]
WaitSpec = float | int | Callable[[int], float] | Literal["lock_ttl"]
#: what on_exhaustion may be: a policy name, or a (sync or async) callable given the call's args
ExhaustionSpec = ExhaustionName | Callable[..., object]


@dataclass(frozen=True, slots=True)
class RetryStatistics:
    """Counters of one decorated function, over all its calls so far.

    Attributes:
        calls: calls of the decorated function.
        conflicts: ``LockAcquisitionError``\\ s caught (one per failed execution).
        retries: executions started again after a conflict.
        exhausted: calls whose every attempt hit a conflict.
        processed_without_lock: exhausted calls run once more with their locks granted.
        dropped: exhausted calls dropped (``on_exhaustion="drop"``), each logged.

    Example:
        >>> import asyncio, asynclock
        >>> state = asynclock.MemoryState()
        >>> @asynclock.retry_on_lock_conflict(wait=0.01, attempts=2, on_exhaustion="drop")
        ... async def handle() -> None:
        ...     async with asynclock.AsyncLock(state, "contact:7", blocking=False):
        ...         pass
        >>> async def main():
        ...     async with asynclock.AsyncLock(state, "contact:7"):  # someone holds it
        ...         await handle()                                  # 2 conflicts, dropped
        ...     await handle()                                      # free: runs once
        >>> asyncio.run(main())
        >>> stats = handle.statistics()
        >>> stats.calls, stats.conflicts, stats.retries, stats.exhausted, stats.dropped
        (2, 2, 1, 1, 1)
    """

    calls: int = 0
    conflicts: int = 0
    retries: int = 0
    exhausted: int = 0
    processed_without_lock: int = 0
    dropped: int = 0


class _Counters:
    __slots__ = ("calls", "conflicts", "dropped", "exhausted", "processed_without_lock", "retries")

    def __init__(self) -> None:
        self.calls = self.conflicts = self.retries = 0
        self.exhausted = self.processed_without_lock = self.dropped = 0

    def snapshot(self) -> RetryStatistics:
        return RetryStatistics(
            self.calls,
            self.conflicts,
            self.retries,
            self.exhausted,
            self.processed_without_lock,
            self.dropped,
        )


# -- wait: (executions, error) -> seconds -------------------------------------------------------


def _wait_function(
    wait: WaitSpec, jitter: float
) -> tuple[Callable[[int, LockAcquisitionError], float], Callable[[int], float] | None]:
    """Normalise ``wait`` to ``(executions, error) -> seconds`` and, when it does not depend on
    the error, a deterministic lower bound ``executions -> seconds`` for the window check."""
    if wait == "lock_ttl":

        def until_expiry(executions: int, error: LockAcquisitionError) -> float:
            # the holder's remaining TTL as the server reported it; the TTL we asked for when
            # the server could not tell (e.g. the conflict was decided locally)
            return error.retry_after if error.retry_after is not None else error.ttl

        return until_expiry, None
    if isinstance(wait, str):
        raise ValueError(  # noqa: TRY004 - a str is the right type, 'lock_ttl' the only value
            f"wait must be seconds, a callable executions -> seconds, or 'lock_ttl', got {wait!r}"
        )
    by_executions, lower_bound = wait_by_executions(
        wait, jitter, name="wait", forms="a number of seconds, a callable or 'lock_ttl'"
    )

    def computed(executions: int, error: LockAcquisitionError) -> float:
        return by_executions(executions)

    return computed, lower_bound


def _check_window(
    attempts: int, lower_bound: Callable[[int], float] | None, lock_ttl: float | None, wait: object
) -> None:
    """Refuse a retry window shorter than the lock's TTL (the Chatwoot race)."""
    if lock_ttl is None:
        return
    if isinstance(lock_ttl, bool) or not isinstance(lock_ttl, (int, float)):
        raise TypeError(f"lock_ttl must be seconds, got {lock_ttl!r}")
    if not math.isfinite(lock_ttl) or lock_ttl <= 0:
        raise ValueError(f"lock_ttl must be finite seconds > 0, got {lock_ttl!r}")
    if lower_bound is None:  # wait="lock_ttl" waits for the holder's expiry by construction
        return
    waits = [lower_bound(n) for n in range(1, attempts)]
    window = sum(waits)
    if window + 1e-9 >= lock_ttl:
        return
    shown = " + ".join(f"{w:g}" for w in waits) or "0"
    raise ValueError(
        f"retry window too short for lock_ttl={lock_ttl:g} s: with attempts={attempts} and "
        f"wait={_describe(wait)}, the last attempt starts {shown} = {window:g} s after the first "
        f"conflict, while a lock taken just before it can still be held for {lock_ttl:g} s. "
        "Falling back (or giving up) then would reopen the race the lock is there to close. "
        "Make the waits add up to at least the lock's TTL, e.g. wait=lambda n: n with "
        "attempts=3 for a 3 s lock (1 + 2 = 3 s), or use wait='lock_ttl'."
    )


def _describe(wait: object) -> str:
    if callable(wait):
        return getattr(wait, "__name__", "a callable")
    return repr(wait)


# -- on_exhaustion: policy objects ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Exhausted:
    """A call whose every execution hit a lock conflict, handed to the exhaustion policy."""

    function: Callable[..., Awaitable[object]]
    args: tuple[object, ...]
    kwargs: dict[str, object]
    error: LockAcquisitionError
    counters: _Counters

    def warn(self, what: str) -> None:
        name = function_name(self.function)
        logger.warning(
            "asynclock: %s: lock %r still busy after every attempt; %s",
            name,
            self.error.key,
            what,
            extra={"lock_key": self.error.key, "function": name},
        )


class _Exhaustion:
    """What happens after the last failed execution: re-raise (the default)."""

    name = "raise"

    async def __call__(self, call: _Exhausted) -> object:
        raise call.error


class _ProcessWithoutLock(_Exhaustion):
    name = "process_without_lock"

    async def __call__(self, call: _Exhausted) -> object:
        call.counters.processed_without_lock += 1
        call.warn("processing without the lock")
        reason = (
            f"{function_name(call.function)}: process_without_lock after lock {call.error.key!r}"
        )
        token = grant_all(reason)
        try:
            return await call.function(*call.args, **call.kwargs)
        finally:
            reset_grant(token)


class _Drop(_Exhaustion):
    name = "drop"

    async def __call__(self, call: _Exhausted) -> object:
        call.counters.dropped += 1
        call.warn("dropping the call")
        return None


class _Fallback(_Exhaustion):
    name = "callable"

    def __init__(self, fallback: Callable[..., object]) -> None:
        self._fallback = fallback

    async def __call__(self, call: _Exhausted) -> object:
        call.warn(f"calling {function_name(self._fallback)}")
        result = self._fallback(*call.args, **call.kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


def _exhaustion_policy(on_exhaustion: object) -> _Exhaustion:
    if on_exhaustion == "raise":
        return _Exhaustion()
    if on_exhaustion == "process_without_lock":
        return _ProcessWithoutLock()
    if on_exhaustion == "drop":
        return _Drop()
    if callable(on_exhaustion) and not isinstance(on_exhaustion, str):
        return _Fallback(on_exhaustion)
    raise ValueError(
        "on_exhaustion must be 'raise', 'process_without_lock', 'drop' or a callable given the "
        f"call's arguments, got {on_exhaustion!r}"
    )


def function_name(function: object) -> str:
    """The qualified name of ``function`` for messages (its ``repr`` when it has none); shared
    with the job-queue integrations, which name the job in their errors."""
    return cast("str", getattr(function, "__qualname__", None) or repr(function))


def check_coroutine_function(function: object, kind: str) -> None:
    """Raise ``TypeError`` unless ``function`` is an ``async def`` (``kind``: what the decorator
    takes, in the message: ``"functions"``, ``"arq jobs"``)."""
    if not inspect.iscoroutinefunction(function):
        raise TypeError(
            f"retry_on_lock_conflict decorates async def {kind}; {function_name(function)} is "
            f"{type(function).__name__}"
        )


# -- one decoration's policy, shared by the core decorator and the job-queue integrations --------


@final
class Retrying:
    """The parts of one decoration (wait, attempts, exhaustion policy), checked once, plus its
    counters; shared read-only (but for the counters) by every call of the decorated function.

    The core decorator sleeps between executions; a job-queue integration
    (``asynclock.integrations``) asks :meth:`conflict` for the delay and re-enqueues the job
    with it instead. Both count executions the same way: 1 is the first.
    """

    __slots__ = (
        "_jitter",
        "_lower_bound",
        "attempts",
        "counters",
        "exhaustion",
        "fair",
        "fair_window",
        "wait",
    )

    def __init__(
        self,
        *,
        wait: WaitSpec,
        attempts: int,
        on_exhaustion: ExhaustionSpec,
        jitter: float,
        lock_ttl: float | None,
        fair: bool = False,
        fair_window: float = 2.0,
    ) -> None:
        if not isinstance(fair, bool):
            raise TypeError(f"fair must be True or False, got {fair!r}")
        self.fair = fair
        self.fair_window = check_ttl(fair_window, "fair_window")
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise TypeError(f"attempts must be an int (total executions), got {attempts!r}")
        if attempts < 1:
            raise ValueError(
                f"attempts must be >= 1 (total executions, Rails style), got {attempts}"
            )
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)):
            raise TypeError(f"jitter must be a fraction, got {jitter!r}")
        if not math.isfinite(jitter) or jitter < 0:
            raise ValueError(f"jitter must be a finite fraction >= 0, got {jitter!r}")
        wait_function, lower_bound = _wait_function(wait, float(jitter))
        self.exhaustion = _exhaustion_policy(on_exhaustion)
        _check_window(attempts, lower_bound, lock_ttl, wait)
        self.attempts = attempts
        self.wait = wait_function
        self._lower_bound = lower_bound
        self._jitter = float(jitter)
        self.counters = _Counters()

    def wait_bound(self, executions: int) -> float | None:
        """At most how long the wait after execution ``executions`` lasts (0 after the last);
        ``None`` for ``wait="lock_ttl"``, where it is the holder's remaining TTL."""
        if executions >= self.attempts:
            return 0.0
        if self._lower_bound is None:
            return None
        # a constant wait adds at most `jitter` of itself; a callable's is exact (harmless here)
        return self._lower_bound(executions) * (1.0 + self._jitter)

    def conflict(
        self, function: object, error: LockAcquisitionError, executions: int
    ) -> float | None:
        """Count the conflict of execution ``executions``: the wait before the next one, or
        ``None`` when it was the last (then :meth:`exhaust` decides). Both cases are logged."""
        counters = self.counters
        counters.conflicts += 1
        if executions >= self.attempts:
            counters.exhausted += 1
            logger.info(
                "asynclock: %s: lock %r busy on execution %d of %d; retries exhausted "
                "(on_exhaustion=%s)",
                function_name(function),
                error.key,
                executions,
                self.attempts,
                self.exhaustion.name,
                extra={"lock_key": error.key, "executions": executions},
            )
            return None
        delay = self.wait(executions, error)
        counters.retries += 1
        logger.info(
            "asynclock: %s: lock %r busy on execution %d of %d; retrying in %.3f s",
            function_name(function),
            error.key,
            executions,
            self.attempts,
            delay,
            extra={"lock_key": error.key, "executions": executions, "wait": delay},
        )
        return delay

    def turn(self, turn_id: str, executions: int) -> contextlib.AbstractAsyncContextManager[Turn]:
        """The context of execution ``executions`` of the call (or job) ``turn_id``: in turn
        when ``fair`` (see ``asynclock._lock.turn``), a plain one otherwise."""
        return take_turns(
            turn_id,
            functools.partial(self.wait_bound, executions),
            fair=self.fair,
            window=self.fair_window,
        )

    async def exhaust(
        self,
        function: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
        kwargs: dict[str, object],
        error: LockAcquisitionError,
    ) -> object:
        """Run the exhaustion policy for a call whose last execution met ``error``."""
        return await self.exhaustion(_Exhausted(function, args, kwargs, error, self.counters))

    async def run(
        self,
        function: Callable[..., Coroutine[object, object, R]],
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> R | None:
        """One call of the core decorator: execute, and on a conflict sleep and execute again."""
        self.counters.calls += 1
        executions = 0
        turn_id = f"call:{uuid.uuid4().hex}"
        while True:
            executions += 1
            async with self.turn(turn_id, executions) as turn:
                try:
                    return await function(*args, **kwargs)
                except LockAcquisitionError as error:  # CancelledError never lands here
                    delay = self.conflict(function, error, executions)
                    if delay is None:
                        return cast("R | None", await self.exhaust(function, args, kwargs, error))
                    turn.keep()
            await asyncio.sleep(delay)
