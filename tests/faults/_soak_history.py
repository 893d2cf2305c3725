"""The history of a chaos soak (``test_soak.py``) and the checks it must pass: a pure function.

A soak records two things, each with one clock (the TIME of the effect store's Redis server,
which is never faulted):

* **Stamps** written by the handlers into the effect store: ``begin`` when a handler enters its
  critical section, ``apply`` when it writes its effect, ``end`` when it leaves (also when it is
  cancelled). ``begin`` and ``apply`` are *fenced*: the store rejects them when a higher
  fencing token has been seen for the key, and a rejected ``apply`` changes nothing.
* **Deliveries** made by the platform (the test): every send of an event (the original, and the
  duplicates the platform sends on purpose) is redelivered until a worker acknowledges it
  (``handled``, ``queued``, ``duplicate``, ``skipped``) or the redelivery cap is reached (the
  send is *reported failed*). A delivery that was in flight in a worker killed before it
  reported it is marked ``killed``; one whose dispatcher could not keep the event's dedupe
  claim (it logged that a renewal of the claim's lease, or marking it done, failed: the lock
  state was unreachable) carries which (``unkept``).

:func:`check` turns that into figures and violations:

1. **Fencing.** Two holders of one key never both wrote while their critical sections overlapped:
   for two accepted writes, the windows ``[begin, write]`` are disjoint. This is exactly what
   fencing can promise, because ``begin`` is fenced too: once a newer holder has entered, an
   older holder's write is rejected. (Sections that overlapped only after the older one had
   written are counted as overlaps, not violations.) Tokens grow: a holder that entered after
   another one left has the higher token, and every write the store rejected was made by a
   holder that a newer one had overtaken.
2. **Exactly once in effect.** An event applied twice is a violation unless the earlier
   application was made by a worker that was killed before it could report it (the documented
   at-least-once case of ``kill -9`` mid-handler), or a restart of the lock server (which
   forgets every dedupe record: nothing is persisted) came between the two deliveries (see
   :func:`_across_a_restart`), or the lock state was out of reach when one of the two had to
   keep its dedupe claim, so the claim lapsed with its lease (see :func:`_unkept_claim`). Each
   is counted separately. An event applied again because a dispatch reported ``failed`` after
   its handler had written is a violation: the platform can only redeliver what it is told
   failed. So is a dispatch that reported ``handled`` or ``queued`` without an accepted write,
   and one that raised although ``raise_errors=False``.
3. **Nothing vanishes.** Every send ended (acknowledged or reported failed), and an event that
   was never applied must have been reported failed: one whose every send was acknowledged
   (e.g. answered ``duplicate``, or ``accepted`` in the durable mode) without ever being
   applied is *lost*.

In the **durable mode** (``History.durable``: the workers answer each delivery once
``EventDispatcher.accept`` returned and their ``serve()`` handles the inbox) two checks replace
the dispatch mode's excuses for a double application:

4. **Doubles only on a redelivery.** Every accepted application of an event after its first one
   was made by a handler call with ``ctx.attempt > 1`` (the inbox delivered the entry again
   after a crash or a lost lock). A second application by a first delivery means the event was
   stored twice, or delivered twice without counting: a violation, whatever faults came before.
5. **First handlings in accept order, per key** (see :func:`_check_order`). Event A was surely
   stored before event B when a delivery of A was acknowledged (``answered``, store clock)
   before any delivery of B was sent; then A's first ``begin`` must come before B's. Pairs
   whose accepts may have overlapped are not ordered by the history and are not checked.

Per-thread order is not checked in the dispatch mode: the platform delivers out of order on
purpose, and a dispatch is handled on arrival.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

#: dispatch outcomes that acknowledge a delivery (the platform does not redeliver it)
ACKNOWLEDGED = frozenset({"handled", "queued", "duplicate", "skipped", "accepted"})
#: outcomes that say a handler ran to its end under the lock
HANDLED = frozenset({"handled", "queued"})
#: what a worker reports when ``dispatch()`` raised instead of returning an outcome
RAISED = "raised"

StampKind = Literal["begin", "apply", "end"]
SendFate = Literal["acked", "failed", "unsettled"]


@dataclass(frozen=True)
class Stamp:
    """One record of the effect store's log (``at``: store clock, microseconds)."""

    kind: StampKind
    key: str
    token: int
    event: str
    delivery: str
    pid: int
    at: int
    accepted: bool = True
    #: the handler call's ``ctx.attempt`` (1: the first delivery of the event to a handler)
    attempt: int = 1


