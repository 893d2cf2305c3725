"""Fixtures: the backend matrix, one fresh namespace per test, and states built from URLs.

* ``state``: every backend of ``_matrix.STATES``, built with ``state_from_url``, in a namespace no
  other test uses (a uuid key prefix on servers, a fresh object for memory); closed afterwards and
  its keys deleted.
* ``peer_state``: a second client of the same namespace (another connection, as another process
  would have); for memory, the same object, since a ``MemoryState`` is its own namespace.
* ``key``: a unique lock key.
* ``server_target`` / ``server_state``: the same for the backends several OS processes can share.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from asynclock import state_from_url
from tests._matrix import SERVER_STATES, STATES, Backend, purge_namespace, require

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Generator

    from asynclock import State


@dataclass(frozen=True)
class Target:
    """Where a test's state lives: enough to build more clients of it, also in other processes."""

    backend: Backend
    namespace: str

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def options(self) -> dict[str, object]:
        return self.backend.options(self.namespace)

    def open(self) -> State:
        """A new client of this namespace (the caller closes it)."""
        return state_from_url(self.url, **self.options)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the ``slow`` tests of the matrix rows that opt out of them (``Backend.slow``)."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        rows = [v for v in callspec.params.values() if isinstance(v, Backend)] if callspec else []
        opted_out = any(not row.slow for row in rows)
        (dropped if opted_out and item.get_closest_marker("slow") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def new_namespace() -> str:
    return uuid.uuid4().hex


@pytest.fixture(params=STATES)
def backend(request: pytest.FixtureRequest) -> Backend:
    chosen: Backend = request.param
    require(chosen)
    return chosen


@pytest.fixture(params=SERVER_STATES)
def server_backend(request: pytest.FixtureRequest) -> Backend:
    chosen: Backend = request.param
    require(chosen)
    return chosen


@pytest.fixture
async def target(backend: Backend) -> AsyncIterator[Target]:
    made = Target(backend, new_namespace())
    yield made
    await purge_namespace(backend, made.namespace)


@pytest.fixture
async def server_target(server_backend: Backend) -> AsyncIterator[Target]:
    made = Target(server_backend, new_namespace())
    yield made
    await purge_namespace(server_backend, made.namespace)


@pytest.fixture
async def state(target: Target) -> AsyncIterator[State]:
    opened = target.open()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def peer_state(target: Target, state: State) -> AsyncIterator[State]:
    if not target.backend.server:
        yield state
        return
    opened = target.open()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def server_state(server_target: Target) -> AsyncIterator[State]:
    opened = server_target.open()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
def key() -> str:
    return f"key-{uuid.uuid4().hex[:12]}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Captured output with lone surrogates, made transportable.

    Hypothesis feeds the bad-input tests keys with lone surrogates, which the dispatcher logs
    (and then refuses); pytest-xdist sends each report's captured sections to the controller as
    UTF-8, which cannot carry them. The text keeps them visible as ``\\udXXX`` escapes.
    """
    report = yield
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]
    return report
