"""``retry_on_lock_conflict`` for arq jobs: a conflict re-enqueues the job with ``Retry(defer=)``.

The same parameters and meanings as :func:`asynclock.retry_on_lock_conflict`; only the wait
moves out of the worker. On a conflict the job raises arq's ``Retry(defer=delay)``: arq puts it
back in its queue (a sorted set in Redis) scored for ``now + delay``, so the worker's slot is free
during the wait, and a worker that dies meanwhile loses nothing: any worker takes the job when
it is due. ``attempts`` is arq's own try counter (``ctx["job_try"]``), so a try that a killed
worker never finished counts too, as arq counts it.

A worker must allow at least ``attempts`` tries (``max_tries`` of the worker, or of
``arq.func(job, max_tries=...)``), or arq would fail the job before its exhaustion policy runs:
decorate the settings class with :func:`check_tries` to make that a ``ValueError`` when the
worker module is imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Mapping
from typing import ParamSpec, TypeVar, cast

try:
    from arq.worker import Function, Retry, Worker
except ImportError as exc:  # pragma: no cover - exercised without the extra only
    raise ImportError("asynclock.integrations.arq needs arq: pip install 'asynclock[arq]'") from exc

from asynclock._retry.retrying import ExhaustionSpec, Retrying, WaitSpec, function_name
from asynclock.integrations._jobs import (
    Execution,
    attempts_needed,
    job_decorator,
    too_few_tries,
)

P = ParamSpec("P")

R = TypeVar("R")
S = TypeVar("S")

__all__ = ["check_tries", "retry_on_lock_conflict"]


class _ArqQueue:
    """arq's part of the job decorator: ``ctx["job_try"]`` counts, ``Retry(defer=)`` re-enqueues."""

    noun = "arq jobs"

    def execution(
        self, function: object, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> Execution[None]:
        ctx = args[0] if args else None
        if not isinstance(ctx, Mapping) or "job_try" not in ctx:
            raise TypeError(
                f"{function_name(function)} runs as an arq job: its first argument must be arq's "
                f"ctx (with 'job_try'), got {type(ctx).__name__}"
            )
        return Execution(int(ctx["job_try"]), f"arq:{ctx.get('job_id')}", None)

    async def requeue(self, execution: Execution[None], delay: float) -> BaseException:
        # arq puts the job back in its queue, scored for now + delay, once the job raises this
        return Retry(defer=delay)


def retry_on_lock_conflict(
    *,
    wait: WaitSpec = 1.0,
    attempts: int = 3,
    on_exhaustion: ExhaustionSpec = "raise",
    jitter: float = 0.15,
    lock_ttl: float | None = None,
    fair: bool = True,
    fair_window: float = 2.0,
) -> Callable[
    [Callable[P, Coroutine[object, object, R]]], Callable[P, Coroutine[object, object, R | None]]
]:
    """Retry an arq job when it raises :class:`~asynclock.LockAcquisitionError`, through arq.

    ``wait``, ``attempts``, ``on_exhaustion``, ``jitter`` and ``lock_ttl`` mean exactly what
    they mean for :func:`asynclock.retry_on_lock_conflict`, with executions counted by arq's
    ``ctx["job_try"]``. On a conflict before the last try the job raises
    ``arq.Retry(defer=wait)``; on the last one ``on_exhaustion`` runs in that try, a callable
    given the job's original arguments (``ctx`` first, as arq called the job).

    Args:
        wait: seconds (plus ``jitter``), a callable ``executions -> seconds``, or ``"lock_ttl"``.
        attempts: total tries, counted by arq (``ctx["job_try"]``).
        on_exhaustion: ``"raise"``, ``"drop"``, ``"process_without_lock"`` or a callable.
        jitter: the random fraction added to a constant ``wait``.
        lock_ttl: the TTL of the lock the job takes: a retry window shorter than it is a
            ``ValueError`` here, at decoration time.
        fair: take turns (see the docs' jobs page): a job that met a lock busy earlier gets it
            before one that met it later, across workers. Needs a state with the
            :class:`~asynclock.state.FairState` capability (memory, Redis).
        fair_window: seconds a job's place in a key's line is kept beyond its own retry delay;
            a job that vanished (or comes back later than that) loses its place, so it can never
            block the key for longer than its wait plus this window.

    Raises:
        TypeError: the job is not an ``async def`` function, or a bad argument type.
        ValueError: a bad argument, or a retry window shorter than ``lock_ttl``.
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
    return job_decorator(retrying, _ArqQueue())


def check_tries(settings: S) -> S:
    """Check that arq allows every decorated job its ``attempts``; return ``settings`` as is.

    Use it as a class decorator on the ``WorkerSettings`` that ``arq module.WorkerSettings``
    loads (or call it on a settings dict), so a misconfiguration stops the worker at start-up
    instead of failing jobs later with arq's "max retries exceeded":

    >>> from asynclock.integrations.arq import check_tries, retry_on_lock_conflict
    >>> @retry_on_lock_conflict(wait=lambda n: n, attempts=3)
    ... async def handle(ctx, entry): ...
    >>> @check_tries
    ... class WorkerSettings:
    ...     functions = [handle]
    ...     max_tries = 2
    Traceback (most recent call last):
    ...
    ValueError: arq job 'handle' needs 3 tries (retry_on_lock_conflict(attempts=3)), but the worker allows max_tries=2 (WorkerSettings.max_tries): raise max_tries to at least 3 or lower attempts

    Raises:
        ValueError: a decorated job whose effective ``max_tries`` is below its ``attempts``,
            or settings with ``retry_jobs = False`` (arq would never re-enqueue the job).
    """
    values = cast(
        "Mapping[str, object]", settings if isinstance(settings, Mapping) else vars(settings)
    )
    where = "WorkerSettings" if not isinstance(settings, Mapping) else "the settings"
    worker_default = inspect.signature(Worker).parameters["max_tries"].default
    default_tries = values.get("max_tries", worker_default)
    functions = cast("list[object]", list(cast("list[object]", values.get("functions", []))))
    for entry in functions:
        coroutine = entry.coroutine if isinstance(entry, Function) else entry
        attempts = attempts_needed(coroutine)
        if attempts is None:
            continue
        if values.get("retry_jobs", True) is False:
            raise ValueError(
                f"arq job {function_name(coroutine)!r} retries lock conflicts through arq, but "
                f"{where}.retry_jobs is False: arq would never run it again"
            )
        tries: object
        if isinstance(entry, Function) and entry.max_tries is not None:
            tries, source = entry.max_tries, "arq.func(..., max_tries=)"
        else:
            tries = default_tries
            source = f"{where}.max_tries" if "max_tries" in values else "arq's default"
        if not isinstance(tries, int) or tries < attempts:
            raise too_few_tries(
                f"arq job {function_name(coroutine)!r}",
                attempts,
                f"the worker allows max_tries={tries} ({source})",
                "max_tries",
            )
    return settings
