"""MemoryState's fair lines (the :class:`~asynclock.state.FairState` capability), as data.

Per key, the turns that met it busy: each with the time it first did (its place) and the time
its place is kept until. Everything runs under MemoryState's mutex, with its clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from asynclock.state._protocol import Grant

if TYPE_CHECKING:
    from collections.abc import Callable


@final
class Lines:
    """The lines of one MemoryState: ``key -> {turn: [place, kept_until]}``.

    Invariant: a key with an empty line has no entry. Places whose hold ran out are dropped at
    the key's next ``take`` (a key never tried again keeps its few dead places: memory is the
    one-process backend, and every place is bounded by its hold anyway).
    """

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines: dict[str, dict[str, list[float]]] = {}

    def take(
        self,
        key: str,
        turn: str,
        hold: float,
        now: float,
        acquire: Callable[[], Grant],
        remaining: Callable[[], float | None],
    ) -> Grant:
        """:meth:`FairState.fair_acquire` given the state's ``acquire`` and the holder's
        ``remaining`` seconds (``None`` when the key is free)."""
        line = self._lines.get(key, {})
        for other in [t for t, (_, until) in line.items() if until <= now]:
            del line[other]
        head = min(line.items(), key=lambda item: (item[1][0], item[0]), default=None)
        if head is None or head[0] == turn:
            grant = acquire()
            if grant.token is not None:
                line.pop(turn, None)
                self._store(key, line)
                return grant
            retry_after = grant.retry_after or 0.0
        else:
            held = remaining()
            retry_after = held if held is not None else max(head[1][1] - now, 0.0)
        # kept until `hold` after the holder's lock expires (after now, when the key is free)
        place = line.setdefault(turn, [now, now])
        place[1] = now + (remaining() or 0.0) + hold
        self._store(key, line)
        return Grant(None, retry_after)

    def leave(self, key: str, turn: str) -> None:
        """:meth:`FairState.fair_leave`."""
        line = self._lines.get(key)
        if line is not None:
            line.pop(turn, None)
            self._store(key, line)

    def _store(self, key: str, line: dict[str, list[float]]) -> None:
        if line:
            self._lines[key] = line
        else:
            self._lines.pop(key, None)