@dataclass(frozen=True)
class Delivery:
    """One delivery of an event to a worker and what the worker reported (``None``: nothing)."""

    id: str
    event: str
    outcome: str | None
    error: str | None = None
    #: in flight in a worker that was SIGKILLed before it reported it
    killed: bool = False
    #: store time at which the worker took it, before it dispatched it
    received: int | None = None
    #: its dispatcher could not keep the event's claim: ``renew`` (a renewal of its lease
    #: failed) and/or ``mark`` (marking it done failed), as its log says
    unkept: frozenset[str] = frozenset()
    #: store time at which the platform sent it (before any worker could take it)
    sent: int | None = None
    #: store time at which the worker had its answer (durable mode: ``accept`` had returned)
    answered: int | None = None


@dataclass(frozen=True)
class Send:
    """One send of an event by the platform: its deliveries, in order, and how it ended."""

    event: str
    deliveries: tuple[str, ...]
    fate: SendFate


@dataclass(frozen=True)
class History:
    events: frozenset[str]
    sends: tuple[Send, ...]
    deliveries: Mapping[str, Delivery]
    stamps: tuple[Stamp, ...]
    #: the store's own count of accepted applications per event
    applied: Mapping[str, int]
    #: pid -> store time of its SIGKILL
    kills: Mapping[int, int] = field(default_factory=dict)
    #: restarts of the lock server: (store time before it was stopped, time it answered again)
    restarts: tuple[tuple[int, int], ...] = ()
    #: the workers answered after ``accept`` and handled in ``serve()`` (checks 4 and 5)
    durable: bool = False


@dataclass
class Holder:
    """One lock grant (key, token), from its stamps: one handler call in the dispatch mode.

    In the durable mode one grant drains several entries of its key: the holder then spans
    from its first ``begin`` to its last stamp (``write``/``end`` are the last ones), which
    the fencing check treats as one critical section (conservatively: a longer window).
    """

    key: str
    token: int
    pid: int
    event: str
    delivery: str
    begin: int
    begin_accepted: bool
    write: int | None = None
    write_accepted: bool = False
    end: int | None = None

    def until(self, kills: Mapping[int, int]) -> int:
        """When the critical section ended: its end stamp, else its process's kill, else its
        last stamp (a section whose end is unknown is taken as short as its stamps show)."""
        if self.end is not None:
            return self.end
        if self.pid in kills and kills[self.pid] >= self.begin:
            return kills[self.pid]
        return self.write if self.write is not None else self.begin


@dataclass
class Verdict:
    """Figures of a soak and what it violated (empty: the history is sound)."""

    events: int = 0
    handled: int = 0
    #: never applied, and reported failed after the redelivery cap
    reported_failed: int = 0
    lost: int = 0
    unsettled: int = 0
    #: lost events that had a delivery in flight in a killed worker (dedupe claim outlived it)
    lost_after_kill: int = 0
    applied_twice_after_kill: int = 0
    applied_twice_after_restart: int = 0
    applied_twice_after_unkept_claim: int = 0
    #: the first delivery applied, then lost its lock before its handler returned (a stall
    #: past the TTL): it reported failed (``LockLostError``) and the platform sent it again
    applied_twice_after_lock_lost: int = 0
    applied_twice_unexplained: int = 0
    #: durable mode: applied again by a redelivery (``ctx.attempt > 1``)
    applied_twice_redelivered: int = 0
    #: durable mode: pairs of a key's events first handled against their accept order
    out_of_order: int = 0
    #: durable mode: pairs of a key's events whose accept order the history fixes
    ordered_pairs: int = 0
    holders: int = 0
    overlapping_sections: int = 0
    rejected_writes: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def holders_of(stamps: Iterable[Stamp]) -> list[Holder]:
    """Group the stamps by (key, token): one holder per lock grant, in order of entry."""
    found: dict[tuple[str, int], Holder] = {}
    for stamp in sorted(stamps, key=lambda s: s.at):
        ident = (stamp.key, stamp.token)
        holder = found.get(ident)
        if stamp.kind == "begin":
            if holder is None:
                found[ident] = Holder(
                    stamp.key,
                    stamp.token,
                    stamp.pid,
                    stamp.event,
                    stamp.delivery,
                    stamp.at,
                    stamp.accepted,
                )
            continue
        if holder is None:
            raise ValueError(f"{stamp.kind} stamp without a begin: {stamp}")
        if stamp.kind == "apply":
            holder.write, holder.write_accepted = stamp.at, stamp.accepted
        else:
            holder.end = stamp.at
    return sorted(found.values(), key=lambda h: h.begin)


