"""``UniqueMiddleware``: a second ``kiq`` of a key is refused while the first is pending or running.

The reservation is a lock-like record in the state whose owner is the *task id*, not a process:
``kiq`` takes it (``pre_send``), the worker that runs the task renews it and releases it
(``post_execute``), each compare-owner-then-act on the state, so only that task's executions can
extend or free it, from whichever process they run in. A record not renewed lapses after ``ttl``
(a task pending longer than that, or a worker that died mid-task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from taskiq import TaskiqMiddleware

from asynclock import AsynclockError, StateUnavailableError
from asynclock._validate import check_key, check_ttl
from asynclock.integrations.taskiq._keys import message_key

if TYPE_CHECKING:
    from taskiq import TaskiqMessage, TaskiqResult

    from asynclock import State

__all__ = ("TaskAlreadyQueuedError", "UniqueMiddleware")

logger = logging.getLogger("asynclock")

#: the label in which ``kiq`` leaves the reserved key for the worker
RESERVED_LABEL = "asynclock_unique"
#: seconds a reservation taken by ``pre_send`` lives until ``post_send`` confirms the send (a
#: send that failed, whose ``post_send`` never comes, does not block the key for ``ttl``)
SEND_LEASE = 10.0
#: the owner prefix of reservations: the rest is the task id
OWNER = "taskiq:"


class TaskAlreadyQueuedError(AsynclockError):
    """``kiq`` refused by :class:`UniqueMiddleware`: a task with the same key is pending or running.

    Nothing was sent. Wait for the first task (``AsyncTaskiqTask(task_id, result_backend)``),
    or kick again after ``retry_after``.

    Attributes:
        key: the unique key (the label's value, its template filled in).
        task_id: the id of the task that holds the key, or ``None`` when unknown.
        retry_after: seconds until its reservation lapses unless renewed (``None``: unknown).
    """

    def __init__(
        self, key: str, task_id: str | None, retry_after: float | None, message: str | None = None
    ) -> None:
        self.key = key
        self.task_id = task_id
        self.retry_after = retry_after
        if message is None:
            holder = f"task {task_id}" if task_id is not None else "another task"
            message = f"not sent: {holder} with unique key {key!r} is pending or running"
        super().__init__(message)

    def __reduce__(
        self,
    ) -> tuple[type[TaskAlreadyQueuedError], tuple[str, str | None, float | None, str]]:
        return (type(self), (self.key, self.task_id, self.retry_after, str(self)))


@dataclass
class _Running:
    """One execution's reservation: renewed while it runs, released when it ends."""

    reserved: str
    task_id: str
    renewer: asyncio.Task[None]
    rekicked: bool = False


@final
class UniqueMiddleware(TaskiqMiddleware):
    """Refuse to enqueue a taskiq task whose key is held by a task still pending or running.

    ``broker.add_middlewares(UniqueMiddleware(state))``; a task names its key in a label,
    declared (``@broker.task(unique_key="report:{day}")``, filled in with the task's arguments
    by name) or given at ``kiq`` time (``.with_labels(unique_key="report:2024-05-01")``).

    Invariants:

    * ``kiq`` reserves the key in the state for the task (its owner is the task id) before the
      message is sent. While the reservation stands, another ``kiq`` with that key sends
      nothing and raises :class:`TaskAlreadyQueuedError` (with the first task's id), across
      every process sharing the state.
    * A pending task keeps the key for ``ttl`` seconds; the worker running it renews it every
      ``ttl / 3`` and releases it when the task ends, whatever the outcome. A task re-kicked by
      a retry middleware during its execution (same task id) keeps it.
    * Only the task's own executions extend or release its reservation (compare-owner, atomic):
      a late release never frees a key that another task reserved since.
    * A reservation not renewed lapses after ``ttl``: a task pending longer than that, or whose
      worker died mid-task, no longer holds the key. A send that failed frees it within
      ``min(ttl, 10)`` seconds.
    * An unreachable state refuses the ``kiq`` (:class:`~asynclock.StateUnavailableError`, nothing
      sent); on the worker, the task runs and the failure is logged.

    Args:
        state: where reservations live; the clients that ``kiq`` and the workers must share it.
        ttl: seconds a reservation lives unless renewed: how long a pending task stays unique.
        label: the label that names a task's key.
        prefix: put before every key in the state.
    """

    def __init__(
        self,
        state: State,
        *,
        ttl: float = 300.0,
        label: str = "unique_key",
        prefix: str = "taskiq-unique:",
    ) -> None:
        super().__init__()
        self._state = state
        self._ttl = check_ttl(ttl)
        self._label = check_key(label, "label")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__} {prefix!r}")
        self._prefix = prefix
        #: executions running in this process, by their asyncio task (the receiver's callback)
        self._running: dict[asyncio.Task[Any], _Running] = {}
        self._refused = 0

    def __repr__(self) -> str:
        return (
            f"<UniqueMiddleware label={self._label!r} ttl={self._ttl} running="
            f"{len(self._running)} refused={self._refused} state={self._state!r}>"
        )

    @property
    def refused(self) -> int:
        """``kiq`` calls refused by this middleware in this process, since creation."""
        return self._refused

    async def pre_send(self, message: TaskiqMessage) -> TaskiqMessage:
        """Reserve the message's key for its task, or refuse the send."""
        key = message_key(message, self._label, self.broker)
        if key is None:
            return message
        reserved = self._prefix + key
        owner = OWNER + message.task_id
        grant = await self._state.acquire(reserved, owner, min(self._ttl, SEND_LEASE))
        if grant.token is None:
            holder = await self._state.inspect(reserved)
            first = None
            retry_after = grant.retry_after
            if holder is not None:
                retry_after = holder.remaining
                if holder.owner.startswith(OWNER):
                    first = holder.owner[len(OWNER) :]
            self._refused += 1
            logger.info(
                "asynclock: taskiq task %s not sent: unique key %r held by task %s",
                message.task_name,
                key,
                first,
                extra={"unique_key": key, "task_id": first},
            )
            raise TaskAlreadyQueuedError(key, first, retry_after)
        for running in self._running.values():
            if running.task_id == message.task_id:  # a retry re-kicks the running task
                running.rekicked = True
        message.labels[RESERVED_LABEL] = reserved
        return message

    async def post_send(self, message: TaskiqMessage) -> None:
        """The message is in the broker: keep the key for the whole ``ttl``."""
        reserved = message.labels.get(RESERVED_LABEL)
        if isinstance(reserved, str) and reserved:
            # False when the task already ran and released it: nothing is re-created
            await self._state.extend(reserved, OWNER + message.task_id, self._ttl)

    async def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        """Keep the key reserved, renewed, while the task runs."""
        reserved = message.labels.get(RESERVED_LABEL)
        execution = asyncio.current_task()
        if not isinstance(reserved, str) or not reserved or execution is None:
            return message
        owner = OWNER + message.task_id
        try:
            if not await self._state.extend(reserved, owner, self._ttl):
                # it lapsed while the task was pending: take it again if nobody else did
                grant = await self._state.acquire(reserved, owner, self._ttl)
                if grant.token is None:
                    logger.warning(
                        "asynclock: taskiq task %s (%s) runs, but its unique key %r lapsed "
                        "while it was pending and is held by another task now",
                        message.task_name,
                        message.task_id,
                        reserved,
                        extra={"unique_key": reserved, "task_id": message.task_id},
                    )
                    return message
        except StateUnavailableError as down:
            logger.warning(
                "asynclock: unique key %r of taskiq task %s not renewed (%r); the task runs",
                reserved,
                message.task_id,
                down,
                extra={"unique_key": reserved, "task_id": message.task_id},
            )
            return message
        renewer = asyncio.ensure_future(self._renew(reserved, owner))
        self._running[execution] = _Running(reserved, message.task_id, renewer)
        execution.add_done_callback(self._ended)
        return message

    async def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        """Release the key (keep it for a task re-kicked meanwhile)."""
        execution = asyncio.current_task()
        running = self._running.pop(execution, None) if execution is not None else None
        if running is not None:
            await self._finish(running)

    async def _renew(self, reserved: str, owner: str) -> None:
        while True:
            await asyncio.sleep(self._ttl / 3)
            try:
                if not await self._state.extend(reserved, owner, self._ttl):
                    logger.warning(
                        "asynclock: unique key %r of a running taskiq task was lost (taken "
                        "over after it lapsed)",
                        reserved,
                        extra={"unique_key": reserved, "owner": owner},
                    )
                    return
            except StateUnavailableError as down:  # the next renewal may get through
                logger.warning(
                    "asynclock: unique key %r not renewed (%r)",
                    reserved,
                    down,
                    extra={"unique_key": reserved},
                )

    async def _finish(self, running: _Running) -> None:
        running.renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running.renewer
        owner = OWNER + running.task_id
        try:
            if running.rekicked:  # pending again: unique for the whole ttl again
                await self._state.extend(running.reserved, owner, self._ttl)
            else:
                await self._state.release(running.reserved, owner)
        except StateUnavailableError as down:
            logger.warning(
                "asynclock: unique key %r not released (%r); it lapses after %s s",
                running.reserved,
                down,
                self._ttl,
                extra={"unique_key": running.reserved},
            )

    def _ended(self, execution: asyncio.Task[Any]) -> None:
        """The execution's task ended without ``post_execute`` (a later middleware raised, or
        the worker cancelled it): release its key all the same."""
        running = self._running.pop(execution, None)
        if running is None:
            return
        finishing = asyncio.get_running_loop().create_task(self._finish(running))
        _background.add(finishing)
        finishing.add_done_callback(_background.discard)


#: releases started from a done callback, kept referenced until they end
_background: set[asyncio.Task[None]] = set()
