"""The internal capability of a state whose steps need no I/O, and how a primitive finds it.

The yield rule asks every operation to yield to the event loop once before it acts.
``AsyncLock`` and ``EventDispatcher`` check their arguments once and yield once themselves; on
a state with immediate steps they then run a step's body directly instead of awaiting the
step, which would check and yield again (the lean path: docs/decisions.md, "A lean path on
MemoryState"). :class:`~asynclock.MemoryState` has them; a custom backend need not.

The steps are an object of their own (MemoryState's lock table), not methods of the state: a
public state class gains no public-looking methods, and nothing outside the package reaches
them. A state offers them by deriving from :class:`OffersImmediateSteps`;
:func:`immediate_steps` is the one reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from asynclock.state._protocol import Grant, Release

__all__ = ["ImmediateSteps", "OffersImmediateSteps", "immediate_steps"]


class ImmediateSteps(Protocol):
    """The bodies of a state's async steps, without an await.

    Invariants: each ``*_now`` method is one atomic step with the effect of its async
    namesake on the state (``acquire``, ``acquire_claimed``, ``release``, ``release_claimed``,
    ``dedupe_add``, ``dedupe_keep``), its arguments already checked by the caller.
    ``steps_are_own()`` is False whenever those async steps were replaced (a subclass, a
    test's spy, an injected fault): the caller must then go through them, so whatever
    replaced them sees every operation.
    """

    def steps_are_own(self) -> bool:
        """Whether the state's async steps are its class's own (the lean path may skip them)."""
        ...

    def acquire_now(self, key: str, owner: str, ttl: float) -> Grant:
        """``acquire(key, owner, ttl)`` without its yield."""
        ...

    def token_now(self, key: str, owner: str, ttl: float) -> int | None:
        """``acquire`` answering only the fencing token (``None``: held by another owner)."""
        ...

    def acquire_claimed_now(
        self, key: str, owner: str, ttl: float, claim: str, claim_ttl: float
    ) -> Grant | None:
        """``acquire_claimed`` without its yield."""
        ...

    def claim_and_acquire_now(
        self, key: str, owner: str, ttl: float, claim: str | None, claim_ttl: float
    ) -> int | None:
        """Claim (unless ``None``) and acquire in one step: the token, ``0`` when the key is
        busy (nothing recorded), ``None`` for a duplicate claim."""
        ...

    def claim_now(self, claim: str, owner: str, ttl: float) -> bool:
        """``dedupe_add(claim, ttl)`` recorded as ``owner``'s (as ``acquire_claimed`` records
        it), without its yield; ``False``: a duplicate."""
        ...

    def keep_now(self, claim: str, ttl: float) -> None:
        """``dedupe_keep(claim, ttl)`` without its yield."""
        ...

    def release_now(
        self,
        key: str,
        owner: str,
        claim: str | None = None,
        claim_ttl: float = 0.0,
        successor: str | None = None,
        ttl: float | None = None,
        swept: bool = True,
    ) -> Release:
        """``release`` (``release_claimed`` with ``claim``) without its yield; ``swept=False``:
        the successor's lock needs no expiry sweep (the lean path releases it itself)."""
        ...


class OffersImmediateSteps:
    """Base of a state with :class:`ImmediateSteps`: holds them for :func:`immediate_steps`."""

    __slots__ = ("_immediate_steps",)

    def __init__(self, steps: ImmediateSteps) -> None:
        self._immediate_steps = steps


def immediate_steps(state: object) -> ImmediateSteps | None:
    """``state``'s :class:`ImmediateSteps`, or ``None`` when it has none.

    Looked up once per lock or dispatcher (a plain ``isinstance``: a runtime-checkable
    protocol's would cost more than the steps save); whether the steps may be skipped is asked
    per operation, with ``steps_are_own()``.
    """
    return state._immediate_steps if isinstance(state, OffersImmediateSteps) else None
