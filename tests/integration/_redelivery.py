"""A platform's retries of one event whose delivery failed, as Slack and Telegram make them.

Both redeliver an event that got no 2xx: Slack up to 3 times (``X-Slack-Retry-Num`` 1-3; here
after the ``Retry-After`` the answer asked for, else a second: its real schedule, at once, then
after 1 and 5 minutes, is compressed), Telegram on a schedule of its own that ignores
``Retry-After`` (here every second, up to ten times). :func:`redeliver` makes those tries and
returns what each was answered; the pauses are the platform's schedule, not waits for a race.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

#: redeliveries Slack makes of an event after the first delivery failed
SLACK_RETRIES = 3
#: redeliveries the Telegram stand-in makes (Telegram's own number is unspecified)
TELEGRAM_RETRIES = 10


async def redeliver(
    send: Callable[[int], Awaitable[httpx.Response]],
    *,
    retries: int,
    honour_retry_after: bool,
    pause: float = 1.0,
) -> list[str]:
    """Call ``send(n)`` for retry ``n`` = 1, 2, ... until a 2xx or ``retries`` tries.

    Returns each try's answer: the status code, or ``"connection lost"``.
    """
    answers: list[str] = []
    for n in range(1, retries + 1):
        wait = pause
        try:
            answer = await send(n)
        except httpx.TransportError:  # the process it reached died mid-request
            answers.append("connection lost")
        else:
            answers.append(str(answer.status_code))
            if answer.is_success:
                return answers
            asked = answer.headers.get("Retry-After")
            if honour_retry_after and asked is not None:
                wait = float(asked)
        if n < retries:
            await asyncio.sleep(wait)
    return answers
