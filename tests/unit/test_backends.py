"""The backend table (``asynclock/state/_backends.py``) is what every list of backends reads.

A backend added to the table is built by ``state_from_url``, exported lazily by ``asynclock``
and ``asynclock.state``, run by the test matrix, and checked here to implement each capability
its row claims (and to claim each one it implements, so the table never undersells it).
"""

from __future__ import annotations

import asyncio
import importlib

import pytest

import asynclock
import asynclock.state
from asynclock.state import _protocol, state_from_url
from asynclock.state._backends import BACKENDS, CAPABILITIES, Backend
from asynclock.state._url import SCHEMES
from tests._matrix import BACKENDS as MATRIX

#: a URL per scheme that builds a state without connecting (connections open on first use)
URLS = {
    "memory": "memory://",
    "redis": "redis://127.0.0.1:6379/0",
    "rediss": "rediss://127.0.0.1:6379/0",
    "unix": "unix:///tmp/redis.sock",
    "redis+cluster": "redis+cluster://127.0.0.1:7000",
    "redis+sentinel": "redis+sentinel://127.0.0.1:26379/mymaster",
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "postgres": "postgres://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_each_scheme_builds_its_row_s_class(backend: Backend) -> None:
    for scheme in backend.schemes:
        assert SCHEMES[scheme] == (backend.target, backend.extra)
        state = state_from_url(URLS[scheme])
        try:
            assert type(state) is getattr(importlib.import_module(backend.module), backend.name)
        finally:
            asyncio.run(state.aclose())


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_a_row_claims_exactly_the_capabilities_its_class_implements(backend: Backend) -> None:
    assert set(backend.capabilities) <= set(CAPABILITIES), backend.capabilities
    state = state_from_url(URLS[backend.schemes[0]])
    try:
        implemented = {c for c in CAPABILITIES if isinstance(state, getattr(_protocol, c))}
    finally:
        asyncio.run(state.aclose())
    assert implemented == set(backend.capabilities)


def test_every_capability_is_a_runtime_checkable_protocol_exported_by_asynclock_state() -> None:
    for name in CAPABILITIES:
        protocol = getattr(_protocol, name)
        assert getattr(protocol, "_is_runtime_protocol", False), name
        assert name in asynclock.state.__all__
        assert getattr(asynclock.state, name) is protocol


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_every_backend_is_exported_and_loads_lazily(backend: Backend) -> None:
    assert backend.name in asynclock.__all__
    assert backend.name in asynclock.state.__all__
    cls = getattr(asynclock, backend.name)
    assert getattr(asynclock.state, backend.name) is cls
    assert cls.__name__ == backend.name


def test_the_test_matrix_runs_every_backend_of_the_table() -> None:
    run = set()
    for entry in MATRIX:
        state = state_from_url(entry.url)
        run.add(type(state).__name__)
        asyncio.run(state.aclose())
    assert run == {b.name for b in BACKENDS}
