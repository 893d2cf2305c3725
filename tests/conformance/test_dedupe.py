"""``Deduper`` on every backend (SPEC section 3)."""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import TYPE_CHECKING, Any

import pytest

from asynclock import AsyncLock, Deduper
from tests._helpers import LoopTicker, eventually

if TYPE_CHECKING:
    from asynclock import State


class TestFirstSeen:
    async def test_first_call_is_true_later_calls_false(self, state: State) -> None:
        dedupe = Deduper(state)
        assert await dedupe.first_seen("evt-1") is True
        assert await dedupe.first_seen("evt-1") is False
        assert await dedupe.first_seen("evt-1") is False

    async def test_exactly_once_under_contention(self, state: State, peer_state: State) -> None:
        dedupers = [Deduper(state), Deduper(peer_state)]
        ids = [f"evt-{n}" for n in range(5)]

        async def seen(i: int, event_id: str) -> bool:
            return await dedupers[i % 2].first_seen(event_id)

        results = await asyncio.gather(*(seen(i, event_id) for event_id in ids for i in range(50)))
        per_id = [results[n * 50 : (n + 1) * 50] for n in range(len(ids))]
        for event_id, answers in zip(ids, per_id, strict=True):
            assert answers.count(True) == 1, (event_id, answers.count(True))

    async def test_ids_are_independent(self, state: State) -> None:
        dedupe = Deduper(state)
        assert await dedupe.first_seen("a")
        assert await dedupe.first_seen("b")
        assert not await dedupe.first_seen("a")

    async def test_namespaces_are_independent(self, state: State) -> None:
        assert await Deduper(state, namespace="one").first_seen("evt")
        assert await Deduper(state, namespace="two").first_seen("evt")
        assert not await Deduper(state, namespace="one").first_seen("evt")

    async def test_dedupe_records_do_not_collide_with_locks(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=10.0):
            assert await Deduper(state).first_seen(key)
        lock = AsyncLock(state, key)
        assert await lock.acquire(blocking=False) is True
        await lock.release()

    async def test_seen_again_after_ttl(self, state: State) -> None:
        dedupe = Deduper(state, ttl=0.3)
        start = time.monotonic()
        assert await dedupe.first_seen("evt")
        assert not await dedupe.first_seen("evt")
        await eventually(lambda: dedupe.first_seen("evt"), within=5.0, interval=0.02)
        # Not before the TTL ran out (small slack for clock granularity).
        assert time.monotonic() - start >= 0.25
        # And recorded again for a new window.
        assert not await dedupe.first_seen("evt")


class TestForget:
    async def test_forget_lets_an_id_be_seen_again(self, state: State) -> None:
        dedupe = Deduper(state)
        assert await dedupe.first_seen("evt")
        await dedupe.forget("evt")
        assert await dedupe.first_seen("evt")
        assert not await dedupe.first_seen("evt")

    async def test_forget_of_an_unknown_id_is_harmless(self, state: State) -> None:
        dedupe = Deduper(state)
        await dedupe.forget("never-seen")
        assert await dedupe.first_seen("never-seen")

    async def test_forget_touches_only_its_id(self, state: State) -> None:
        dedupe = Deduper(state)
        assert await dedupe.first_seen("a")
        assert await dedupe.first_seen("b")
        await dedupe.forget("a")
        assert not await dedupe.first_seen("b")


class TestClaim:
    async def test_claim_is_fresh_once(self, state: State) -> None:
        dedupe = Deduper(state)
        async with dedupe.claim("evt") as fresh:
            assert fresh is True
        async with dedupe.claim("evt") as fresh:
            assert fresh is False
        assert not await dedupe.first_seen("evt")

    async def test_claim_forgets_the_id_when_the_body_raises(self, state: State) -> None:
        dedupe = Deduper(state)

        async def failing_handler() -> None:
            async with dedupe.claim("evt") as fresh:
                assert fresh
                raise KeyError("handler failed")

        with pytest.raises(KeyError):
            await failing_handler()
        # A redelivery is processed.
        async with dedupe.claim("evt") as fresh:
            assert fresh is True

    async def test_claim_keeps_the_id_when_the_body_succeeds(self, state: State) -> None:
        dedupe = Deduper(state)
        async with dedupe.claim("evt") as fresh:
            assert fresh
        assert await dedupe.first_seen("evt") is False

    async def test_failing_duplicate_does_not_forget_the_original_claim(self, state: State) -> None:
        # Only the claim that recorded the id may forget it: a duplicate that fails must not
        # reopen an id whose first delivery is processed (or being processed) elsewhere.
        dedupe = Deduper(state)

        async def failing_duplicate() -> None:
            async with dedupe.claim("evt") as duplicate:
                assert duplicate is False
                raise KeyError("duplicate handler failed")

        async with dedupe.claim("evt") as first:
            assert first
            with pytest.raises(KeyError):
                await failing_duplicate()
        assert await dedupe.first_seen("evt") is False

    async def test_claims_are_exactly_once_under_contention(self, state: State) -> None:
        dedupe = Deduper(state)
        entered_fresh = 0

        async def handle() -> None:
            nonlocal entered_fresh
            async with dedupe.claim("evt") as fresh:
                if fresh:
                    entered_fresh += 1
                await asyncio.sleep(0)

        await asyncio.gather(*(handle() for _ in range(50)))
        assert entered_fresh == 1


