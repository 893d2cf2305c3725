"""Entry point of the worker processes of the chaos soak (``test_soak.py``), and its effect store.

Imported by a *spawned* interpreter: only asynclock and the drivers here, no pytest. A worker
is what a webhook service runs: an :class:`EventDispatcher` with ``on_lock_conflict="queue"``
over a state of the *lock* server (the one the test injects faults into), built from a
:class:`LockSpec`: a :class:`RedisState` of a throwaway Redis, or a :class:`PostgresState` /
:class:`MySQLState` of the shared loopback server, reached through the test's fault proxy, with
the key prefix and session tag (``application_name`` on PostgreSQL, a user of its own on
MariaDB) of this test alone. It takes deliveries from its inbox (a list on the *store* server,
a Redis that is never faulted: the platform's HTTP, so to speak), dispatches each one
concurrently and reports the outcome to the platform.

The handler writes to the **effect store** (plain redis-py on the store server) with the fencing
token of its lock, in three steps, each one ``STAMP`` script stamped with the store's clock
(one clock for every process):

* ``begin``: enters the critical section; fenced (a token lower than the highest one seen for
  the key is rejected, an accepted one becomes the highest);
* a short await (a few ms, sometimes a few hundred: a slow handler), so faults can land inside;
* ``apply``: fenced; if accepted, appends the event to the thread's list and counts one
  application of the event;
* ``end``: leaves the critical section (also when cancelled: a lost lock cancels the handler).

A rejected ``begin`` or ``apply`` makes the handler raise :class:`StaleTokenError`, as a
fenced store's error would: the dispatch reports ``failed`` and the platform redelivers.
Every stamp carries the handler call's ``ctx.attempt``, and the store counts, per worker
process, the handler calls inside their critical section (``HANDLING``): the platform kills a
worker mid-handler with it.

In the **durable mode** a worker answers each delivery once ``EventDispatcher.accept``
returned (``accepted`` or ``duplicate`` acknowledge; ``StateUnavailableError`` and
``InboxFullError`` answer ``failed``, and the platform redelivers), and its ``serve()`` runs the
same handler on the inbox. With each answer it reports the store time it had the answer at
(``answered``): the history check orders the accepts by it.

With its outcome, a worker reports whether the dispatcher could not keep the event's dedupe
claim (it logged that renewing the claim's lease, or marking it done, failed): the history
check needs it to tell the documented at-least-once of an unreachable state from a bug. The
dispatcher's warnings are matched to the delivery by a context variable set around
``dispatch()`` (the lease's renewal task inherits it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
from redis.asyncio import Redis

from asynclock import (
    Event,
    EventDispatcher,
    HandlerContext,
    InboxFullError,
    Outcome,
    StateUnavailableError,
)
from asynclock.state import MySQLState, PostgresState, RedisState
from tests._helpers import reply
from tests.faults._soak_history import RAISED

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from asynclock.state import State

#: the dispatcher's settings (the test's figures and delays depend on them)
LOCK_TTL = 1.0
DEDUPE_TTL = 600.0
QUEUE_TIMEOUT = 5.0
#: durable mode: deliveries of an inbox entry before it is dead-lettered (a dead letter is never
#: applied: the history check reports it lost); a fenced handler fails a few times at most
MAX_ATTEMPTS = 50
#: op_timeout and connect_timeout of the lock state
OP_TIMEOUT = 0.5
#: connections of a worker's SQL state (the shared servers' connection slots are finite)
SQL_CONNECTIONS = 8
#: the handler's await between begin and apply: usually a few ms, sometimes a slow handler
SLOW_SHARE = 0.15
FAST = (0.002, 0.015)
SLOW = (0.15, 0.4)

#: keys of the store server
RESULTS = "soak:results"
LOG = "soak:log"
APPLIED = "soak:applied"
#: pid -> handler calls of that worker process inside their critical section right now
HANDLING = "soak:handling"


def inbox(worker: str) -> str:
    return f"soak:inbox:{worker}"


def highest(lock_key: str) -> str:
    return f"soak:highest:{lock_key}"


def thread_list(lock_key: str) -> str:
    return f"soak:thread:{lock_key}"


#: KEYS: highest token of the key, the log, the per-event counts, the thread's list, HANDLING;
#: ARGV: kind, lock key, token, event, delivery, pid, status, attempt. Returns 1 (accepted) or 0.
STAMP = """
local now = redis.call('TIME')
local at = now[1] .. string.format('%06d', tonumber(now[2]))
local kind = ARGV[1]
local ok = 1
if kind == 'begin' then
  redis.call('HINCRBY', KEYS[5], ARGV[6], 1)
