"""The dispatcher that ``test_inbox_processes.py`` runs with ``asynclock worker``, as a user would.

Configured by environment variables (the test sets them): ``INBOX_TEST_URL`` and
``INBOX_TEST_PREFIX`` (the state), ``INBOX_TEST_EFFECTS`` (a Redis URL for the effect store, a
second client, never faulted). Every handling writes one *effect* through a Lua script that
fences by the lock's token: per key it rejects a token lower than the last one it accepted, and
counts such stale writes. The hash ``<prefix>inside`` counts each worker's running handlers (by pid),
so the test can kill a worker in the middle of one. ``INBOX_TEST_POLICY`` (default ``queue``)
sets ``on_lock_conflict``: under ``latest`` a call writes one effect per event it covers (its
``ctx.skipped``, then the event), and ``INBOX_TEST_PAUSE`` (seconds) makes each call that long.
``INBOX_TEST_GATE`` names a key of the effect store: while it reads ``closed``, every call waits
(inside, counted in ``<prefix>inside``) before it writes its effect, so a test can keep workers
busy until each of them has taken an event.
"""

from __future__ import annotations

import asyncio
import os
import random

from redis.asyncio import Redis

from asynclock import Event, EventDispatcher, HandlerContext, state_from_url

#: KEYS[1] the key's effect list, KEYS[2] its last token, KEYS[3] the stale-write counter
#: ARGV[1] the token, ARGV[2] the effect | returns 1 when written, 0 when rejected as stale
FENCED_WRITE = """
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < last then
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[1], ARGV[2])
return 1
"""


#: tasks started by make_bot (kept referenced until the worker exits)
_tasks: set[asyncio.Task[int]] = set()


def make_bot() -> EventDispatcher:
    """The worker's dispatcher (``asynclock worker tests._inbox_app:make_bot``)."""
    prefix = os.environ["INBOX_TEST_PREFIX"]
    state = state_from_url(os.environ["INBOX_TEST_URL"], prefix=prefix)
    effects = Redis.from_url(os.environ["INBOX_TEST_EFFECTS"])
    write = effects.register_script(FENCED_WRITE)
    bot = EventDispatcher(
        state,
        on_lock_conflict=os.environ.get("INBOX_TEST_POLICY", "queue"),  # type: ignore[arg-type]
        lock_ttl=float(os.environ.get("INBOX_TEST_TTL", "1.0")),
    )
    pause = os.environ.get("INBOX_TEST_PAUSE")
    gate = os.environ.get("INBOX_TEST_GATE")
    inside, pid = f"{prefix}inside", os.getpid()
    # the worker handles SIGTERM from here on (``asynclock worker`` listens before it loads us)
    _tasks.add(asyncio.get_running_loop().create_task(effects.sadd(f"{prefix}ready", str(pid))))

    @bot.on("*")
    async def handle(event: Event, ctx: HandlerContext) -> None:
        # a count per worker, not set membership: a worker drains several keys at once, and one
        # handler's end must not hide another that is still running
        await effects.hincrby(inside, str(pid), 1)
        try:
            # the gate is a key another process opens: polled (the test bounds its own wait)
            while gate is not None and await effects.get(gate) == b"closed":  # noqa: ASYNC110
                await asyncio.sleep(0.002)
            await asyncio.sleep(float(pause) if pause else random.uniform(0.005, 0.03))
            keys = [f"{prefix}fx:{ctx.lock_key}", f"{prefix}fx-token:{ctx.lock_key}"]
            for covered in (*ctx.skipped, event):
                effect = f"{covered.message_id} {ctx.attempt} {ctx.token} {os.getpid()}"
                await write(keys=[*keys, f"{prefix}stale"], args=[ctx.token or 0, effect])
        finally:
            await effects.hincrby(inside, str(pid), -1)

    return bot
