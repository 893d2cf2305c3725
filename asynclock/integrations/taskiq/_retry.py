"""``retry_on_lock_conflict`` for taskiq tasks: a conflict re-kicks the task with a delay.

The same parameters and meanings as :func:`asynclock.retry_on_lock_conflict`; only the wait
moves out of the worker. On a conflict the task is kicked again through its broker, with the
same task id and its try counter in taskiq's own retry label (``_retries``, the one
``SmartRetryMiddleware`` keeps), then the running execution ends with ``NoResultError`` (no
result stored, no error retry): the worker's slot is free during the wait.

The delay: taskiq's Redis brokers deliver at once, so the re-kick goes to a
:class:`taskiq.ScheduleSource` (``schedule_source=``, e.g. ``taskiq_redis.ListRedisScheduleSource``)
that ``taskiq scheduler`` sends when due, the way ``SmartRetryMiddleware(schedule_source=...)``
delays. The schedule is stored in Redis: a worker (or the scheduler) that dies during the wait
loses nothing. Without a schedule source the delay goes in the ``delay`` label, for brokers that
honour it (e.g. RabbitMQ's).

The task reads its execution from taskiq's :class:`taskiq.Context`, so its signature asks for it,
as any taskiq task does: ``context: Context = TaskiqDepends()``.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from taskiq import AsyncBroker, Context, ScheduleSource
from taskiq.exceptions import NoResultError
from taskiq.kicker import AsyncKicker

from asynclock._retry.retrying import ExhaustionSpec, Retrying, WaitSpec, function_name
from asynclock.integrations._jobs import (
    Execution,
    attempts_needed,
    job_decorator,
    too_few_tries,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

P = ParamSpec("P")

R = TypeVar("R")
B = TypeVar("B", bound=AsyncBroker)

__all__ = ["check_tries", "retry_on_lock_conflict"]

#: taskiq's retry counter label: executions so far before this one (absent: 0)
RETRIES_LABEL = "_retries"


class _TaskiqQueue:
    """taskiq's part of the job decorator: the ``_retries`` label counts, a delayed re-kick of
    the same message re-enqueues, and ``NoResultError`` ends the execution."""

    noun = "taskiq tasks"

    def __init__(self, source: ScheduleSource | None) -> None:
        self._source = source

    def execution(
        self, function: object, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> Execution[Context]:
        context = _context_of(function, args, kwargs)
        message = context.message
        number = int(message.labels.get(RETRIES_LABEL, 0)) + 1
        return Execution(number, f"taskiq:{message.task_id}", context)

    async def requeue(self, execution: Execution[Context], delay: float) -> BaseException:
        await _kick_later(execution.handle, execution.number, delay, self._source)
        # no result stored, and no error retry by a retry middleware
        return NoResultError()


def retry_on_lock_conflict(
    *,
    wait: WaitSpec = 1.0,
    attempts: int = 3,
    on_exhaustion: ExhaustionSpec = "raise",
    jitter: float = 0.15,
    lock_ttl: float | None = None,
    schedule_source: ScheduleSource | None = None,
    fair: bool = True,
    fair_window: float = 3.0,
) -> Callable[
    [Callable[P, Coroutine[object, object, R]]], Callable[P, Coroutine[object, object, R | None]]
]:
    """Retry a taskiq task when it raises :class:`~asynclock.LockAcquisitionError`, through taskiq.

    Put it under ``@broker.task``. ``wait``, ``attempts``, ``on_exhaustion``, ``jitter`` and
    ``lock_ttl`` mean what they mean for :func:`asynclock.retry_on_lock_conflict`, executions
    counted by taskiq's ``_retries`` label (+1). On the last execution ``on_exhaustion`` runs in
    it, a callable given the task's arguments as the task got them.

    Args:
        wait: seconds (plus ``jitter``), a callable ``executions -> seconds``, or ``"lock_ttl"``.
        attempts: total executions of the task.
        on_exhaustion: ``"raise"``, ``"drop"``, ``"process_without_lock"`` or a callable.
        jitter: the random fraction added to a constant ``wait``.
        lock_ttl: the TTL of the lock the task takes: a retry window shorter than it is a
            ``ValueError`` here, at decoration time.
        schedule_source: where a delayed re-kick waits (served by ``taskiq scheduler``). Needed
            with taskiq-redis, whose brokers have no delayed delivery. Note that
            ``taskiq scheduler`` checks its sources every second (``--update-interval``, whole
            seconds), so delays are served to about a second.
        fair: take turns (see the docs' jobs page): a task that met a lock busy earlier gets it
            before one that met it later, across workers. Needs a state with the
            :class:`~asynclock.state.FairState` capability (memory, Redis).
        fair_window: seconds a task's place in a key's line is kept beyond its own wait (the
            scheduler's latency comes on top of the wait: keep it above two seconds).

    Raises:
        TypeError: the task is not an ``async def`` function, or a bad argument type.
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
    if schedule_source is not None and not isinstance(schedule_source, ScheduleSource):
        raise TypeError(f"schedule_source must be a taskiq ScheduleSource, got {schedule_source!r}")
    _check_list_prefix(schedule_source)
    return job_decorator(retrying, _TaskiqQueue(schedule_source))


def _context_of(function: object, args: tuple[object, ...], kwargs: dict[str, object]) -> Context:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Context):
            return value
    raise TypeError(
        f"{function_name(function)} retries through taskiq and needs its execution's taskiq "
        "Context: add a parameter `context: Context = TaskiqDepends()` to the task (and run it "
        "in a taskiq worker)"
    )


def _check_list_prefix(source: ScheduleSource | None) -> None:
    """Refuse a taskiq-redis ``ListRedisScheduleSource`` whose prefix holds a ``:``.

    It keeps timed schedules in one list per minute and reads a *past* minute's list back by
    splitting its key on ``:`` (``_parse_time_key``, taskiq-redis 1.0-1.2): under a prefix
    with a colon that parse fails, so a retry that was not fetched within its own minute (one
    due just before a minute boundary) is never sent, and the job is lost silently.
    """
    if type(source).__name__ != "ListRedisScheduleSource":
        return
    prefix = getattr(source, "_prefix", None)
    if isinstance(prefix, str) and ":" in prefix:
        raise ValueError(
            f"schedule_source: a ListRedisScheduleSource with prefix {prefix!r} loses retries "
            "due across a minute boundary (taskiq-redis splits its keys on ':' to read past "
            "minutes back); use a prefix without ':', e.g. "
            f"{prefix.replace(':', '-')!r}"
        )


async def _kick_later(
    context: Context, executions: int, delay: float, source: ScheduleSource | None
) -> None:
    """Send the same message (task id, arguments, labels) again, due in ``delay`` seconds."""
    message = context.message
    kicker: AsyncKicker[..., object] = (
        AsyncKicker(task_name=message.task_name, broker=context.broker, labels=message.labels)
        .with_task_id(message.task_id)
        .with_labels(**{RETRIES_LABEL: executions})
    )
    if source is None:
        await kicker.with_labels(delay=delay).kiq(*message.args, **message.kwargs)
        return
    due = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=delay)
    await kicker.schedule_by_time(source, due, *message.args, **message.kwargs)


def check_tries(broker: B) -> B:
    """Check that no decorated task of ``broker`` is declared with fewer tries than it needs.

    A task declared ``@broker.task(max_retries=N)`` (taskiq's total executions for its retry
    middlewares) whose ``retry_on_lock_conflict(attempts=...)`` is larger would retry lock
    conflicts past the budget its author set: a ``ValueError`` naming both numbers. Call it in
    the module the worker imports, after the tasks are declared; returns ``broker``.
    """
    for task in broker.get_all_tasks().values():
        attempts = attempts_needed(getattr(task, "original_func", None))
        declared = task.labels.get("max_retries")
        if attempts is not None and declared is not None and int(declared) < attempts:
            raise too_few_tries(
                f"taskiq task {task.task_name!r}",
                attempts,
                f"it is declared with max_retries={declared}",
                "max_retries",
            )
    return broker
