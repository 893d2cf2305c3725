"""The durable inbox of RedisState (:class:`~asynclock.state.InboxState`), as a mixin.

:class:`RedisInbox` holds the inbox operations; :class:`~asynclock.state.redis.RedisState`
inherits them and supplies what they run on (declared at the top of the class: the scripts
through the state's guard, its key layout and its ready index), as ``sql/_inbox.py`` does for the
SQL states. Each operation is one script of this folder (``inbox_*.lua``, ``_inbox_*.lua``
before ``release.lua``), atomic with the key's lock; the set of keys with work is the ready
index's (``_ready.py``; per slot with a directory on a cluster, ``_cluster_inbox.py``).

A retry that waits (``retry_in``) and a parked key (``park``) are the key's *hold*
(``_hold.lua``), written by the step that releases the lock and read by every script that would
hand the key out (accept, take, requeue): still one script per operation, no round trip added.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import TYPE_CHECKING

from asynclock._errors import LockNotOwnedError
from asynclock._owner import new_handout_owner
from asynclock._validate import check_inbox_finish, check_key, check_limit, check_ttl, ttl_ms
from asynclock.state._protocol import (
    DeadLetter,
    InboxAccepted,
    InboxBatch,
    InboxEntry,
    InboxKey,
)
from asynclock.state.redis._handout import LaneWorker
from asynclock.state.redis._host import ScriptHost
from asynclock.state.redis._scripts import as_int, text
from asynclock.state.redis._transport import glob_escape

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection

    from redis.asyncio.connection import AbstractConnection

    from asynclock.state.redis._ready import ReadyIndex
    from asynclock.state.redis._transport import LockKeys

__all__ = ["REQUEUE_RESERVATION", "RedisInbox"]

#: seconds a key put back by ``inbox_requeue`` is reserved for the worker it is handed to (an
#: operator's command knows no dispatcher's ``lock_ttl``; the worker renews it as its own)
REQUEUE_RESERVATION = 30.0


class RedisInbox(ScriptHost):
    """The :class:`~asynclock.state.InboxState` operations of RedisState (see the module)."""

    # what RedisState supplies
    _prefix: str
    _keys: LockKeys
    _ready: ReadyIndex
    _retention_ms: int
    _reservation_ms: int

    if TYPE_CHECKING:

        async def _command(self, key: str, *args: str | int | bytes) -> object: ...

        async def _set_if_absent(self, name: str, value: str, ttl: float) -> bool: ...

        def _scan(self, pattern: str) -> AsyncIterator[str]: ...

        async def _blocking_connection(self, key: str) -> AbstractConnection: ...

    def _inbox_keys(self, key: str) -> tuple[str, str, str, str]:
        """The inbox's list, head attempt count, dead letters and entry counter (one slot)."""
        base = f"{self.lock_key(key)}:inbox"
        return base, f"{base}:attempts", f"{base}:dead", f"{base}:seq"

    def _hold_of(self, key: str) -> str:
        """The key's hold: a retry's due time, or its parking (``_hold.lua``; the same slot)."""
        return f"{self.lock_key(key)}:inbox:hold"

    def _tries_of(self, key: str) -> str:
        """The attempt counts of entries that are not the head (``_inbox_take.lua``)."""
        return f"{self.lock_key(key)}:inbox:tries"

    async def inbox_accept(
        self,
        key: str,
        payload: str,
        *,
        claim: str | None,
        claim_ttl: float,
        max_pending: int,
        lock_ttl: float = 30.0,
        with_entry: bool = True,
    ) -> InboxAccepted:
        """See :meth:`asynclock.state.InboxState.inbox_accept` (``inbox_accept.lua``, one EVALSHA,
        which also hands a free key out: see ``_handout.py``; with ``replicas=``, WAIT in the
        same write; on a cluster, two more the first time a slot gets work if its directory
        is on another master: see ``_cluster_inbox.py``)."""
        check_key(key)
        entries, attempts, _, seq = self._inbox_keys(key)
        lock_key = self.lock_key(key)
        claim_key = self._prefix + claim if claim is not None else seq
        if not self._keys.atomic_with(lock_key, claim_key):
            return await self._accept_claimed_apart(
                key, payload, claim_key, claim_ttl, max_pending, lock_ttl, with_entry
            )
        ready, mark = self._ready.ready_key(lock_key), self._ready.listed_key(lock_key)
        reply = await self._eval_listing(
            "inbox_accept",
            lock_key,
            (entries, seq, ready, claim_key, mark, lock_key, attempts, self._hold_of(key)),
            (payload, max_pending, ttl_ms(claim_ttl), key, "1" if claim is not None else "0"),
            await self._hand_out_args(lock_key, lock_ttl, with_entry),
            _unlisted_accept,
            f"an event for {key!r} was accepted",
        )
        assert isinstance(reply, list)
        if len(reply) > 2 and as_int(reply[2]) < 0:
            self._ready.lane_moved()  # the key waits for a rescan; the next accept looks again
        return InboxAccepted(text(reply[0]), as_int(reply[1]))

    async def _hand_out_args(
        self, lock_key: str, lock_ttl: float, with_entry: bool
    ) -> tuple[str | int, ...]:
        """The ARGV of ``_handout.lua``'s ``hand_out()`` for ``lock_key``'s key: its lane, a
        fresh owner, the reservation's ttl_ms, whether the head entry goes along."""
        lane = await self._ready.lane_for(lock_key)
        ttl = ttl_ms(check_ttl(lock_ttl, "lock_ttl"))
        return (lane, new_handout_owner(), ttl, "1" if with_entry else "0")

    async def _accept_claimed_apart(
        self,
        key: str,
        payload: str,
        claim_key: str,
        claim_ttl: float,
        max_pending: int,
        lock_ttl: float,
        with_entry: bool,
    ) -> InboxAccepted:
        """A claim that no script can reach with the inbox (a cluster key starting with a brace,
        see :meth:`lock_key`): record it first, then accept without it, and forget it again if
        the entry was not appended. Two round trips; a crash between them loses the event's
        redelivery as a duplicate, as :meth:`acquire_claimed` does for such keys."""
        if not await self._set_if_absent(claim_key, "accepted", claim_ttl):
            entries = self._inbox_keys(key)[0]
            return InboxAccepted("duplicate", as_int(await self._command(entries, "LLEN", entries)))
        accepted = await self.inbox_accept(
            key,
            payload,
            claim=None,
            claim_ttl=claim_ttl,
            max_pending=max_pending,
            lock_ttl=lock_ttl,
            with_entry=with_entry,
        )
        if accepted.status != "accepted":
            await self._command(claim_key, "DEL", claim_key)
        return accepted

    async def _eval_listing(
        self,
        name: str,
        lock_key: str,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        tail: tuple[str | int, ...],
        unlisted: Callable[[object], str | None],
        what: str,
    ) -> object:
        """Run a script that may add ``lock_key``'s key to its set of keys with work
        (``_listed.lua``, which lists the set itself when it can); while that set is
        ``unlisted`` (the script answers the generation to list it under: '' for a fresh one),
        list it through the index and run the script again.

        The script gets ``args``, then the listing, then ``tail``. With ``replicas=N``, each
        run is confirmed by WAIT (a shortfall raises, naming ``what``).
        """
        listing = self._ready.listing_for(lock_key)
        reply = await self._eval_confirmed(name, keys, (*args, listing, *tail), what)
        # at most twice: the second time only when another accept listed the slot meanwhile
        while (wanted := unlisted(reply)) is not None:
            generation = await self._ready.list_for(lock_key, wanted or None)
            reply = await self._eval_confirmed(name, keys, (*args, generation, *tail), what)
        return reply

    async def inbox_step(
        self,
        key: str,
        owner: str,
        *,
        done: int | None = None,
        dead: str | None = None,
        take: bool = True,
        retry_in: float | None = None,
        park: bool = False,
    ) -> InboxEntry | None:
        """See :meth:`asynclock.state.InboxState.inbox_step` (``_inbox_step.lua`` before
        ``release.lua``: one EVALSHA, also with ``retry_in`` or ``park``: see ``_hold.lua``)."""
        retry = check_inbox_finish(key, done=done, dead=dead, retry_in=retry_in, park=park)
        args = (
            *self._step_args(owner),
            "" if done is None else str(done),
            "1" if dead is not None else "0",
            dead or "",
            "1" if take else "0",
            key,
            *_finish_args(retry, park),
        )
        keys = (*self._step_keys(key), self._hold_of(key), self._tries_of(key))
        reply = await self._eval("inbox_step", keys, *args)
        if isinstance(reply, list):
            head, count, now_ms, pending = reply
            entry_id, accepted_ms, payload = _entry(head)
            age = max(as_int(now_ms) - accepted_ms, 0) / 1000.0
            return InboxEntry(entry_id, as_int(count), payload, age, as_int(pending))
        if as_int(reply) < 0:
            raise LockNotOwnedError(key, owner)
        return None

    async def inbox_take(
        self,
        key: str,
        owner: str,
        *,
        done: Collection[int] = (),
        dead: str | None = None,
        limit: int,
        retry_in: float | None = None,
        park: bool = False,
    ) -> InboxBatch | None:
        """See :meth:`asynclock.state.InboxState.inbox_take` (``_inbox_take.lua`` before
        ``release.lua``: one EVALSHA, also with ``retry_in`` or ``park``: see ``_hold.lua``)."""
        check_limit(limit)
        ids = tuple(str(int(entry)) for entry in done)
        retry = check_inbox_finish(key, done=ids, dead=dead, retry_in=retry_in, park=park)
        args = (
            *self._step_args(owner),
            limit,
            "1" if dead is not None else "0",
            dead or "",
            key,
            *_finish_args(retry, park),
        )
        keys = (*self._step_keys(key), self._tries_of(key), self._hold_of(key))
        reply = await self._eval("inbox_take", keys, *args, *ids)
        if not isinstance(reply, list):
            if as_int(reply) < 0:
                raise LockNotOwnedError(key, owner)
            return None
        now_ms, pending, newest, *handed = reply
        now, count = as_int(now_ms), as_int(pending)
        entries = []
        for raw, attempts in zip(handed[::2], handed[1::2], strict=True):
            entry_id, accepted_ms, payload = _entry(raw)
            age = max(now - accepted_ms, 0) / 1000.0
            entries.append(InboxEntry(entry_id, as_int(attempts), payload, age, count))
        quiet = max(now - _entry(newest)[1], 0) / 1000.0
        return InboxBatch(tuple(entries), count, quiet)

    def _step_keys(self, key: str) -> tuple[str, ...]:
        """KEYS[1..7] of ``inbox_step`` and ``inbox_take`` (release.lua's, then the inbox's)."""
        entries, attempts, dead_letters, seq = self._inbox_keys(key)
        lock_key = self.lock_key(key)
        return (
            lock_key,
            f"{lock_key}:released",
            entries,
            attempts,
            dead_letters,
            self._ready.ready_key(lock_key),
            seq,
        )

    def _step_args(self, owner: str) -> tuple[str | int, ...]:
        """ARGV[1..5] of ``inbox_step`` and ``inbox_take``: release.lua's, without a successor."""
        return (owner, "", 0, self._retention_ms, self._reservation_ms)

    async def inbox_ready(self) -> list[str]:
        """See :meth:`asynclock.state.InboxState.inbox_ready` (the set of keys with work, one
        EVALSHA of ``inbox_ready.lua``, and their locks, one MGET; on a cluster, the directory
        and the sets it lists, see ``_cluster_inbox.py``, and the locks read per master in one
        round). A key that waits for a retry is left out until its due time (its score in the
        set, by the server's clock); a parked key is in no set (``_hold.lua``)."""
        keys = await self._ready.keys(due=True)
        values = await self._ready.lock_values([self.lock_key(key) for key in keys])
        return [key for key, value in zip(keys, values, strict=True) if _free(value)]

    @contextlib.asynccontextmanager
    async def inbox_worker(self, *, lock_ttl: float, with_entry: bool) -> AsyncIterator[LaneWorker]:
        """See :meth:`asynclock.state.InboxState.inbox_worker` (a BRPOP on each hand-out lane,
        on connections of its own: ``_handout.py``)."""
        check_ttl(lock_ttl, "lock_ttl")
        worker = LaneWorker(
            lanes=self._ready.lanes,
            connect=self._blocking_connection,
            adopt=self._inbox_adopt,
            lock_ttl=lock_ttl,
            with_entry=with_entry,
            op_timeout=self._op_timeout or 5.0,
        )
        try:
            await worker.start()
            yield worker
        finally:
            await worker.aclose()

    async def _inbox_adopt(
        self,
        key: str,
        owner: str,
        ttl: float,
        with_entry: bool,
        handed: InboxEntry | None,
        bare: bool = False,
    ) -> object:
        """``inbox_adopt.lua`` for a grant of ``key`` to ``owner``, which handed out ``handed``
        (``bare``: it came without the head a worker ``with_entry`` wants: see
        ``_handout.py``)."""
        entries, attempts, _, _ = self._inbox_keys(key)
        return await self._eval(
            "inbox_adopt",
            (self.lock_key(key), entries, attempts, self._hold_of(key)),
            owner,
            ttl_ms(ttl),
            "1" if with_entry else "0",
            key,
            "" if handed is None else str(handed.id),
            "" if handed is None else str(handed.attempt),
            "1" if bare else "0",
        )

    async def inbox_keys(self) -> list[InboxKey]:
        """See :meth:`asynclock.state.InboxState.inbox_keys` (the set of keys with work, and a
        SCAN for dead letters and holds: a parked key is in no set of keys with work)."""
        keys = set(await self._ready.keys())
        # ":inbox:dead" and ":inbox:hold" in one SCAN (no other key of the layout matches)
        pattern = f"{glob_escape(self._prefix)}{{*}}:inbox:[dh][eo][al]d"
        async for name in self._scan(pattern):
            for suffix in (":inbox:dead", ":inbox:hold"):
                if name.endswith(suffix):
                    keys.add(self._keys.key_of(name[: -len(suffix)]))
        found = []
        now = await self._command(self._prefix, "TIME")  # the server's clock, once
        assert isinstance(now, list)
        now_ms = as_int(now[0]) * 1000 + as_int(now[1]) // 1000
        for key in sorted(keys):
            entries, _, dead_letters, _ = self._inbox_keys(key)
            hold = self._hold_of(key)
            pending = as_int(await self._command(entries, "LLEN", entries))
            head = await self._command(entries, "LINDEX", entries, 0)
            age = 0.0 if head is None else max(now_ms - _entry(head)[1], 0) / 1000.0
            dead = as_int(await self._command(dead_letters, "LLEN", dead_letters))
            held = await self._command(hold, "GET", hold)
            parked = held is not None and text(held) == "p"
            retry_in = None
            if held is not None and not parked:
                retry_in = max(as_int(held) - now_ms, 0) / 1000.0
            found.append(InboxKey(key, pending, age, dead, retry_in, parked))
        return found

    async def inbox_dead_letters(self, key: str) -> list[DeadLetter]:
        """See :meth:`asynclock.state.InboxState.inbox_dead_letters` (one LRANGE)."""
        _, _, dead_letters, _ = self._inbox_keys(key)
        reply = await self._command(dead_letters, "LRANGE", dead_letters, 0, -1)
        assert isinstance(reply, list)
        letters = []
        for raw in reply:
            entry, attempts, error = json.loads(text(raw))
            entry_id, _, payload = _entry(entry)
            letters.append(DeadLetter(key, entry_id, int(attempts), error, payload))
        return letters

    async def inbox_requeue(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_requeue` (``inbox_requeue.lua``; a key
        nobody holds is handed out for ``REQUEUE_RESERVATION`` seconds, without an entry: a
        worker that hands the head out gets it when it takes the grant, see ``_handout.py``)."""
        return await self._put_back(key, "requeue", "requeued")

    async def inbox_discard(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_discard` (``inbox_requeue.lua`` that
        deletes the dead letters instead; the hand-out as :meth:`inbox_requeue`'s)."""
        return await self._put_back(key, "discard", "discarded")

    async def _put_back(self, key: str, mode: str, what: str) -> int:
        """``inbox_requeue.lua`` in ``mode`` (``requeue`` or ``discard``) for ``key``."""
        check_key(key)
        entries, attempts, dead_letters, seq = self._inbox_keys(key)
        lock_key = self.lock_key(key)
        ready, mark = self._ready.ready_key(lock_key), self._ready.listed_key(lock_key)
        lane = await self._ready.lane_for(lock_key)
        reply = await self._eval_listing(
            "inbox_requeue",
            lock_key,
            (
                *(entries, attempts, dead_letters, ready, mark, lock_key),
                *(self._hold_of(key), seq, self._tries_of(key)),
            ),
            (key,),
            (lane, new_handout_owner(), ttl_ms(REQUEUE_RESERVATION), mode),
            _unlisted_requeue,
            f"dead letters of {key!r} were {what}",
        )
        return as_int(reply)


def _unlisted_accept(reply: object) -> str | None:
    """An ``inbox_accept.lua`` reply's generation to list its slot under, if it was unlisted."""
    assert isinstance(reply, list)
    return text(reply[2]) if text(reply[0]) == "unlisted" else None


def _unlisted_requeue(reply: object) -> str | None:
    """An ``inbox_requeue.lua`` reply's generation to list its slot under, if it was unlisted."""
    return text(reply[1]) if isinstance(reply, list) else None


def _finish_args(retry_in: float | None, park: bool) -> tuple[str, str]:
    """The ARGV of a step's ``retry_in`` (in ms, rounded up: never due early; '' for none) and
    ``park`` (``_inbox_step.lua``, ``_inbox_take.lua``)."""
    retry_ms = "" if retry_in is None else str(max(math.ceil(retry_in * 1000.0), 1))
    return retry_ms, "1" if park else "0"


def _free(value: object) -> bool:
    """Whether a lock key's value (``_value.lua``) leaves the lock free for anyone: missing,
    or a token alone (no holder, no waiter it is reserved for)."""
    if value is None:
        return True
    return " " not in text(value).split("\n", 1)[0]


def _entry(raw: object) -> tuple[int, int, str]:
    """An inbox entry ``"<id> <accepted ms> <payload>"`` (``inbox_accept.lua``) as its parts."""
    entry_id, accepted_ms, payload = text(raw).split(" ", 2)
    return int(entry_id), int(accepted_ms), payload
