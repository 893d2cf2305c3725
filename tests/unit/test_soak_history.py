"""The chaos soak's history checker (``tests/faults/_soak_history.py``) on hand-made histories.

A checker that passes everything proves nothing: each broken history here must be flagged
(overlapping holders that both wrote, a token that went backwards, a vanished event, a double
application), and each sound one, including the documented at-least-once cases (a ``kill -9``,
a restart of the lock server, a claim that lapsed while the state was out of reach), must pass.
The durable mode's checks too: an accepted event never handled, a double application by a first
delivery (``ctx.attempt == 1``), and a key's first handlings against accept order are flagged;
a redelivery after a kill and accepts that overlapped in time pass.
"""

from __future__ import annotations

from tests.faults._soak_history import Delivery, History, Send, SendFate, Stamp, check

KEY = "soak:C1:t1"


def section(
    token: int,
    event: str,
    delivery: str,
    begin: int,
    write: int | None,
    end: int | None,
    *,
    pid: int = 100,
    begin_ok: bool = True,
    write_ok: bool = True,
    attempt: int = 1,
) -> list[Stamp]:
    """The stamps of one handler call: begin, apply (unless ``write`` is None), end."""
    stamps = [Stamp("begin", KEY, token, event, delivery, pid, begin, begin_ok, attempt)]
    if write is not None:
        stamps.append(Stamp("apply", KEY, token, event, delivery, pid, write, write_ok, attempt))
    if end is not None:
        stamps.append(Stamp("end", KEY, token, event, delivery, pid, end, attempt=attempt))
    return stamps


def history(
    stamps: list[Stamp],
    answers: dict[str, list[Delivery]],
    *,
    fates: dict[str, SendFate] | None = None,
    kills: dict[int, int] | None = None,
    restarts: tuple[tuple[int, int], ...] = (),
    durable: bool = False,
) -> History:
    """One send per key of ``answers`` (``"event/n"``), delivered as listed."""
    applied: dict[str, int] = {}
    for stamp in stamps:
        if stamp.kind == "apply" and stamp.accepted:
            applied[stamp.event] = applied.get(stamp.event, 0) + 1
    sends = tuple(
        Send(name.split("/")[0], tuple(d.id for d in ds), (fates or {}).get(name, "acked"))
        for name, ds in answers.items()
    )
    return History(
        events=frozenset(send.event for send in sends),
        sends=sends,
        deliveries={d.id: d for ds in answers.values() for d in ds},
        stamps=tuple(stamps),
        applied=applied,
        kills=kills or {},
        restarts=restarts,
        durable=durable,
    )


def test_a_sound_history_passes() -> None:
    stamps = section(10, "e1", "d1", 100, 110, 120) + section(11, "e2", "d2", 130, 140, 150)
    verdict = check(
        history(
            stamps,
            {
                "e1/0": [Delivery("d1", "e1", "handled")],
                "e1/1": [Delivery("d3", "e1", "duplicate")],
                "e2/0": [Delivery("d2", "e2", "queued")],
            },
        )
    )
    assert verdict.ok, verdict.violations
    assert (verdict.events, verdict.handled, verdict.holders) == (2, 2, 2)
    assert verdict.overlapping_sections == verdict.rejected_writes == 0


def test_overlapping_holders_that_both_wrote_are_flagged() -> None:
    # holder 11 entered at 115, before holder 10 wrote at 118: both writes accepted
    stamps = section(10, "e1", "d1", 100, 118, 120) + section(11, "e2", "d2", 115, 125, 130)
    answers = {"e1/0": [Delivery("d1", "e1", "handled")], "e2/0": [Delivery("d2", "e2", "handled")]}
    verdict = check(history(stamps, answers))
    assert verdict.overlapping_sections == 1
    assert any("both wrote" in v for v in verdict.violations), verdict.violations


def test_an_overlap_resolved_by_fencing_passes() -> None:
    # holder 10 lost its lock; holder 11 entered at 115; 10's write at 118 was rejected
    stamps = section(10, "e1", "d1", 100, 118, 120, write_ok=False)
    stamps += section(11, "e2", "d2", 115, 125, 130) + section(12, "e1", "d3", 140, 145, 150)
    answers = {
        "e1/0": [
            Delivery("d1", "e1", "failed", "StaleTokenError"),
            Delivery("d3", "e1", "handled"),
        ],
        "e2/0": [Delivery("d2", "e2", "handled")],
    }
    verdict = check(history(stamps, answers))
    assert verdict.ok, verdict.violations
    assert (verdict.overlapping_sections, verdict.rejected_writes) == (1, 1)


