"""The dashboard's screenshots in docs/img/, taken with the tests' headless Chromium.

``python -m tests.web.screenshots`` (about a minute): a ``MemoryState`` with a webhook bot's
traffic (bursts of events over a few hundred chats, one worker that drains them slowly and
fails on a few), the dashboard served by uvicorn, a page that stays open while the bursts come
and go (so the chart has a history), then:

* ``docs/img/dashboard.png``: the top of the page (header, totals, chart, keys with work);
* ``docs/img/dashboard-actions.png``: the dead letters and locks with ``allow_actions=True``,
  the confirmation of a requeue open.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from playwright.async_api import async_playwright

from asynclock import AsyncLock, Event, EventDispatcher, HandlerContext, MemoryState
from asynclock.web import dashboard
from tests.web._helpers import CHROMIUM, CHROMIUM_ARGS, served

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "img"
#: seconds the page stays open while the traffic runs (the chart's span)
RUN = 45.0

ERRORS = {
    "C07PAYMENTS": "httpx.ReadTimeout: the CRM did not answer within 10.0 s (POST /contacts)",
    "C02SUPPORT": "KeyError: 'contact_id'\n  File \"bot/handlers.py\", line 88, in on_message\n"
    "    contact = payload['contact_id']",
}


def _event(channel: str, thread: str, n: int) -> Event:
    return Event("message", "slack", channel, thread, f"{thread}-{n}", {"text": f"message {n}"})


async def _traffic(bot: EventDispatcher, stop: asyncio.Event) -> None:
    """Bursts of events over 80 chats: a rise while they come faster than the worker handles
    them, then a drain."""
    rng = random.Random(28)
    channels = ["C01GENERAL", "C02SUPPORT", "C03SALES", "C07PAYMENTS"]
    n = 0
    started = asyncio.get_running_loop().time()
    while not stop.is_set():
        elapsed = asyncio.get_running_loop().time() - started
        burst = 30 if elapsed < RUN * 0.55 else 4
        for _ in range(burst):
            channel = rng.choice(channels)
            await bot.accept(_event(channel, f"{rng.randrange(80):04d}", n))
            n += 1
        await asyncio.sleep(0.5)


async def _page(url: str, path: Path, *, confirm: bool = False) -> None:
    async with async_playwright() as driver:
        browser = await driver.chromium.launch(
            executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True
        )
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        await page.goto(url + "/")
        if confirm:
            await page.locator("#dead").scroll_into_view_if_needed()
            await page.locator('#dead button[data-action="requeue"]').first.click()
            await page.locator("#confirm").wait_for()
            await page.screenshot(path=str(path))
        else:
            await asyncio.sleep(RUN)  # the page polls: the chart fills as it would for a reader
            await page.screenshot(path=str(path))
        await browser.close()


async def main() -> None:
    state = MemoryState()
    bot = EventDispatcher(state, on_lock_conflict="queue", max_attempts=2)

    @bot.on("*")
    async def handle(event: Event, ctx: HandlerContext) -> None:
        await asyncio.sleep(3.0)  # a slow downstream API
        if event.thread_id.endswith("7") and event.channel_id in ERRORS:
            raise RuntimeError(ERRORS[event.channel_id])

    stop = asyncio.Event()
    serving = asyncio.create_task(bot.serve())
    traffic = asyncio.create_task(_traffic(bot, stop))
    stuck = AsyncLock(state, "billing:invoice:2024-0117", ttl=300.0)
    await stuck.acquire()
    try:
        app = dashboard(state, refresh=1.0, history=RUN + 5)
        async with served(app) as url:
            await _page(url, IMAGES / "dashboard.png")
        stop.set()
        await traffic
        acting = dashboard(state, allow_actions=True)
        async with served(acting) as url:
            await _page(url, IMAGES / "dashboard-actions.png", confirm=True)
    finally:
        stop.set()
        await bot.aclose()
        await serving
        await stuck.release()
    print(f"wrote {IMAGES / 'dashboard.png'} and {IMAGES / 'dashboard-actions.png'}")


if __name__ == "__main__":
    asyncio.run(main())