class TestDeduperInput:
    @pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf], ids=repr)
    async def test_bad_ttl_raises_value_error_naming_it(self, state: State, ttl: float) -> None:
        with pytest.raises(ValueError, match=re.escape(repr(ttl))):
            Deduper(state, ttl=ttl)

    async def test_empty_id_raises_value_error(self, state: State) -> None:
        dedupe = Deduper(state)
        with pytest.raises(ValueError):
            await dedupe.first_seen("")
        with pytest.raises(ValueError):
            await dedupe.forget("")

    async def test_non_str_id_raises_type_error(self, state: State) -> None:
        dedupe: Any = Deduper(state)
        with pytest.raises(TypeError):
            await dedupe.first_seen(123)


class TestDeduperYields:
    async def test_every_deduper_method_yields(self, state: State) -> None:
        dedupe = Deduper(state)
        async with LoopTicker() as ticker:
            assert await ticker.assert_yields(dedupe.first_seen("evt"), "first_seen (new)")
            assert not await ticker.assert_yields(dedupe.first_seen("evt"), "first_seen (dup)")
            await ticker.assert_yields(dedupe.forget("evt"), "forget")
            claim = dedupe.claim("evt-2")
            assert await ticker.assert_yields(claim.__aenter__(), "claim (enter)")
            # Leaving after an error forgets the id (a server call); a clean exit has nothing to
            # do and need not yield.
            failure = KeyError("handler failed")
            await ticker.assert_yields(
                claim.__aexit__(KeyError, failure, None), "claim (exit after an error)"
            )


class TestTwoPhaseClaim:
    """``claim`` records "in progress" for a renewed lease, then "done" for the full TTL."""

    async def test_a_long_body_keeps_its_claim_past_the_lease(self, state: State) -> None:
        dedupe = Deduper(state, ttl=60.0, namespace="two-phase", lease=0.3)
        async with dedupe.claim("long") as fresh:
            assert fresh
            await asyncio.sleep(0.8)  # well past the lease: renewals keep it claimed
            assert not await dedupe.first_seen("long")

    async def test_done_is_remembered_for_the_full_ttl(self, state: State) -> None:
        dedupe = Deduper(state, ttl=60.0, namespace="two-phase", lease=0.2)
        async with dedupe.claim("done") as fresh:
            assert fresh
        await asyncio.sleep(0.5)  # past the lease: only "done" can still be there
        assert not await dedupe.first_seen("done")

    async def test_an_abandoned_claim_lapses_after_the_lease(self, state: State) -> None:
        # a crashed worker never renews nor completes: its in-progress record lapses
        dedupe = Deduper(state, ttl=60.0, namespace="two-phase", lease=0.2)
        assert await state.dedupe_add("two-phase:crashed", dedupe.lease)
        assert not await dedupe.first_seen("crashed")
        await asyncio.sleep(0.5)
        assert await dedupe.first_seen("crashed")

    async def test_a_failed_body_forgets_at_once(self, state: State) -> None:
        dedupe = Deduper(state, ttl=60.0, namespace="two-phase", lease=5.0)
        with pytest.raises(RuntimeError):
            async with dedupe.claim("failed"):
                raise RuntimeError("handler failed")
        assert await dedupe.first_seen("failed")

    def test_lease_is_capped_by_the_ttl_and_validated(self) -> None:
        from asynclock import MemoryState

        assert Deduper(MemoryState(), ttl=10.0, lease=30.0).lease == 10.0
        with pytest.raises(ValueError, match="lease"):
            Deduper(MemoryState(), lease=0)