def _overlap(a_start: int, a_end: int, b_start: int, b_end: int) -> bool:
    return a_start < b_end and b_start < a_end


def _check_fencing(history: History, holders: list[Holder], verdict: Verdict) -> None:
    by_key: dict[str, list[Holder]] = defaultdict(list)
    for holder in holders:
        by_key[holder.key].append(holder)
    kills = history.kills
    for key, group in by_key.items():
        for i, a in enumerate(group):
            for b in group[i + 1 :]:  # b entered after a
                if _overlap(a.begin, a.until(kills), b.begin, b.until(kills)):
                    verdict.overlapping_sections += 1
                    if (
                        a.write_accepted
                        and b.write_accepted
                        and a.write is not None
                        and b.write is not None
                        and _overlap(a.begin, a.write, b.begin, b.write)
                    ):
                        verdict.violations.append(
                            f"fencing: {key}: holders {a.token} (pid {a.pid}) and {b.token} "
                            f"(pid {b.pid}) both wrote while their sections overlapped"
                        )
                elif a.token >= b.token:
                    verdict.violations.append(
                        f"tokens: {key}: holder {b.token} entered after holder {a.token} left"
                    )
        for holder in group:
            if not holder.begin_accepted:
                rejected_at = holder.begin
            elif holder.write is not None and not holder.write_accepted:
                rejected_at = holder.write
            else:
                continue
            verdict.rejected_writes += 1
            overtaken = any(
                other.token > holder.token
                and other.begin <= rejected_at
                and _overlap(holder.begin, holder.until(kills), other.begin, other.until(kills))
                for other in group
            )
            if not overtaken:
                verdict.violations.append(
                    f"fencing: {key}: holder {holder.token} (pid {holder.pid}) was rejected "
                    "although no newer holder had overtaken it (a token went backwards)"
                )