elseif kind == 'end' then
  redis.call('HINCRBY', KEYS[5], ARGV[6], -1)
end
if kind ~= 'end' then
  local seen = redis.call('GET', KEYS[1])
  if seen and tonumber(ARGV[3]) < tonumber(seen) then
    ok = 0
  else
    redis.call('SET', KEYS[1], ARGV[3])
    if kind == 'apply' then
      redis.call('RPUSH', KEYS[4], ARGV[4])
      redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
    end
  end
end
redis.call('RPUSH', KEYS[2], cjson.encode({kind = kind, key = ARGV[2], token = ARGV[3],
  event = ARGV[4], delivery = ARGV[5], pid = ARGV[6], status = ARGV[7], at = at, ok = ok,
  attempt = ARGV[8]}))
return ok
"""


@dataclass(frozen=True)
class LockSpec:
    """How a worker reaches the lock state (picklable: it is handed to spawned processes).

    Attributes:
        url: ``redis://``, ``postgresql://`` or ``mysql://`` (on MariaDB with the test's own
            user and password, the tag of its sessions).
        prefix: the key prefix of this test's locks and dedupe records.
        application_name: PostgreSQL: the tag of this test's sessions.
    """

    url: str
    prefix: str
    application_name: str | None = None

    def open(self) -> State:
        """A new state with the soak's timeouts (op and connect: ``OP_TIMEOUT``)."""
        scheme = urlsplit(self.url).scheme
        if scheme in ("postgresql", "postgres"):
            return PostgresState.from_url(
                self.url,
                prefix=self.prefix,
                application_name=self.application_name,
                max_connections=SQL_CONNECTIONS,
                op_timeout=OP_TIMEOUT,
                connect_timeout=OP_TIMEOUT,
            )
        if scheme == "mysql":
            return MySQLState.from_url(
                self.url,
                prefix=self.prefix,
                max_connections=SQL_CONNECTIONS,
                op_timeout=OP_TIMEOUT,
                connect_timeout=OP_TIMEOUT,
            )
        return RedisState.from_url(
            self.url, prefix=self.prefix, op_timeout=OP_TIMEOUT, connect_timeout=OP_TIMEOUT
        )


#: the delivery being dispatched in this task (and in the tasks it starts)
DELIVERY: ContextVar[str | None] = ContextVar("soak_delivery", default=None)
#: the dispatcher's warnings that say an event's claim could not be kept, by their templates
UNKEPT = {
    "renew": "asynclock: could not renew the claim lease of",
    "mark": "asynclock: could not mark event claim",
}


