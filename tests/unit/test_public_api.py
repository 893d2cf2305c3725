"""The top-level namespace: every SPEC name importable, ``__all__`` complete and honest."""

from __future__ import annotations

import inspect
import pickle

import pytest

import asynclock
from asynclock import (
    AsynclockError,
    LockAcquisitionError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    StateError,
    StateUnavailableError,
)

#: SPEC sections 1-3 (later sections add their names as they land).
SPEC_NAMES = (
    "AsyncLock",
    "Deduper",
    "MemoryState",
    "RedisState",
    "state_from_url",
    "AsynclockError",
    "LockError",
    "LockAcquisitionError",
    "LockNotOwnedError",
    "LockLostError",
    "StateError",
    "StateUnavailableError",
    "Semaphore",  # SPEC 11
)


class TestAll:
    def test_all_is_a_tuple_without_duplicates(self) -> None:
        assert isinstance(asynclock.__all__, tuple)
        assert len(set(asynclock.__all__)) == len(asynclock.__all__)

    @pytest.mark.parametrize("name", SPEC_NAMES)
    def test_spec_name_is_exported(self, name: str) -> None:
        assert name in asynclock.__all__
        assert getattr(asynclock, name) is not None

    @pytest.mark.parametrize("name", asynclock.__all__)
    def test_every_name_in_all_exists(self, name: str) -> None:
        assert hasattr(asynclock, name), name

    @pytest.mark.parametrize("name", asynclock.__all__)
    def test_public_classes_live_in_asynclock(self, name: str) -> None:
        obj = getattr(asynclock, name)
        if inspect.isclass(obj):
            assert obj.__module__ == "asynclock", (name, obj.__module__)

    def test_public_names_are_not_private(self) -> None:
        assert not [name for name in asynclock.__all__ if name.startswith("_")]


class TestErrorTree:
    @pytest.mark.parametrize(
        ("error", "parents"),
        [
            (LockError, (AsynclockError,)),
            (LockAcquisitionError, (LockError, AsynclockError)),
            (LockNotOwnedError, (LockError, AsynclockError)),
            (LockLostError, (LockError, AsynclockError)),
            (StateError, (AsynclockError,)),
            (StateUnavailableError, (StateError, AsynclockError, ConnectionError)),
        ],
    )
    def test_hierarchy(self, error: type[Exception], parents: tuple[type[Exception], ...]) -> None:
        for parent in parents:
            assert issubclass(error, parent)

    def test_lock_errors_are_not_state_errors(self) -> None:
        assert not issubclass(LockError, StateError)
        assert not issubclass(StateError, LockError)

    def test_acquisition_error_attributes_and_message(self) -> None:
        error = LockAcquisitionError("k", 30.0, 1.5)
        assert (error.key, error.ttl, error.retry_after) == ("k", 30.0, 1.5)
        assert "'k'" in str(error)
        assert "1.500" in str(error)
        assert "unknown" in str(LockAcquisitionError("k", 30.0, None))

    @pytest.mark.parametrize(
        "error",
        [
            LockAcquisitionError("k", 30.0, 1.5),
            LockAcquisitionError("k", 30.0, None, "custom"),
            LockNotOwnedError("k", "host:1:2:abc"),
            LockLostError("k", "host:1:2:abc"),
        ],
        ids=lambda e: type(e).__name__,
    )
    def test_errors_survive_pickling(self, error: LockError) -> None:
        # Errors cross process boundaries (multiprocessing, task queues) intact.
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        assert vars(copy) == vars(error)
