"""Bounded waits and the record of the public calls made during a fault.

The figures the fault tests print are :func:`tests.support.reporting.report`'s.
"""

from __future__ import annotations

import asyncio
import io
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from asynclock import LockNotOwnedError, StateUnavailableError
from asynclock._compat import deadline_after

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

T = TypeVar("T")


async def bounded(awaitable: Awaitable[T], what: str, seconds: float) -> T:
    """Await ``awaitable`` for at most ``seconds``; a longer wait is a hang: fail the test.

    It runs in the calling task (not in a task of its own, as ``wait_for`` would on 3.10-3.11):
    a lock acquired inside belongs to the caller.
    """
    # where every task waits just before the deadline: once it passes, what hung is cancelled
    stacks: list[str] = []
    snapshot = asyncio.get_running_loop().call_later(
        max(seconds - 0.05, 0.0), lambda: stacks.extend(_task_stacks())
    )
    try:
        async with deadline_after(seconds):
            return await awaitable
    except (TimeoutError, asyncio.TimeoutError):
        raise AssertionError(
            f"{what} did not finish within {seconds} s (a hang); the tasks just before:\n"
            + "\n".join(stacks)
        ) from None
    finally:
        snapshot.cancel()


def _task_stacks() -> list[str]:
    """The stack of every pending task of the running loop, printed."""
    printed = []
    for task in asyncio.all_tasks():
        text = io.StringIO()
        task.print_stack(limit=12, file=text)
        printed.append(text.getvalue())
    return printed


async def until(
    predicate: Callable[[], Awaitable[bool]], what: str, *, within: float, interval: float = 0.01
) -> float:
    """Wait for ``predicate`` (checked every ``interval``); the seconds it took, or fail."""
    start = time.monotonic()
    while not await predicate():
        if time.monotonic() - start > within:
            raise AssertionError(f"still waiting for {what} after {within} s")
        await asyncio.sleep(interval)
    return time.monotonic() - start


@dataclass
class Call:
    """One public call made during a fault: when it ran and how it failed (``None``: it worked)."""

    name: str
    start: float
    end: float
    error: BaseException | None


async def timed(calls: list[Call], name: str, make: Callable[[], Awaitable[object]]) -> object:
    """Run one public call, recording how long it took and how it failed (never raises)."""
    start = time.monotonic()
    try:
        result = await make()
    except Exception as exc:  # noqa: BLE001 - recorded; the test asserts on the kinds
        calls.append(Call(name, start, time.monotonic(), exc))
        return None
    calls.append(Call(name, start, time.monotonic(), None))
    return result


def unexpected_failures(failed: list[Call]) -> list[Call]:
    """The calls that failed otherwise than an outage allows: anything but
    StateUnavailableError, except a release that found its lock gone (LockNotOwnedError)."""
    return [
        c
        for c in failed
        if not isinstance(c.error, StateUnavailableError)
        and not (c.name == "release" and isinstance(c.error, LockNotOwnedError))
    ]
