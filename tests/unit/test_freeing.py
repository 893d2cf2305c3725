"""``FreeingEstimate``: when a busy key frees, as the ``retry_after`` answers promise it (#14)."""

from __future__ import annotations

import itertools

from asynclock._dispatch import freeing as _freeing
from asynclock._dispatch.freeing import UNSEEN, FreeingEstimate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def estimate_at(clock: Clock) -> FreeingEstimate:
    estimate = FreeingEstimate()
    estimate._clock = clock
    return estimate


def test_a_burst_gets_a_slot_each_one_handling_apart() -> None:
    estimate = estimate_at(Clock())
    estimate.observe("k", 3.0)
    waits = [estimate.retry_after("k", cap=60.0) for _ in range(5)]
    for n, wait in enumerate(waits, start=1):
        assert 3.0 * n <= wait <= 3.0 * n + 1.5, waits
    assert all(b > a for a, b in itertools.pairwise(waits))


def test_slots_are_at_least_a_second_apart_for_fast_handlers() -> None:
    estimate = estimate_at(Clock())
    estimate.observe("k", 0.01)
    waits = [estimate.retry_after("k", cap=60.0) for _ in range(3)]
    assert [int(w) for w in waits] == [1, 2, 3]  # jitter stays under half a slot


def test_an_unseen_key_uses_what_other_keys_took_then_the_default() -> None:
    estimate = FreeingEstimate()
    assert estimate.handling("k") == UNSEEN
    estimate.observe("other", 4.0)
    assert estimate.handling("k") == 4.0


def test_the_average_moves_towards_new_handlings() -> None:
    estimate = FreeingEstimate()
    estimate.observe("k", 1.0)
    estimate.observe("k", 11.0)
    assert 1.0 < estimate.handling("k") < 11.0


def test_capped_by_the_ttl_and_retries_past_the_last_slot_spread_over_it() -> None:
    clock = Clock()
    estimate = estimate_at(clock)
    estimate.observe("k", 4.0)
    waits = [estimate.retry_after("k", cap=10.0) for _ in range(40)]
    assert all(w <= 10.0 for w in waits), waits
    assert 4.0 <= waits[0] <= 6.0
    assert 8.0 <= waits[1] <= 10.0
    beyond = waits[2:]  # the third slot (12 s) is past the cap: anywhere in [4, 10]
    assert all(4.0 <= w <= 10.0 for w in beyond), beyond
    assert len({round(w, 3) for w in beyond}) > 30  # spread, not all on the cap
    clock.now += 20.0  # the promises are over: a new burst starts at one handling again
    assert 4.0 <= estimate.retry_after("k", cap=10.0) <= 6.0


def test_promises_in_the_past_are_not_queued_behind() -> None:
    clock = Clock()
    estimate = estimate_at(clock)
    estimate.observe("k", 2.0)
    estimate.retry_after("k", cap=30.0)
    clock.now += 60.0
    assert 2.0 <= estimate.retry_after("k", cap=30.0) <= 3.0


def test_memory_is_bounded() -> None:
    estimate = FreeingEstimate()
    for n in range(_freeing.MAX_KEYS + 10):
        estimate.observe(f"k{n}", 1.0)
        estimate.retry_after(f"k{n}", cap=30.0)
    assert len(estimate._handling) == _freeing.MAX_KEYS
    assert len(estimate._slots) == _freeing.MAX_KEYS
    assert "k0" not in estimate._handling  # the least recently used went first


def test_no_retry_is_promised_before_a_stalled_holders_lock_lapses() -> None:
    clock = Clock()
    estimate = estimate_at(clock)
    estimate.observe("k", 0.5)
    estimate.stalled("k", 7.0)  # a dead worker's lock: 7 s left, nobody renews it
    waits = [estimate.retry_after("k", cap=30.0) for _ in range(3)]
    assert 7.0 <= waits[0] <= 7.5, waits
    assert 8.0 <= waits[1] <= 8.5, waits  # then one slot after the other
    assert 9.0 <= waits[2] <= 9.5, waits
    clock.now += 60.0  # lapsed long ago: forgotten
    assert 1.0 <= estimate.retry_after("k", cap=30.0) <= 1.5
    assert "k" not in estimate._lapses


def test_retries_past_the_cap_never_come_before_a_stalled_holders_lapse() -> None:
    estimate = estimate_at(Clock())
    estimate.stalled("k", 8.0)
    waits = [estimate.retry_after("k", cap=10.0) for _ in range(20)]
    assert all(8.0 <= w <= 10.0 for w in waits), waits