class ClaimWarnings(logging.Handler):
    """Collects, per delivery, which of the ``UNKEPT`` warnings its dispatch logged."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.unkept: dict[str, set[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        delivery = DELIVERY.get()
        if delivery is None or not isinstance(record.msg, str):
            return
        for kind, template in UNKEPT.items():
            if record.msg.startswith(template):
                self.unkept.setdefault(delivery, set()).add(kind)


class StaleTokenError(Exception):
    """The effect store rejected a write: a newer holder of the key has written already."""


def event_of(message: dict[str, str]) -> Event:
    """The event of one delivery (``message_id`` is the dedupe key; ``raw`` names the delivery)."""
    return Event(
        type="message",
        adapter="soak",
        channel_id="C1",
        thread_id=message["thread"],
        message_id=message["event"],
        raw={"delivery": message["delivery"]},
    )


def serve(
    worker: str, lock: LockSpec, store_url: str, seed: str, log: str, durable: bool = False
) -> None:
    """Serve the inbox of ``worker`` until a ``stop`` message (or SIGKILL).

    Each delivery is dispatched (``dispatch()``), or with ``durable`` accepted (``accept()``)
    while a ``serve()`` drains the durable inbox. The dispatcher's log lines (one per outcome,
    the warnings) go to the file ``log``.
    """
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    library = logging.getLogger("asynclock")
    library.addHandler(handler)
    library.setLevel(logging.INFO)
    library.propagate = False
    warnings = ClaimWarnings()
    library.addHandler(warnings)
    asyncio.run(_serve(worker, lock, store_url, seed, warnings, durable=durable))


def _log_tasks() -> None:
    lines = []
    for task in asyncio.all_tasks():
        frames = task.get_stack()
        where = " <- ".join(
            f"{f.f_code.co_name} ({os.path.basename(f.f_code.co_filename)}:{f.f_lineno})"
            for f in reversed(frames)
        )
        lines.append(f"  {task.get_name()}: {where or 'not started'}")
    logging.getLogger("asynclock").warning(
        "soak worker %d: %d tasks still running:\n%s", os.getpid(), len(lines), "\n".join(lines)
    )


class _Worker:
    def __init__(
        self, worker: str, store: Redis, stamp: AsyncScript, seed: str, warnings: ClaimWarnings
    ) -> None:
        self.worker = worker
        self.warnings = warnings
        self.store = store
        self.stamp_script = stamp
        self.pid = os.getpid()
        self.rng = random.Random(f"{seed}-{worker}")
        #: delivery -> the error a failed dispatch reported to ``on_outcome``
        self.errors: dict[str, str] = {}

    async def on_outcome(self, event: Event, outcome: Outcome, error: BaseException | None) -> None:
        if error is not None:
            self.errors[str(event.raw["delivery"])] = f"{type(error).__name__}: {error}"

    async def stamp(
        self, kind: str, event: Event, ctx: HandlerContext, token: int, status: str = ""
    ) -> bool:
        keys = [highest(ctx.lock_key), LOG, APPLIED, thread_list(ctx.lock_key), HANDLING]
        args: list[str | int] = [
            kind,
            ctx.lock_key,
            token,
            str(event.message_id),
            str(event.raw["delivery"]),
            self.pid,
        ]
        return bool(await self.stamp_script(keys=keys, args=[*args, status, ctx.attempt]))

    async def handle(self, event: Event, ctx: HandlerContext) -> None:
        token = ctx.token
        if token is None:
            raise AssertionError(f"no fencing token for {event.message_id} under {ctx.lock_key}")
        status = "cancelled"
        try:
            if not await self.stamp("begin", event, ctx, token):
                status = "stale"
                raise StaleTokenError(f"begin {event.message_id} with token {token}")
            slow = self.rng.random() < SLOW_SHARE
            await asyncio.sleep(self.rng.uniform(*(SLOW if slow else FAST)))
            if not await self.stamp("apply", event, ctx, token):
                status = "stale"
                raise StaleTokenError(f"apply {event.message_id} with token {token}")
            status = "ok"
        except Exception:
            if status == "cancelled":
                status = "error"
            raise
        finally:
            # a lost lock cancels the handler through the lock's (level-triggered) cancel scope:
            # shield the end stamp, or it would be cancelled too
            with anyio.CancelScope(shield=True):
                await self.stamp("end", event, ctx, token, status)

    async def now(self) -> int:
        """The store's clock (microseconds), the one every stamp of the history uses."""
        seconds, micros = await self.store.time()
        return int(seconds) * 1_000_000 + int(micros)

    async def deliver(self, bot: EventDispatcher, message: dict[str, str]) -> None:
        error: str | None = None
        received = await self.now()
        delivery = message["delivery"]
        DELIVERY.set(delivery)  # this task's own context: the dispatch's warnings name it
        try:
            outcome: str = (await bot.dispatch(event_of(message))).value
            error = self.errors.pop(delivery, None)
        except Exception as exc:  # noqa: BLE001 - raise_errors=False: reported as a finding
            outcome, error = RAISED, f"{type(exc).__name__}: {exc}"
        unkept = sorted(self.warnings.unkept.pop(delivery, ()))
        await self.answer(delivery, outcome, error, received, unkept=unkept)

    async def accept(self, bot: EventDispatcher, message: dict[str, str]) -> None:
        """The durable mode's delivery: answered once ``accept`` returned, handled by serve()."""
        error: str | None = None
        received = await self.now()
        try:
            outcome: str = (await bot.accept(event_of(message))).value
        except (StateUnavailableError, InboxFullError) as exc:  # the platform redelivers
            outcome, error = Outcome.FAILED.value, f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - any other error is reported as a finding
            outcome, error = RAISED, f"{type(exc).__name__}: {exc}"
        await self.answer(message["delivery"], outcome, error, received, answered=await self.now())

    async def serve_ended(self, serving: asyncio.Task[None]) -> None:
        """Report that ``serve()`` returned or raised before the stop: a finding."""
        error = "cancelled" if serving.cancelled() else repr(serving.exception())
        report = {"kind": "serve-ended", "worker": self.worker, "pid": self.pid, "error": error}
        await reply(self.store.rpush(RESULTS, json.dumps(report)))

    async def answer(
        self,
        delivery: str,
        outcome: str,
        error: str | None,
        received: int,
        *,
        unkept: list[str] | None = None,
        answered: int | None = None,
    ) -> None:
        """Report a delivery's outcome to the platform."""
        report: dict[str, object] = {"kind": "outcome", "delivery": delivery}
        report |= {"outcome": outcome, "error": error, "received": received}
        report |= {"unkept": unkept or [], "answered": answered}
        report |= {"worker": self.worker, "pid": self.pid}
        await reply(self.store.rpush(RESULTS, json.dumps(report)))