def test_an_overlap_after_the_older_holder_wrote_is_counted_not_flagged() -> None:
    # holder 10 wrote at 105, then holder 11 entered at 115 while 10 was still inside
    stamps = section(10, "e1", "d1", 100, 105, 120) + section(11, "e2", "d2", 115, 125, 130)
    answers = {"e1/0": [Delivery("d1", "e1", "handled")], "e2/0": [Delivery("d2", "e2", "handled")]}
    verdict = check(history(stamps, answers))
    assert verdict.ok, verdict.violations
    assert verdict.overlapping_sections == 1


def test_a_token_that_went_backwards_is_flagged() -> None:
    stamps = section(11, "e1", "d1", 100, 110, 120)
    stamps += section(10, "e2", "d2", 130, 140, 150, begin_ok=False)
    answers = {
        "e1/0": [Delivery("d1", "e1", "handled")],
        "e2/0": [Delivery("d2", "e2", "failed", "StaleTokenError")],
    }
    verdict = check(history(stamps, answers, fates={"e2/0": "failed"}))
    assert any("entered after holder 11 left" in v for v in verdict.violations)
    assert any("no newer holder had overtaken it" in v for v in verdict.violations)


def test_a_vanished_event_is_flagged() -> None:
    # killed mid-handler before it wrote; the redelivery was answered "duplicate": nothing applied
    stamps = section(10, "e1", "d1", 100, None, None, pid=7)
    answers = {"e1/0": [Delivery("d1", "e1", None, killed=True), Delivery("d2", "e1", "duplicate")]}
    verdict = check(history(stamps, answers, kills={7: 105}))
    assert (verdict.lost, verdict.lost_after_kill) == (1, 1)
    assert any("lost" in v and "killed worker" in v for v in verdict.violations)


def test_an_event_without_a_final_fate_is_flagged() -> None:
    answers = {"e1/0": [Delivery("d1", "e1", None)]}
    verdict = check(history([], answers, fates={"e1/0": "unsettled"}))
    assert verdict.unsettled == 1
    assert any("no final fate" in v for v in verdict.violations)


def test_an_event_reported_failed_passes() -> None:
    answers = {
        "e1/0": [Delivery(f"d{n}", "e1", "failed", "StateUnavailableError") for n in range(9)]
    }
    verdict = check(history([], answers, fates={"e1/0": "failed"}))
    assert verdict.ok, verdict.violations
    assert verdict.reported_failed == 1


def test_a_double_application_is_flagged() -> None:
    # the first dispatch wrote, then reported failed (its release failed); the redelivery wrote too
    stamps = section(10, "e1", "d1", 100, 110, 120) + section(11, "e1", "d2", 200, 210, 220)
    answers = {
        "e1/0": [
            Delivery("d1", "e1", "failed", "StateUnavailableError", received=90),
            Delivery("d2", "e1", "handled", received=190),
        ]
    }
    verdict = check(history(stamps, answers))
    assert verdict.applied_twice_unexplained == 1
    assert any("applied twice" in v and "d1 (failed" in v for v in verdict.violations)


def test_a_double_application_after_a_kill_is_counted_apart() -> None:
    # the documented at-least-once case: the worker wrote, then was killed before it answered
    stamps = section(10, "e1", "d1", 100, 110, None, pid=7) + section(11, "e1", "d2", 300, 310, 320)
    answers = {"e1/0": [Delivery("d1", "e1", None, killed=True), Delivery("d2", "e1", "handled")]}
    verdict = check(history(stamps, answers, kills={7: 115}))
    assert verdict.ok, verdict.violations
    assert verdict.applied_twice_after_kill == 1


def test_a_double_application_across_a_restart_is_counted_apart() -> None:
    # the lock server forgot the dedupe record in a restart (150-160); the duplicate ran again
    stamps = section(10, "e1", "d1", 100, 110, 120) + section(11, "e1", "d2", 200, 210, 220)
    answers = {
        "e1/0": [Delivery("d1", "e1", "handled", received=90)],
        "e1/1": [Delivery("d2", "e1", "handled", received=190)],
    }
    verdict = check(history(stamps, answers, restarts=((150, 160),)))
    assert verdict.ok, verdict.violations
    assert verdict.applied_twice_after_restart == 1
    # the same history without the restart is a violation
    assert check(history(stamps, answers)).applied_twice_unexplained == 1


def test_a_failed_dispatch_that_wrote_is_not_excused_by_a_restart() -> None:
    # the first dispatch wrote, then its release hit the restart and it reported failed
    stamps = section(10, "e1", "d1", 100, 110, 120) + section(11, "e1", "d2", 200, 210, 220)
    answers = {
        "e1/0": [
            Delivery("d1", "e1", "failed", "StateUnavailableError", received=90),
            Delivery("d2", "e1", "handled", received=190),
        ]
    }
    verdict = check(history(stamps, answers, restarts=((150, 160),)))
    assert verdict.applied_twice_unexplained == 1


