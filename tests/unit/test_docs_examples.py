"""The documentation's code runs: every ```python block of README.md and docs/*.md marked runnable.

The convention (invisible on GitHub and in the built site, since both hide HTML comments):

* ``<!-- run -->`` on the line right before a block's opening fence: the block is executed.
* ``<!-- run: redis -->``: the same, for a block that needs the Redis server at 127.0.0.1:6379
  (``ASYNCLOCK_REDIS_URL`` overrides it, as for the conformance suite). The page's test gets the
  ``redis`` marker, and is skipped locally (an error in CI) when the server is down.
* ``<!-- no-run: <reason> -->``: deliberately not executed (it needs a real database, a web
  framework's request, a process manager, ...). The reason is for the next reader.

Every ```python block of a page must carry one of the three (an unmarked block fails
``test_every_block_is_marked``), so a new example is either run or consciously excused. The only
pages exempt are listed in ``UNCHECKED`` with the reason.

How a page runs (one test per page):

* Its runnable blocks run **in order, in one namespace**, like the cells of a notebook: a later
  block may use the names an earlier one defined (``state``, ``dedupe``, a handler ...). A page
  therefore defines everything it uses in a visible block; nothing is injected.
* A block may use top-level ``await`` / ``async with`` (as in ``python -m asyncio``). All such
  blocks of a page share one event loop, so a state opened in one block works in the next. A
  block without top-level ``await`` is executed as a plain script and may call ``asyncio.run``.
* After the blocks, every ``async def test_*`` the page defined is awaited (the testing page's
  example tests), with a fresh ``MemoryState`` for a parameter named ``state``.
* On Redis, each page runs in a fresh key prefix: ``state_from_url`` and ``RedisState.from_url``
  are wrapped to add ``prefix="asynclock-docs-<uuid>:"`` unless the block gives one, and every
  key under it is deleted afterwards. Dedupe records of one run therefore never make the next
  run's "first delivery" a duplicate.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import asynclock
import asynclock.state
from tests._matrix import REDIS, TEST_PREFIX, purge_namespace, require

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
#: pages whose blocks need no marker, and why
UNCHECKED = {
    # written with the SQL states (#5): its one block opens PostgreSQL/MySQL at placeholder hosts
    "backends-sql.md",
}

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>run|no-run)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    marker: str | None  # "run", "no-run" or None
    arg: str  # "redis" for run: redis; the reason for no-run

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path) -> Iterator[Block]:
    """Every ```python fenced block of ``page``, with the marker on the line before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        fence, indent = match["fence"], len(match["indent"])
        language = match["info"].strip().split(" ")[0].lstrip("{.").lower()
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence) and lines[end].strip().strip(fence[0]) == ""
        ):
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        if language in ("python", "py"):
            previous = lines[index - 1] if index else ""
            marker = _MARKER.match(previous)
            yield Block(
                page,
                index + 1,
                "\n".join(body) + "\n",
                marker["kind"] if marker else None,
                (marker["arg"] or "") if marker else "",
            )
        index = end + 1


def _all_blocks() -> list[Block]:
    return [block for page in PAGES for block in python_blocks(page)]


def _page_params() -> list[object]:
    params: list[object] = []
    for page in PAGES:
        runnable = [b for b in python_blocks(page) if b.marker == "run"]
        if not runnable:
            continue
        marks = [pytest.mark.redis] if any(b.arg == "redis" for b in runnable) else []
        params.append(pytest.param(page, id=page.name, marks=marks))
    return params


# -- the convention itself ---------------------------------------------------------------------


def test_every_block_is_marked() -> None:
    unmarked = [
        block.where
        for block in _all_blocks()
        if block.marker is None and block.page.name not in UNCHECKED
    ]
    assert not unmarked, (
        "python blocks without <!-- run -->, <!-- run: redis --> or <!-- no-run: reason -->: "
        + ", ".join(unmarked)
    )


def test_markers_are_well_formed() -> None:
    for block in _all_blocks():
        if block.marker == "run":
            assert block.arg in ("", "redis"), f"{block.where}: unknown run option {block.arg!r}"
        elif block.marker == "no-run":
            assert block.arg, f"{block.where}: <!-- no-run: ... --> needs a reason"


def test_most_examples_run() -> None:
    """The pages that teach the API run (nearly) all their examples."""
    for name in ("quickstart.md", "locks.md", "dedupe.md", "retry.md", "testing.md"):
        blocks = [b for b in _all_blocks() if b.page.name == name]
        running = [b for b in blocks if b.marker == "run"]
        assert blocks, name
        assert len(running) >= 0.75 * len(blocks), (name, len(running), len(blocks))


def test_the_block_parser() -> None:
    page = ROOT / "docs" / "quickstart.md"
    blocks = list(python_blocks(page))
    assert blocks
    assert all(not b.code.startswith("```") for b in blocks)
    assert all(b.page == page for b in blocks)


