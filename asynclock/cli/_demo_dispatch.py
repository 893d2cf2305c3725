"""The dispatcher section of ``asynclock demo``: a chat burst through EventDispatcher.

A burst of chat events arrives for a few threads at once, with the platform's redeliveries
mixed in. Each policy is run on the same burst; the table shows what happened to every
delivery and that no two handlers ever overlapped on one thread.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asynclock._dispatch.dispatcher import EventDispatcher
from asynclock._events.event import Event, HandlerContext, Outcome

if TYPE_CHECKING:
    from asynclock._dispatch.policies import PolicyName
    from asynclock.state._protocol import State

__all__ = ("DispatchTally", "format_dispatch", "run_dispatch_demo")

POLICIES: tuple[PolicyName, ...] = ("drop", "queue", "latest", "concurrent")


@dataclass(frozen=True, slots=True)
class DispatchTally:
    """What one policy did with the burst.

    Attributes:
        policy: the ``on_lock_conflict`` policy.
        deliveries: events delivered (redeliveries included).
        distinct: distinct events among them.
        outcomes: outcome -> count, over every delivery.
        handler_calls: how many times the handler ran.
        overlaps: times a handler started while another ran on the same thread.
        unaccounted: distinct events neither handled, folded into a handled call (skipped),
            nor reported dropped: silently lost. Always 0.
    """

    policy: str
    deliveries: int
    distinct: int
    outcomes: dict[str, int]
    handler_calls: int
    overlaps: int
    unaccounted: int


def _burst(tag: str, threads: int, per_thread: int, redeliveries: int, seed: int) -> list[Event]:
    rng = random.Random(seed)
    events = [
        Event("message", "slack", f"C-{tag}", f"T{t}", f"m-{t}-{n}")
        for t in range(threads)
        for n in range(per_thread)
    ]
    burst = events + rng.sample(events, redeliveries)  # the platform delivers some twice
    rng.shuffle(burst)
    return burst


async def _run_policy(
    state: State, policy: PolicyName, burst: list[Event], work: float
) -> DispatchTally:
    bot = EventDispatcher(state, on_lock_conflict=policy, lock_ttl=5.0, raise_errors=False)
    running: dict[str, int] = {}
    overlaps = 0
    covered: set[str | None] = set()
    calls = 0

    @bot.on("message")
    async def handle(event: Event, ctx: HandlerContext) -> None:
        nonlocal overlaps, calls
        calls += 1
        running[event.thread_key] = running.get(event.thread_key, 0) + 1
        if running[event.thread_key] > 1:
            overlaps += 1
        covered.add(event.message_id)
        covered.update(e.message_id for e in ctx.skipped)
        await asyncio.sleep(work)
        running[event.thread_key] -= 1

    outcomes = await asyncio.gather(*(bot.dispatch(e) for e in burst))
    await bot.aclose()
    dropped = {e.message_id for e, o in zip(burst, outcomes, strict=True) if o is Outcome.DROPPED}
    distinct = {e.message_id for e in burst}
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.value] = counts.get(outcome.value, 0) + 1
    return DispatchTally(
        policy=policy,
        deliveries=len(burst),
        distinct=len(distinct),
        outcomes=counts,
        handler_calls=calls,
        overlaps=overlaps,
        unaccounted=len(distinct - covered - dropped),
    )


async def run_dispatch_demo(
    state: State, threads: int = 4, per_thread: int = 6, work: float = 0.005, seed: int = 7
) -> tuple[DispatchTally, ...]:
    """Run the same burst through every policy of :data:`POLICIES` on ``state``."""
    run = secrets.token_hex(3)  # a shared server remembers earlier runs' ids for dedupe_ttl
    quiet = logging.getLogger("asynclock")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # one log line per outcome would bury the table
    try:
        results = []
        for policy in POLICIES:
            # the same burst per policy, in a channel of its own: the state remembers ids
            tag = f"{policy}-{run}"
            burst = _burst(tag, threads, per_thread, max(1, threads * per_thread // 4), seed)
            results.append(await _run_policy(state, policy, burst, work))
        return tuple(results)
    finally:
        quiet.setLevel(level)


def format_dispatch(tallies: tuple[DispatchTally, ...]) -> list[str]:
    """The dispatcher section's lines."""
    columns = (
        "policy",
        "deliveries",
        "handled",
        "duplicate",
        "dropped",
        "queued",
        "skipped",
        "handler calls",
        "overlaps",
        "lost",
    )
    body = [
        (
            t.policy,
            str(t.deliveries),
            str(t.outcomes.get("handled", 0)),
            str(t.outcomes.get("duplicate", 0)),
            str(t.outcomes.get("dropped", 0)),
            str(t.outcomes.get("queued", 0)),
            str(t.outcomes.get("skipped", 0)),
            str(t.handler_calls),
            str(t.overlaps),
            str(t.unaccounted),
        )
        for t in tallies
    ]
    widths = [max(len(row[i]) for row in (columns, *body)) for i in range(len(columns))]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(
            [
                row[0].ljust(widths[0]),
                *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)),
            ]
        ).rstrip()

    first = tallies[0]
    return [
        "",
        (
            f"EventDispatcher: {first.distinct} chat events over a few threads at once, "
            f"{first.deliveries - first.distinct} of them delivered twice"
        ),
        "",
        line(columns),
        "  ".join("-" * w for w in widths),
        *(line(row) for row in body),
        "",
        "overlaps: a handler started while another ran on the same thread (concurrent allows it);",
        "lost: events neither handled, skipped into a handled call, nor reported dropped. Dropped",
        "events had their dedupe record forgotten, so the platform's redelivery is handled.",
    ]
