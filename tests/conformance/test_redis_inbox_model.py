"""The Redis inbox against MemoryState, step by step: retries that wait, parking, requeue, discard.

A Hypothesis ``RuleBasedStateMachine`` runs the same random inbox operations on a ``MemoryState``
(the reference: per-entry counts in plain Python) and on Redis (one server, or a cluster), and
compares after every step what the protocol lets a caller see: what each delivery hands out
(payload, attempt), the statuses and counts the calls answer, and ``inbox_keys`` /
``inbox_dead_letters``. A retry waits 600 s here, so it never comes due during a run: what
happens at the due time is ``test_inbox_retry.py``'s (with real time); this machine looks at
what happens around a waiting or parked key (accepts behind it, requeues and discards of it).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from asynclock import MemoryState, state_from_url
from asynclock.state._protocol import InboxState, State
from tests._matrix import REDIS, REDIS_CLUSTER, _param, purge_namespace, require
from tests.conformance.test_stateful import LoopRunner

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from asynclock.state._protocol import InboxEntry, InboxWorker
    from tests._matrix import Backend

pytestmark = pytest.mark.redis

KEY = "slack:C1:model"
MAX_PENDING = 4
#: a retry that never comes due during a run
LONG = 600.0

finishes = st.sampled_from(["ok", "fail", "dead", "park", "retry"])


class Side:
    """One state, its worker (for ``take``), and what the last call answered."""

    def __init__(self, state: Any, worker: InboxWorker, opened: AbstractAsyncContextManager[Any]):
        self.state = state
        self.worker = worker
        self.opened = opened

    async def holder(self) -> str:
        """Become the holder of ``KEY``: the owner a hand-out reserved it for (Redis reserves
        it in the accept or requeue), else a fresh one that takes it now."""
        held = await self.state.inspect(KEY)
        if held is not None:
            return str(held.owner)
        grant = await self.worker.take(KEY)
        assert grant is not None, "a key with work, neither waiting nor parked, was not taken"
        return grant.owner

    async def deliver(self, finish: str) -> list[tuple[str, int] | None]:
        """Hand the head out, finish it as ``finish`` says; every entry handed out (or None)."""
        state = self.state
        owner = await self.holder()
        head: InboxEntry | None = await state.inbox_step(KEY, owner)
        assert head is not None
        seen: list[tuple[str, int] | None] = [(head.payload, head.attempt)]
        after: InboxEntry | None
        if finish == "ok":
            after = await state.inbox_step(KEY, owner, done=head.id)
        elif finish == "fail":  # the next step hands the same entry out again
            after = await state.inbox_step(KEY, owner)
        elif finish == "dead":
            after = await state.inbox_step(KEY, owner, done=head.id, dead="boom")
        elif finish == "park":
            after = await state.inbox_step(KEY, owner, done=head.id, dead="boom", park=True)
        else:
            after = await state.inbox_step(KEY, owner, done=head.id, retry_in=LONG)
        seen.append(None if after is None else (after.payload, after.attempt))
        if after is not None:  # the lock kept: give it back, the entry handed out stays
            await state.release(KEY, owner)
        return seen

    async def deliver_batch(self, finish: str, limit: int) -> list[object]:
        """The batch form (``inbox_take``, as ``latest`` / ``debounce`` drain): hand out up to
        ``limit`` of the oldest, finish them all as ``finish`` says; what each take answered."""
        state = self.state
        owner = await self.holder()
        batch = await state.inbox_take(KEY, owner, limit=limit)
        assert batch is not None
        ids = [e.id for e in batch.entries]
        seen: list[object] = [([(e.payload, e.attempt) for e in batch.entries], batch.pending)]
        if finish == "ok":
            after = await state.inbox_take(KEY, owner, done=ids, limit=0)
        elif finish == "fail":  # nothing finished: the next take hands them out again
            after = await state.inbox_take(KEY, owner, limit=0)
        elif finish == "dead":
            after = await state.inbox_take(KEY, owner, done=ids, dead="boom", limit=0)
        elif finish == "park":
            after = await state.inbox_take(KEY, owner, done=ids, dead="boom", park=True, limit=0)
        else:
            after = await state.inbox_take(KEY, owner, done=ids, retry_in=LONG, limit=0)
        seen.append(None if after is None else after.pending)
        if after is not None:
            await state.release(KEY, owner)
        return seen

    async def view(self) -> tuple[object, ...]:
        keys = [
            (k.pending, k.dead, k.parked, k.retry_in is not None)
            for k in await self.state.inbox_keys()
            if k.key == KEY
        ]
        letters = [
            (d.payload, d.attempts, d.error) for d in await self.state.inbox_dead_letters(KEY)
        ]
        return tuple(keys), tuple(letters)


class InboxMachine(RuleBasedStateMachine):
    #: set on the per-backend subclass that the test builds
    backend: ClassVar[Backend]
    #: how the deployment drains: one entry per step (``queue``) or batches (``latest``)
    batches: ClassVar[bool]

    def __init__(self) -> None:
        super().__init__()
        self.namespace = uuid.uuid4().hex
        self.runner = LoopRunner()
        self.sides: list[Side] = self.runner.run(self._open())
        self.n = 0

    async def _open(self) -> list[Side]:
        memory = MemoryState()
        server = state_from_url(self.backend.url, **self.backend.options(self.namespace))
        sides = []
        for state in (memory, server):
            assert isinstance(state, InboxState)
            opened = state.inbox_worker(lock_ttl=60.0, with_entry=False)
            worker = await opened.__aenter__()
            sides.append(Side(state, worker, opened))
        return sides

    async def _close(self) -> None:
        for side in self.sides:
            await side.opened.__aexit__(None, None, None)
            state: State = side.state
            await state.aclose()
        await purge_namespace(self.backend, self.namespace)

    def teardown(self) -> None:
        try:
            self.runner.run(self._close())
        finally:
            self.runner.close()

    def both(self, call: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``call`` on each side; the answers, which must agree."""
        answers = [
            self.runner.run(getattr(side, call)(*args, **kwargs))
            if hasattr(side, call)
            else self.runner.run(getattr(side.state, call)(*args, **kwargs))
            for side in self.sides
        ]
        assert answers[0] == answers[1], f"{call}: memory {answers[0]!r}, redis {answers[1]!r}"
        return answers

    def deliverable(self) -> bool:
        """The reference says: the key has work, and neither waits nor is parked."""
        keys = self.runner.run(self.sides[0].state.inbox_keys())
        return any(k.pending and not k.parked and k.retry_in is None for k in keys)

    @rule()
    def accept(self) -> None:
        self.n += 1
        statuses = [
            self.runner.run(
                side.state.inbox_accept(
                    KEY,
                    f"m{self.n}",
                    claim=None,
                    claim_ttl=60.0,
                    max_pending=MAX_PENDING,
                    lock_ttl=60.0,
                    with_entry=False,
                )
            )
            for side in self.sides
        ]
        assert statuses[0] == statuses[1]

    @precondition(lambda self: not self.batches and self.deliverable())
    @rule(finish=finishes)
    def deliver(self, finish: str) -> None:
        self.both("deliver", finish)

    @precondition(lambda self: self.batches and self.deliverable())
    @rule(finish=finishes, limit=st.integers(1, MAX_PENDING))
    def deliver_batch(self, finish: str, limit: int) -> None:
        self.both("deliver_batch", finish, limit)

    @rule()
    def requeue(self) -> None:
        self.both("inbox_requeue", KEY)

    @rule()
    def discard(self) -> None:
        self.both("inbox_discard", KEY)

    @invariant()
    def the_same_inbox(self) -> None:
        self.both("view")


@pytest.mark.parametrize("batches", [False, True], ids=["steps", "batches"])
@pytest.mark.parametrize("backend", [_param(REDIS), _param(REDIS_CLUSTER)])
def test_the_redis_inbox_agrees_with_memory(backend: Backend, batches: bool) -> None:
    require(backend)
    attributes = {"backend": backend, "batches": batches}
    machine = type(f"InboxMachine_{backend.name}", (InboxMachine,), attributes)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
