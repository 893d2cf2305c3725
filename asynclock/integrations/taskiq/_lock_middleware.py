"""``LockMiddleware``: taskiq tasks that name a key run one at a time per key, across workers.

taskiq calls a middleware's ``pre_execute``, the task, and its ``post_execute`` in one asyncio
task of the worker (the receiver's callback). So the lock is entered in ``pre_execute`` with
:class:`~asynclock.AsyncLock`'s own ``async with`` protocol and left in ``post_execute``: it is
renewed while the task runs, and a lost lock cancels the task as it cancels an ``async with``
body. Whatever happens in between, the lock is released: by ``post_execute`` on every outcome
the receiver reports, by :class:`~asynclock.AsyncLock` itself if the callback task ends without
it, and by its TTL if the worker process dies.
"""

from __future__ import annotations

import contextvars
import logging
from typing import TYPE_CHECKING, Any, final

from taskiq import TaskiqMiddleware

from asynclock import AsyncLock, LockLostError, StateUnavailableError
from asynclock._validate import check_key, check_seconds, check_ttl
from asynclock.integrations.taskiq._keys import message_key

if TYPE_CHECKING:
    from taskiq import TaskiqMessage, TaskiqResult

    from asynclock import State

__all__ = ("LockMiddleware", "lock_token")

logger = logging.getLogger("asynclock")

#: the fencing token of the lock the running task holds (one asyncio task per execution)
_token: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "asynclock_taskiq_lock_token", default=None
)


def lock_token() -> int | None:
    """The fencing token of the key lock the running taskiq task holds (``None``: none).

    Call it inside a task run under :class:`LockMiddleware` (sync tasks too: taskiq copies the
    context into its executor): pass it to the store the task writes to, so a write of a task
    whose lock ran out is refused.
    """
    return _token.get()


@final
class LockMiddleware(TaskiqMiddleware):
    """Run taskiq tasks one at a time per key, across every worker sharing ``state``.

    ``broker.add_middlewares(LockMiddleware(state))``; a task names its key in a label,
    declared (``@broker.task(lock_key="invoice:{invoice_id}")``, a template filled in with the
    task's arguments by name) or given at ``kiq`` time
    (``task.kicker().with_labels(lock_key="invoice:42").kiq(...)``). Tasks without the label run
    as before.

    Invariants:

    * At most one task per key runs at any time, across every worker process sharing the state.
      A task whose key is busy waits for it in ``pre_execute`` (taking a worker slot while it
      waits), woken by the release, not by polling; waiters of one worker are served in arrival
      order, and every waiting worker gets its turn.
    * The lock is renewed every ``ttl / 3`` while the task runs. If it is lost anyway (the state
      was unreachable for ``ttl``), the task is cancelled and its result is the
      :class:`~asynclock.LockLostError`.
    * It is released when the task ends, whatever the outcome (result, exception, timeout,
      cancellation); a worker killed mid-task frees it after ``ttl``.
    * Fenced: :func:`lock_token` gives the running task its lock's fencing token, strictly
      increasing per key.
    * A task whose lock cannot be taken (``timeout`` ran out, or the state is unreachable) is
      not run: the error is logged and raised from ``pre_execute``, the message is not
      acknowledged, and an acknowledging broker (taskiq-redis's ``RedisStreamBroker``) delivers
      it again after its ``idle_timeout``.

    Args:
        state: where the locks live; every worker must share it (a server state).
        ttl: seconds a lock lives between renewals (a dead worker's key frees after this).
        timeout: seconds a task waits for its key at most (``None``: as long as it takes).
        label: the label that names a task's key.
        prefix: put before every key, to keep these locks apart from others in the state.
    """

    def __init__(
        self,
        state: State,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        label: str = "lock_key",
        prefix: str = "taskiq:",
    ) -> None:
        super().__init__()
        self._state = state
        self._ttl = check_ttl(ttl)
        self._timeout = check_seconds(timeout, "timeout", allow_zero=True, allow_none=True)
        self._label = check_key(label, "label")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__} {prefix!r}")
        self._prefix = prefix
        #: the lock the current execution holds (per asyncio task: one per execution)
        self._held: contextvars.ContextVar[AsyncLock | None] = contextvars.ContextVar(
            f"asynclock_taskiq_lock_{id(self)}", default=None
        )

    def __repr__(self) -> str:
        return f"<LockMiddleware label={self._label!r} ttl={self._ttl} state={self._state!r}>"

    @property
    def state(self) -> State:
        """The state the locks live in."""
        return self._state

    async def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        """Take the lock of the message's key (waiting for it) before the task runs."""
        key = message_key(message, self._label, self.broker)
        if key is None:
            return message
        lock = AsyncLock(
            self._state,
            self._prefix + key,
            ttl=self._ttl,
            timeout=self._timeout,
            auto_renew=True,
        )
        try:
            await lock.__aenter__()  # the `async with` protocol: renewed, cancels on loss
        except Exception as error:
            logger.error(
                "asynclock: taskiq task %s (%s) not run: lock %r not taken: %r",
                message.task_name,
                message.task_id,
                lock.key,
                error,
                extra={"lock_key": lock.key, "task_id": message.task_id},
            )
            raise
        self._held.set(lock)
        _token.set(lock.token)
        return message

    async def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        """Release the lock, whatever the task's outcome; report a loss in its result."""
        lock = self._held.get()
        if lock is None:
            return
        self._held.set(None)
        _token.set(None)
        error = result.error
        try:
            if error is None:
                await lock.__aexit__(None, None, None)
            else:
                await lock.__aexit__(type(error), error, error.__traceback__)
        except LockLostError as lost:
            # the task ran (part of it) without its lock: that is its outcome
            result.is_err = True
            result.error = lost
            logger.warning(
                "asynclock: taskiq task %s (%s) lost lock %r while running",
                message.task_name,
                message.task_id,
                lock.key,
                extra={"lock_key": lock.key, "task_id": message.task_id},
            )
        except StateUnavailableError as down:
            logger.warning(
                "asynclock: lock %r of taskiq task %s not released (%r); it expires by its TTL",
                lock.key,
                message.task_id,
                down,
                extra={"lock_key": lock.key, "task_id": message.task_id},
            )