def test_a_double_application_after_an_unmarked_claim_is_counted_apart() -> None:
    # d1 was handled, but the state was out of reach: its claim could not be marked done and
    # lapsed with its lease; the duplicate send's delivery d2 claimed the event anew
    stamps = section(10, "e1", "d1", 100, 110, 120) + section(11, "e1", "d2", 200, 210, 220)
    answers = {
        "e1/0": [Delivery("d1", "e1", "handled", received=90, unkept=frozenset({"mark"}))],
        "e1/1": [Delivery("d2", "e1", "handled", received=190)],
    }
    verdict = check(history(stamps, answers))
    assert verdict.ok, verdict.violations
    assert verdict.applied_twice_after_unkept_claim == 1
    # the same history with the claim kept is a violation
    kept = {
        "e1/0": [Delivery("d1", "e1", "handled", received=90)],
        "e1/1": [Delivery("d2", "e1", "handled", received=190)],
    }
    assert check(history(stamps, kept)).applied_twice_unexplained == 1


def test_a_waiter_whose_claim_lapsed_is_counted_apart() -> None:
    # d1 claimed first and waited for the lock; its lease renewals failed and the claim lapsed,
    # d2 claimed the event, got the lock first and handled it; then d1 got the lock
    stamps = section(10, "e1", "d2", 100, 110, 120) + section(11, "e1", "d1", 200, 210, 220)
    answers = {
        "e1/0": [Delivery("d1", "e1", "queued", received=50, unkept=frozenset({"renew"}))],
        "e1/1": [Delivery("d2", "e1", "handled", received=90)],
    }
    verdict = check(history(stamps, answers))
    assert verdict.ok, verdict.violations
    assert verdict.applied_twice_after_unkept_claim == 1
    # a later delivery's renewal failure does not explain how it claimed a handled event
    late = {
        "e1/0": [Delivery("d1", "e1", "queued", received=95, unkept=frozenset({"renew"}))],
        "e1/1": [Delivery("d2", "e1", "handled", received=90)],
    }
    assert check(history(stamps, late)).applied_twice_unexplained == 1


def test_a_failed_dispatch_that_wrote_is_not_excused_by_an_unkept_claim() -> None:
    stamps = section(10, "e1", "d1", 100, 110, 120) + section(11, "e1", "d2", 200, 210, 220)
    unkept = frozenset({"renew", "mark"})
    answers = {
        "e1/0": [
            Delivery("d1", "e1", "failed", "StateUnavailableError", received=90, unkept=unkept),
            Delivery("d2", "e1", "handled", received=190),
        ]
    }
    verdict = check(history(stamps, answers))
    assert verdict.applied_twice_unexplained == 1
    assert any("claim not kept: mark, renew" in v for v in verdict.violations)


def test_handled_without_an_effect_and_a_miscount_are_flagged() -> None:
    stamps = section(10, "e1", "d1", 100, 110, 120, write_ok=False)
    answers = {"e1/0": [Delivery("d1", "e1", "handled")]}
    broken = history(stamps, answers)
    verdict = check(
        History(broken.events, broken.sends, broken.deliveries, broken.stamps, applied={"e1": 1})
    )
    assert any("applied nothing" in v for v in verdict.violations)
    assert any("the store counts 1 applications, its log 0" in v for v in verdict.violations)


def test_a_dispatch_that_raised_is_flagged() -> None:
    stamps = section(10, "e1", "d2", 100, 110, 120)
    answers = {
        "e1/0": [
            Delivery("d1", "e1", "raised", "StateUnavailableError: ..."),
            Delivery("d2", "e1", "handled"),
        ]
    }
    verdict = check(history(stamps, answers))
    assert any("raise_errors=False" in v for v in verdict.violations), verdict.violations


# -- the durable mode: answered after accept(), handled by serve() ------------------------------


def accepted(delivery: str, event: str, sent: int, answered: int | None) -> Delivery:
    """A delivery whose accept() was answered ``accepted`` (``None``: killed before answering)."""
    if answered is None:
        return Delivery(delivery, event, None, killed=True, sent=sent)
    return Delivery(delivery, event, "accepted", sent=sent, received=sent + 1, answered=answered)