def _check_events(history: History, verdict: Verdict) -> None:
    deliveries = history.deliveries
    send_of = {d: n for n, send in enumerate(history.sends) for d in send.deliveries}
    applications: dict[str, list[Stamp]] = defaultdict(list)
    for stamp in history.stamps:
        if stamp.kind == "apply" and stamp.accepted:
            applications[stamp.event].append(stamp)
    sends_of: dict[str, list[Send]] = defaultdict(list)
    for send in history.sends:
        sends_of[send.event].append(send)
    for delivery in deliveries.values():
        if delivery.outcome is not None:
            verdict.outcomes[delivery.outcome] += 1
        if delivery.outcome == RAISED:
            verdict.violations.append(
                f"event {delivery.event}: delivery {delivery.id}: "
                + (
                    f"accept() raised ({delivery.error}), neither StateUnavailableError nor "
                    "InboxFullError"
                    if history.durable
                    else f"dispatch() raised ({delivery.error}) although raise_errors=False: "
                    "no outcome was recorded"
                )
            )
        if delivery.outcome in HANDLED and not any(
            s.delivery == delivery.id for s in applications[delivery.event]
        ):
            verdict.violations.append(
                f"event {delivery.event}: delivery {delivery.id} reported {delivery.outcome} "
                "but its handler applied nothing"
            )
    verdict.events = len(history.events)
    for event in sorted(history.events):
        applied = sorted(applications[event], key=lambda s: s.at)
        if history.applied.get(event, 0) != len(applied):
            verdict.violations.append(
                f"event {event}: the store counts {history.applied.get(event, 0)} applications, "
                f"its log {len(applied)}"
            )
        sends = sends_of[event]
        if not sends:
            verdict.violations.append(f"event {event}: never sent")
        if any(send.fate == "unsettled" for send in sends):
            verdict.unsettled += 1
            verdict.violations.append(
                f"event {event}: vanished: a send has no final fate (no answer, no failure)"
            )
            continue
        own = [deliveries[d] for send in sends for d in send.deliveries]
        if not applied:
            if any(send.fate == "failed" for send in sends):
                verdict.reported_failed += 1
                continue
            verdict.lost += 1
            killed = any(d.killed for d in own)
            verdict.lost_after_kill += killed
            answers = Counter(d.outcome or "killed" for d in own)
            verdict.violations.append(
                f"event {event}: lost: acknowledged but never applied "
                f"({', '.join(f'{n}x {o}' for o, n in sorted(answers.items()))}"
                f"{'; it was in flight in a killed worker' if killed else ''})"
            )
            continue
        verdict.handled += 1
        for first, again in itertools.pairwise(applied):
            if history.durable:
                _durable_double(event, again, verdict)
                continue
            one, other = deliveries.get(first.delivery), deliveries.get(again.delivery)
            if one is not None and one.killed:
                verdict.applied_twice_after_kill += 1
            elif _across_a_restart(history, one, other):
                verdict.applied_twice_after_restart += 1
            elif _unkept_claim(one, other):
                verdict.applied_twice_after_unkept_claim += 1
            elif _lost_its_lock(one):
                verdict.applied_twice_after_lock_lost += 1
            else:
                verdict.applied_twice_unexplained += 1
                verdict.violations.append(
                    f"event {event}: applied twice: by {_answers(history, [first.delivery])}, "
                    f"then by {again.delivery}, of "
                    + (
                        "the same send"
                        if send_of.get(first.delivery) == send_of.get(again.delivery)
                        else f"another send: {_answers(history, _send_of(history, again))}"
                    )
                )


def _durable_double(event: str, again: Stamp, verdict: Verdict) -> None:
    """Check 4: a later application of an accepted event must come from a redelivery."""
    if again.attempt > 1:
        verdict.applied_twice_redelivered += 1
        return
    verdict.applied_twice_unexplained += 1
    verdict.violations.append(
        f"event {event}: applied twice, the second time by a first delivery "
        f"(ctx.attempt == 1, token {again.token}, pid {again.pid}): stored or handed out twice"
    )


def _check_order(history: History, verdict: Verdict) -> None:
    """Check 5: per key, first handlings follow the order the inbox must have stored them in.

    For each event, the history bounds the moment its entry was stored: not before the first
    send of any of its deliveries (``received``, else ``sent``; an event with a delivery of
    unknown start gets no lower bound), and not after the first acknowledged answer to one of
    them (``accepted``, or ``duplicate``: the entry was stored by an earlier accept, with its
    dedupe record, in one atomic step). When A's upper bound is below B's lower bound, A's entry
    precedes B's in the key's inbox, so A's first ``begin`` must precede B's.
    """
    first_begin: dict[str, Stamp] = {}
    for stamp in sorted(history.stamps, key=lambda s: s.at):
        if stamp.kind == "begin":
            first_begin.setdefault(stamp.event, stamp)
    stored_by: dict[str, int] = {}
    not_before: dict[str, int] = {}
    unbounded: set[str] = set()
    for delivery in history.deliveries.values():
        event = delivery.event
        start = delivery.received if delivery.received is not None else delivery.sent
        if start is None:
            unbounded.add(event)
        else:
            not_before[event] = min(not_before.get(event, start), start)
        if delivery.outcome in ACKNOWLEDGED and delivery.answered is not None:
            stored_by[event] = min(stored_by.get(event, delivery.answered), delivery.answered)
    for event in unbounded:
        not_before.pop(event, None)
    by_key: dict[str, list[str]] = defaultdict(list)
    for event, stamp in first_begin.items():
        by_key[stamp.key].append(event)
    for key, events in sorted(by_key.items()):
        for a, b in itertools.permutations(events, 2):
            if a not in stored_by or b not in not_before or stored_by[a] >= not_before[b]:
                continue
            verdict.ordered_pairs += 1
            if first_begin[b].at < first_begin[a].at:
                verdict.out_of_order += 1
                verdict.violations.append(
                    f"order: {key}: {b} was first handled (at {first_begin[b].at}) before {a} "
                    f"(at {first_begin[a].at}), although {a} was accepted (answered at "
                    f"{stored_by[a]}) before {b} was sent (at {not_before[b]})"
                )


