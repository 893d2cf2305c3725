"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against the
dashboard served by uvicorn on a loopback port, on the real servers (Redis, PostgreSQL, MariaDB).

What an operator sees and does: events accepted with no worker show up with their counts and
the page follows new ones without a reload; a dead letter's error is visible; requeue from the
page, confirmed in its dialog, makes a running ``serve()`` handle the event; force-unlock asks
first and does nothing when cancelled; without ``allow_actions`` the page offers no action and a
post is refused; a post without the CSRF token is refused. Every page load also checks that no
script error happened and that nothing was requested from another origin.

The module's tests share one browser (its driver and launch take seconds on a loaded machine),
in one event loop for the module; each test opens its own page on its own server and waits on
what the page shows, bounded by a few seconds.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio
from playwright.async_api import async_playwright, expect

from asynclock import AsyncLock, LockNotOwnedError
from asynclock.state._protocol import InboxState
from asynclock.web import dashboard
from tests._helpers import eventually
from tests._matrix import IN_CI, MYSQL, POSTGRES, REDIS, Backend, purge_namespace, require
from tests.conftest import Target, new_namespace
from tests.web._helpers import (
    CHROMIUM,
    CHROMIUM_ARGS,
    Worker,
    accept,
    dead_letter,
    key_of,
    served,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from playwright.async_api import Browser, ConsoleMessage, Locator, Page

    from asynclock.state import State


pytestmark = pytest.mark.asyncio(loop_scope="module")

#: how long an expectation on the page may take: a refresh is 0.3 s here, but a read is reused
#: for 5x its time, and on a shared Redis with a large keyspace (the listings SCAN all of it) a
#: read takes a second or so
SOON_MS = 20_000


@pytest_asyncio.fixture(
    loop_scope="module",
    params=[
        pytest.param(b, id=b.name, marks=getattr(pytest.mark, b.name))
        for b in (REDIS, POSTGRES, MYSQL)
    ],
)
async def space(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    backend: Backend = request.param
    require(backend)
    made = Target(backend, new_namespace())
    yield made
    await purge_namespace(backend, made.namespace)


@pytest_asyncio.fixture(loop_scope="module")
async def states(space: Target) -> AsyncIterator[tuple[State, State]]:
    """Two clients of the test's namespace: the dashboard's, and the workers' (another one)."""
    mine, theirs = space.open(), space.open()
    try:
        yield mine, theirs
    finally:
        await mine.aclose()
        await theirs.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not Path(CHROMIUM).exists():  # noqa: ASYNC240 - one stat, once per module
        message = f"no {CHROMIUM}: apt-get install chromium (.ci/services.sh installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    async with async_playwright() as driver:
        launched = await driver.chromium.launch(
            executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True
        )
        try:
            yield launched
        finally:
            await launched.close()


class Watched:
    """A page whose script errors and requests are recorded."""

    def __init__(self, page: Page, origin: str) -> None:
        self.page = page
        self.origin = origin
        self.errors: list[str] = []
        self.elsewhere: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", self._console)
        page.on(
            "request",
            lambda request: (
                None if request.url.startswith(origin + "/") else self.elsewhere.append(request.url)
            ),
        )

    def _console(self, message: ConsoleMessage) -> None:
        # a refused action is a 403 the test asks for; a CSP violation or a script error is not
        if message.type == "error" and "Failed to load resource" not in message.text:
            self.errors.append(message.text)

    def check(self) -> None:
        assert self.errors == [], self.errors
        assert self.elsewhere == [], self.elsewhere


@contextlib.asynccontextmanager
async def opened(browser: Browser, url: str) -> AsyncIterator[Watched]:
    page = await browser.new_page()
    watched = Watched(page, url)
    try:
        await page.goto(url + "/")
        yield watched
        watched.check()
    finally:
        await page.close()


def pending_cell(page: Page, thread: str) -> Locator:
    return page.locator(f'#keys tr[data-key="{key_of(thread)}"] td.num').first


async def test_pending_events_and_dead_letters_show_and_follow_live(
    states: tuple[State, State], browser: Browser
) -> None:
    state, workers = states
    await dead_letter(workers, "T9", "poison")  # first: its failing worker drains what is there
    await accept(workers, "T1", 3)
    await accept(workers, "T2", 1)
    async with served(dashboard(state, refresh=0.3)) as url, opened(browser, url) as watched:
        page = watched.page
        await expect(pending_cell(page, "T1")).to_have_text("3")
        await expect(pending_cell(page, "T2")).to_have_text("1")
        cards = page.locator("#totals")
        await expect(cards).to_contain_text("keys with work2")
        await expect(cards).to_contain_text("pending events4")
        await expect(page.locator("#dead")).to_contain_text("ValueError: boom poison")
        await expect(page.locator("#dead")).to_contain_text(key_of("T9"))
        # no reload: the page's own refresh shows what was accepted meanwhile
        await accept(workers, "T2", 2, first=1)
        await expect(pending_cell(page, "T2")).to_have_text("3", timeout=SOON_MS)
        # the filter narrows every table and lands in the URL
        await page.fill("#filter", "T2")
        await expect(page.locator("#keys tbody tr")).to_have_count(1, timeout=SOON_MS)
        await expect(page.locator("#dead")).to_contain_text("no key matches the filter")
        assert "q=T2" in page.url


async def test_requeue_from_the_page_is_handled_by_a_running_worker(
    states: tuple[State, State], browser: Browser
) -> None:
    state, workers = states
    async with Worker(workers) as worker:  # a real serve(), failing for now
        await accept(workers, "T1", 1)

        async def dead() -> bool:
            assert isinstance(state, InboxState)
            return any(k.key == key_of("T1") and k.dead for k in await state.inbox_keys())

        await eventually(dead, within=15.0)
        worker.failing = False  # the fix is deployed; the worker keeps serving
        app = dashboard(state, allow_actions=True, refresh=0.3)
        async with served(app) as url, opened(browser, url) as watched:
            page = watched.page
            await expect(page.locator("#dead")).to_contain_text("ValueError: boom T1-m0")
            button = page.locator(f'#dead button[data-action="requeue"][data-key="{key_of("T1")}"]')
            await button.click()
            await expect(page.locator("#confirm")).to_be_visible()
            await expect(page.locator("#confirm-text")).to_contain_text(key_of("T1"))
            await page.click("#confirm-ok")
            await expect(page.locator("#toast")).to_contain_text("requeued 1 dead letter(s)")

            async def handled() -> bool:
                return worker.handled == ["T1-m0"]

            await eventually(handled, within=15.0)
            await expect(page.locator("#dead")).to_contain_text("no dead letters", timeout=SOON_MS)
            await expect(page.locator("#totals")).to_contain_text("dead letters0", timeout=SOON_MS)


async def test_force_unlock_asks_first(states: tuple[State, State], browser: Browser) -> None:
    state, workers = states
    lock = AsyncLock(workers, "stuck:1", ttl=60.0)
    await lock.acquire()
    try:
        app = dashboard(state, allow_actions=True, refresh=0.3)
        async with served(app) as url, opened(browser, url) as watched:
            page = watched.page
            row = page.locator('#locks tr[data-key="stuck:1"]')
            await expect(row).to_contain_text(str(lock.token))
            await row.locator('button[data-action="unlock"]').click()
            await expect(page.locator("#confirm-text")).to_contain_text(lock.owner or "")
            await page.locator("#confirm button[value=cancel]").click()
            await expect(page.locator("#confirm")).to_be_hidden()
            assert await state.inspect("stuck:1") is not None  # cancelled: nothing was sent
            await row.locator('button[data-action="unlock"]').click()
            await page.click("#confirm-ok")
            await expect(page.locator("#toast")).to_contain_text("force-released 'stuck:1'")
            assert await state.inspect("stuck:1") is None
            await expect(page.locator("#locks")).to_contain_text("no locks held", timeout=SOON_MS)
    finally:
        with contextlib.suppress(LockNotOwnedError):
            await lock.release()


_POST = """async ([key, withToken]) => {
    const headers = {"content-type": "application/json"};
    if (withToken) headers["x-csrf-token"] = document.body.dataset.csrf;
    const answer = await fetch("api/requeue", {method: "POST", headers, body: JSON.stringify({key})});
    return [answer.status, (await answer.json()).error || ""];
}"""


async def test_without_allow_actions_or_the_token_the_action_is_refused(
    states: tuple[State, State], browser: Browser
) -> None:
    state, workers = states
    await dead_letter(workers, "T1", "m")
    async with served(dashboard(state, refresh=0.3)) as url, opened(browser, url) as watched:
        page = watched.page
        await expect(page.locator("#dead")).to_contain_text("ValueError: boom m")
        await expect(page.locator("button[data-action]")).to_have_count(0)
        await expect(page.locator("#dead")).to_contain_text("Read-only")
        status, error = await page.evaluate(_POST, [key_of("T1"), True])
        assert status == 403
        assert "read-only" in error
    acting = dashboard(state, allow_actions=True, refresh=0.3)
    async with served(acting) as url, opened(browser, url) as watched:
        status, error = await watched.page.evaluate(_POST, [key_of("T1"), False])
        assert status == 403
        assert "CSRF" in error
    assert isinstance(state, InboxState)
    assert [k.dead for k in await state.inbox_keys() if k.key == key_of("T1")] == [1]
