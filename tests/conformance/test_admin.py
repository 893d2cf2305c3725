"""Operators' tools: listing held locks and force-releasing one (``asynclock locks/unlock``)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock, LockNotOwnedError
from asynclock.cli._admin import format_locks, held_locks, unlock
from asynclock.cli._main import main
from asynclock.state._protocol import LockAdmin

if TYPE_CHECKING:
    from asynclock import State
    from tests.conftest import Target


def admin_or_skip(state: State) -> LockAdmin:
    assert isinstance(state, LockAdmin), f"{type(state).__name__} has no operator tools"
    return state


async def test_held_locks_lists_holders_with_time_left_and_token(state: State) -> None:
    admin_or_skip(state)
    first = AsyncLock(state, "ig:contact:1", ttl=20.0)
    second = AsyncLock(state, "ig:contact:2", ttl=20.0)
    other = AsyncLock(state, "billing:7", ttl=20.0)
    for lock in (first, second, other):
        assert await lock.acquire()
    free = AsyncLock(state, "ig:contact:3", ttl=20.0)
    async with free:
        pass  # released: must not be listed
    listed = await held_locks(state, "ig:contact:*")
    assert [info.key for info in listed] == ["ig:contact:1", "ig:contact:2"]
    assert [info.token for info in listed] == [first.token, second.token]
    assert [info.owner for info in listed] == [first.owner, second.owner]
    assert all(15.0 < info.remaining <= 20.0 for info in listed)
    assert [info.key for info in await held_locks(state)] == [
        "billing:7",
        "ig:contact:1",
        "ig:contact:2",
    ]
    for lock in (first, second, other):
        await lock.release()


async def test_force_release_frees_the_key_and_the_holder_learns(state: State) -> None:
    admin_or_skip(state)
    holder = AsyncLock(state, "stuck", ttl=30.0)
    assert await holder.acquire()
    released = await unlock(state, "stuck")
    assert released is not None
    assert released.owner == holder.owner
    assert released.token == holder.token
    assert not await holder.locked()
    # A blocking newcomer of this process would queue behind the holder, whose body still
    # runs; a non-blocking one asks the server, which has the key free.
    newcomer = AsyncLock(state, "stuck", ttl=5.0)
    assert await newcomer.acquire(blocking=False)
    assert newcomer.token is not None
    assert holder.token is not None
    assert newcomer.token > holder.token  # the fence still moves forward
    await newcomer.release()
    with pytest.raises(LockNotOwnedError):
        await holder.release()
    assert await unlock(state, "stuck") is None


async def test_format_locks_table_and_json(state: State) -> None:
    admin_or_skip(state)
    lock = AsyncLock(state, "fmt", ttl=10.0)
    async with lock:
        listed = await held_locks(state)
        table = format_locks(listed)
        assert "fmt" in table
        assert str(lock.token) in table
        rows = json.loads(format_locks(listed, as_json=True))
        assert rows[0]["key"] == "fmt"
        assert rows[0]["token"] == lock.token
        assert rows[0]["owner"] == lock.owner
    assert format_locks([]) == "no locks held\n"


async def test_command_line_lists_and_unlocks(
    server_target: Target, server_state: State, capsys: pytest.CaptureFixture[str]
) -> None:
    admin_or_skip(server_state)
    prefix = server_target.options["prefix"]
    assert isinstance(prefix, str)
    lock = AsyncLock(server_state, "cli:1", ttl=30.0)
    assert await lock.acquire()
    base = ["--state", server_target.url, "--prefix", prefix]

    def run(*argv: str) -> tuple[int, str]:
        code = main(list(argv))
        return code, capsys.readouterr().out

    code, out = await asyncio.to_thread(run, "locks", *base, "--json")
    assert code == 0
    assert [row["key"] for row in json.loads(out)] == ["cli:1"]
    code, out = await asyncio.to_thread(run, "unlock", *base, "cli:1", "--yes")
    assert code == 0
    assert "released 'cli:1'" in out
    assert not await lock.locked()
    code, out = await asyncio.to_thread(run, "locks", *base)
    assert out == "no locks held\n"