def test_a_sound_durable_history_passes() -> None:
    # e1 accepted, then e2; e1's first handler was killed after it wrote, the inbox delivered e1
    # again (attempt 2) to another worker, then e2; e3's accept overlapped e2's (no order fixed)
    stamps = section(10, "e1", "x", 100, 110, None, pid=7)
    stamps += section(11, "e1", "x", 300, 310, 320, attempt=2)
    stamps += section(12, "e3", "x", 330, 340, 350) + section(13, "e2", "x", 360, 370, 380)
    answers = {
        "e1/0": [accepted("d1", "e1", 10, 20)],
        "e1/1": [Delivery("d4", "e1", "duplicate", sent=30, received=31, answered=35)],
        "e2/0": [accepted("d2", "e2", 40, 50)],
        "e3/0": [accepted("d3", "e3", 45, 55)],
    }
    verdict = check(history(stamps, answers, kills={7: 115}, durable=True))
    assert verdict.ok, verdict.violations
    assert verdict.applied_twice_redelivered == 1
    # e1 before e2 and e3 (both sent after e1 was answered); e2 and e3 overlapped
    assert (verdict.ordered_pairs, verdict.out_of_order) == (2, 0)


def test_an_accepted_event_never_handled_is_lost() -> None:
    stamps = section(10, "e1", "x", 100, 110, 120)
    answers = {"e1/0": [accepted("d1", "e1", 10, 20)], "e2/0": [accepted("d2", "e2", 30, 40)]}
    verdict = check(history(stamps, answers, durable=True))
    assert verdict.lost == 1
    assert any(
        "e2: lost: acknowledged but never applied (1x accepted" in v for v in verdict.violations
    )


def test_a_double_application_by_a_first_delivery_is_flagged() -> None:
    # applied twice, both times with ctx.attempt == 1: the event was stored or handed out twice
    stamps = section(10, "e1", "x", 100, 110, 120) + section(11, "e1", "x", 200, 210, 220)
    answers = {"e1/0": [accepted("d1", "e1", 10, 20)], "e1/1": [accepted("d2", "e1", 30, 40)]}
    verdict = check(history(stamps, answers, durable=True))
    assert verdict.applied_twice_unexplained == 1
    assert any("second time by a first delivery" in v for v in verdict.violations)
    # the dispatch mode's excuses do not apply: a kill before does not explain it
    killed = section(10, "e1", "x", 100, 110, None, pid=7) + section(11, "e1", "x", 200, 210, 220)
    after_kill = history(killed, answers, kills={7: 115}, durable=True)
    assert check(after_kill).applied_twice_unexplained == 1


def test_first_handlings_against_accept_order_are_flagged() -> None:
    # e1 was answered at 20, e2 sent only at 30: e1's entry precedes e2's, yet e2 ran first
    stamps = section(10, "e2", "x", 100, 110, 120) + section(11, "e1", "x", 130, 140, 150)
    answers = {"e1/0": [accepted("d1", "e1", 10, 20)], "e2/0": [accepted("d2", "e2", 30, 40)]}
    verdict = check(history(stamps, answers, durable=True))
    assert verdict.out_of_order == 1
    assert any("order: soak:C1:t1: e2 was first handled" in v for v in verdict.violations)
    # a handling of e1 before e2's (one whose begin the store rejected too) keeps the order
    redelivered = section(9, "e1", "x", 90, None, 95, begin_ok=False) + stamps
    assert check(history(redelivered, answers, durable=True)).out_of_order == 0
    # accepts that overlapped in time (e2 sent at 15, before e1 was answered) fix no order
    overlapping = {
        "e1/0": [accepted("d1", "e1", 10, 20)],
        "e2/0": [accepted("d2", "e2", 15, 40)],
    }
    assert check(history(stamps, overlapping, durable=True)).ok
    # a delivery of e2 of unknown start (it may have stored e2 early) fixes no order either
    unknown = {
        "e1/0": [accepted("d1", "e1", 10, 20)],
        "e2/0": [Delivery("d3", "e2", None, killed=True), accepted("d2", "e2", 30, 40)],
    }
    assert check(history(stamps, unknown, durable=True)).out_of_order == 0
    # the dispatch mode does not check order (the platform delivers out of order)
    assert check(history(stamps, answers)).out_of_order == 0


def test_a_double_application_after_a_lost_lock_is_counted_apart() -> None:
    # d1 applied, then a stall past the TTL took its lock: its body was cancelled before it
    # returned and it reported failed with LockLostError; the platform's resend applied again
    stamps = section(10, "e1", "d1", 100, 110, None) + section(11, "e1", "d2", 200, 210, 220)
    lost = "LockLostError: lock 'soak:C1:t00' held by 'w' was lost while its body ran"
    answers = {
        "e1/0": [
            Delivery("d1", "e1", "failed", lost, received=90),
            Delivery("d2", "e1", "handled", received=190),
        ]
    }
    verdict = check(history(stamps, answers))
    assert verdict.ok, verdict.violations
    assert verdict.applied_twice_after_lock_lost == 1
    # any other failure of a dispatch that wrote stays a violation
    other = {
        "e1/0": [
            Delivery("d1", "e1", "failed", "StateUnavailableError", received=90),
            Delivery("d2", "e1", "handled", received=190),
        ]
    }
    assert check(history(stamps, other)).applied_twice_unexplained == 1