async def _serve(
    worker: str,
    lock: LockSpec,
    store_url: str,
    seed: str,
    warnings: ClaimWarnings,
    *,
    durable: bool,
) -> None:
    # SIGUSR1 (sent by the platform when this worker does not stop in time) logs where every
    # task is: a dispatch or a close that hangs shows up in the worker's log
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _log_tasks)
    store = Redis.from_url(store_url, socket_timeout=10.0, socket_connect_timeout=5.0)
    state = lock.open()
    me = _Worker(worker, store, store.register_script(STAMP), seed, warnings)
    bot = EventDispatcher(
        state,
        on_lock_conflict="queue",
        lock_ttl=LOCK_TTL,
        dedupe_ttl=DEDUPE_TTL,
        raise_errors=False,
        queue_timeout=QUEUE_TIMEOUT,
        max_attempts=MAX_ATTEMPTS,
        # the durable mode answers from accept(); the drain's failures are the handler's own
        on_outcome=None if durable else me.on_outcome,
    )
    bot.add_handler("message", me.handle)
    deliver = me.accept if durable else me.deliver
    tasks: set[asyncio.Task[None]] = set()
    serving = asyncio.create_task(bot.serve()) if durable else None
    await store.rpush(RESULTS, json.dumps({"kind": "ready", "worker": worker, "pid": me.pid}))
    try:
        while True:
            item = await store.blpop([inbox(worker)], timeout=1)
            if serving is not None and serving.done():
                await me.serve_ended(serving)
                serving = None
            if item is None:
                continue
            message: dict[str, str] = json.loads(item[1])
            if message["kind"] == "stop":
                break
            task = asyncio.create_task(deliver(bot, message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=QUEUE_TIMEOUT + 5.0)
    finally:
        with contextlib.suppress(Exception):
            await bot.aclose()  # a serve() finishes the entries in hand and returns
            if serving is not None:
                await serving
            await state.aclose()
            await store.aclose()
