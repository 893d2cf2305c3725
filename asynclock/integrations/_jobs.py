"""The job form of ``retry_on_lock_conflict``, shared by the arq and taskiq integrations.

A job decorator is the core decorator's policy (:class:`~asynclock._retry.retrying.Retrying`) with the
wait moved out of the worker: on a conflict before the last try the job is put back in its
framework's queue with the wait as its delay, and the running execution ends. Everything but
two things is the same for every framework, and lives here: the checks, the counters, the fair
turn, the exhaustion policy in the last try, and the attempts a decorated job needs (which the
frameworks' ``check_tries`` compare with what they allow). A framework supplies a
:class:`JobQueue`: how to read an execution (its try number and job id) from the job's
arguments, and how to re-enqueue it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, ParamSpec, Protocol, TypeVar, cast

from asynclock._errors import LockAcquisitionError
from asynclock._retry.retrying import check_coroutine_function

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from asynclock._retry.retrying import Retrying

P = ParamSpec("P")

R = TypeVar("R")
H = TypeVar("H")

__all__ = ("Execution", "JobQueue", "attempts_needed", "job_decorator", "too_few_tries")

#: the attribute a decorated job carries: the tries it needs its framework to allow
ATTEMPTS = "__asynclock_attempts__"


@dataclass(frozen=True, slots=True)
class Execution(Generic[H]):
    """One execution of a job, as its framework counts it.

    Attributes:
        number: the framework's try number, 1 for the first.
        job_id: what identifies the job across its tries (its place in fair lines).
        handle: what the framework needs to re-enqueue it (arq's ``ctx``, taskiq's ``Context``).
    """

    number: int
    job_id: str
    handle: H


class JobQueue(Protocol[H]):
    """What a framework tells the shared job decorator."""

    #: what the decorator decorates, for messages (``"arq jobs"``, ``"taskiq tasks"``)
    noun: str

    def execution(
        self, function: object, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> Execution[H]:
        """The execution a call with ``args``/``kwargs`` is (``TypeError`` outside a worker)."""
        ...

    async def requeue(self, execution: Execution[H], delay: float) -> BaseException:
        """Put the job back in its queue, due in ``delay`` seconds; return the exception that
        ends the current execution (the framework's own: arq's ``Retry``, taskiq's
        ``NoResultError``)."""
        ...


def job_decorator(
    retrying: Retrying, queue: JobQueue[H]
) -> Callable[
    [Callable[P, Coroutine[object, object, R]]], Callable[P, Coroutine[object, object, R | None]]
]:
    """The decorator of ``retry_on_lock_conflict`` for the jobs of ``queue``'s framework."""

    def decorate(
        function: Callable[P, Coroutine[object, object, R]],
    ) -> Callable[P, Coroutine[object, object, R | None]]:
        check_coroutine_function(function, queue.noun)

        @functools.wraps(function)
        async def job(*args: P.args, **kwargs: P.kwargs) -> R | None:
            execution = queue.execution(function, args, kwargs)
            if execution.number == 1:
                retrying.counters.calls += 1
            async with retrying.turn(execution.job_id, execution.number) as turn:
                try:
                    return await function(*args, **kwargs)
                except LockAcquisitionError as error:
                    delay = retrying.conflict(function, error, execution.number)
                    if delay is None:
                        result = await retrying.exhaust(function, args, kwargs, error)
                        return cast("R | None", result)
                    ending = await queue.requeue(execution, delay)
                    turn.keep()  # the job comes back: it keeps its places in the lines
                    raise ending from error

        setattr(job, ATTEMPTS, retrying.attempts)
        job.statistics = retrying.counters.snapshot  # type: ignore[attr-defined]
        return job

    return decorate


def attempts_needed(function: object) -> int | None:
    """The ``attempts`` of a job decorated by :func:`job_decorator`; ``None`` for another."""
    attempts = getattr(function, ATTEMPTS, None)
    return attempts if isinstance(attempts, int) else None


def too_few_tries(job: str, attempts: int, allowed: str, setting: str) -> ValueError:
    """The error of a framework's ``check_tries`` when ``job`` may not run ``attempts`` times.

    Args:
        job: the job, as the framework names it (``"arq job 'handle'"``).
        attempts: the tries its ``retry_on_lock_conflict`` needs.
        allowed: what allows fewer (``"the worker allows max_tries=2 (...)"``).
        setting: the setting to raise (``"max_tries"``).
    """
    return ValueError(
        f"{job} needs {attempts} tries (retry_on_lock_conflict(attempts={attempts})), but "
        f"{allowed}: raise {setting} to at least {attempts} or lower attempts"
    )