# -- running them ------------------------------------------------------------------------------


class _RedisPrefix:
    """Gives every Redis state a page builds one fresh key prefix, and deletes its keys after."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.namespace = f"docs-{uuid.uuid4().hex}"
        self.prefix = f"{TEST_PREFIX}{self.namespace}:"
        self.used = False
        real_state_from_url = asynclock.state.state_from_url

        def state_from_url(url: str, **options: object) -> asynclock.State:
            if url.partition("://")[0] in ("redis", "rediss", "unix"):
                url = self._url(url)
                options.setdefault("prefix", self.prefix)
                self.used = True
            return real_state_from_url(url, **options)

        monkeypatch.setattr(asynclock, "state_from_url", state_from_url)
        monkeypatch.setattr(asynclock.state, "state_from_url", state_from_url)
        redis_state = asynclock.RedisState
        real_from_url = redis_state.from_url.__func__  # type: ignore[attr-defined]

        def from_url(cls: type[Any], /, url: str, **options: object) -> object:
            options.setdefault("prefix", self.prefix)
            self.used = True
            return real_from_url(cls, self._url(url), **options)

        monkeypatch.setattr(redis_state, "from_url", classmethod(from_url))

    @staticmethod
    def _url(url: str) -> str:
        return url.replace("redis://127.0.0.1:6379/0", REDIS.url)

    async def purge(self) -> None:
        if self.used:
            await purge_namespace(REDIS, self.namespace)


def _run_block(block: Block, namespace: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
    try:
        code = compile(
            block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
        )
    except SyntaxError as exc:  # pragma: no cover - reported as the failure
        pytest.fail(f"{block.where}: does not compile: {exc}", pytrace=False)
    try:
        if code.co_flags & inspect.CO_COROUTINE:
            loop.run_until_complete(eval(code, namespace))  # the docs' own code
        else:
            exec(code, namespace)  # noqa: S102 - the docs' own code
    except Exception as exc:
        raise AssertionError(f"the example at {block.where} failed: {exc!r}") from exc


async def _close_states(namespace: dict[str, Any]) -> None:
    """Close the states a page left open (a page may keep ``state`` for its next blocks)."""
    for value in list(namespace.values()):
        if isinstance(value, asynclock.State) and not isinstance(value, type):
            await value.aclose()


async def _run_page_tests(namespace: dict[str, Any]) -> list[str]:
    ran = []
    for name, function in list(namespace.items()):
        if not (name.startswith("test_") and inspect.iscoroutinefunction(function)):
            continue
        parameters = inspect.signature(function).parameters
        async with asynclock.MemoryState() as state:
            kwargs = {"state": state} if "state" in parameters else {}
            await function(**kwargs)
        ran.append(name)
    return ran


@pytest.mark.parametrize("page", _page_params())
def test_page_examples_run(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [b for b in python_blocks(page) if b.marker == "run"]
    if any(b.arg == "redis" for b in blocks):
        require(REDIS)
    redis = _RedisPrefix(monkeypatch)
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    loop = asyncio.new_event_loop()
    try:
        for block in blocks:
            _run_block(block, namespace, loop)
        loop.run_until_complete(_run_page_tests(namespace))
    finally:
        try:
            loop.run_until_complete(_close_states(namespace))
        finally:
            try:
                loop.run_until_complete(redis.purge())
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