def _across_a_restart(history: History, one: Delivery | None, other: Delivery | None) -> bool:
    """Whether a restart of the lock server explains that both deliveries were applied.

    The first one applied was acknowledged as handled (so its dedupe record was meant to stay),
    and one of the two reached its worker before the server answered again after a restart, the
    other one after that. The dedupe claim is a dispatch's first step and cannot be recorded
    while the server is down (the attempt fails at once: the dispatch fails), so the earlier
    one's record was made before the restart, which forgot it, and the later one's after. (The
    moment the server stopped is not observable exactly: a release can still get through between
    the test's decision to restart and the server's shutdown; so the check uses the moment it was
    back.)
    """
    if one is None or other is None or one.outcome not in HANDLED:
        return False
    if one.received is None or other.received is None:
        return False
    early, late = sorted((one.received, other.received))
    return any(early < back < late for _, back in history.restarts)


def _unkept_claim(one: Delivery | None, other: Delivery | None) -> bool:
    """Whether a claim that could not be kept explains that both deliveries were applied.

    A claim is *in progress* for a lease (the lock TTL), renewed while its dispatch runs, and
    marked done once the event is handled. With the lock state out of reach (a stall, a
    partition) neither can be written: the claim lapses with its lease and a later delivery of
    the event claims it anew. That is the dispatcher's documented at-least-once (it logs it at
    WARNING, and the soak's worker reports it with the delivery). It explains the pair when:

    * the first one applied reported ``handled``/``queued`` and could not keep its claim (a
      renewal or the done mark failed), so the second claimed it after it lapsed; or
    * the second one applied could not renew its claim while it waited, and had reached its
      worker before the first one: its claim lapsed, the first claimed the event and handled it,
      then the second got the lock.

    A failed dispatch that had written is not excused here (see :func:`_lost_its_lock`).
    """
    if one is None or other is None or one.outcome not in HANDLED:
        return False
    if one.unkept:
        return True
    return (
        "renew" in other.unkept
        and other.received is not None
        and one.received is not None
        and other.received < one.received
    )


def _lost_its_lock(one: Delivery | None) -> bool:
    """Whether the first delivery applied and was then told its lock was gone.

    Its handler applied while it held the lock (the store's fencing accepted the write: no
    newer token had been seen), then a renewal found the lock expired (a stall past the TTL,
    which the soak injects) and the body was cancelled before it returned. The dispatch reports
    ``failed`` (``LockLostError``), honestly: it cannot tell the handler finished; the platform
    sends the event again and it is applied again: at-least-once, reported, not a silent double.
    """
    return one is not None and one.outcome == "failed" and "LockLostError" in (one.error or "")


def _send_of(history: History, stamp: Stamp) -> tuple[str, ...]:
    return next(s.deliveries for s in history.sends if stamp.delivery in s.deliveries)


def _answers(history: History, deliveries: Iterable[str]) -> str:
    """``d7 (failed: StateUnavailableError ...), d9 (handled)``: what each delivery reported."""
    parts = []
    for name in deliveries:
        delivery = history.deliveries.get(name)
        if delivery is None or delivery.outcome is None:
            answer = "killed" if delivery is not None and delivery.killed else "no answer"
        else:
            answer = delivery.outcome + (f": {delivery.error}" if delivery.error else "")
            if delivery.unkept:
                answer += f"; claim not kept: {', '.join(sorted(delivery.unkept))}"
        parts.append(f"{name} ({answer})")
    return ", ".join(parts)


def check(history: History) -> Verdict:
    """Check ``history`` (see the module docstring); the figures and any violations."""
    verdict = Verdict()
    holders = holders_of(history.stamps)
    verdict.holders = len(holders)
    _check_fencing(history, holders, verdict)
    _check_events(history, verdict)
    if history.durable:
        _check_order(history, verdict)
    return verdict
