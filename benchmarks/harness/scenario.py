"""The two concepts every scenario is built of: a :class:`Scenario` and its :class:`Variant` rows.

A scenario module defines ``SCENARIO = Scenario(...)``; ``benchmarks/_cli.py`` lists them. A
variant is one row of a scenario's table: one way of doing the measured thing (asynclock, a peer
library, a raw floor), timed by the scenario in interleaved rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from benchmarks.harness.env import Asynclock, Config
    from benchmarks.harness.report import Section


@dataclass(frozen=True)
class Scenario:
    """One ``python -m benchmarks <name>`` and its block of docs/benchmarks.md."""

    name: str
    run: Callable[[Config, Asynclock | str], Awaitable[Section]]
    #: needs the run's Redis server (``--state`` / ``--private-server``)
    redis: bool = True
    #: part of ``all`` (a soak or a run of minutes is left to be run on its own)
    in_all: bool = True
    #: its block carries its own environment (servers, drivers, commit): a run of it alone
    #: keeps the doc's general environment block
    own_environment: bool = False


class Variant:
    """One row of a table: ``setup`` once, ``loop(n)`` per round (timed), ``teardown`` once.

    Scenarios whose rows do something else than a loop of ``n`` (dispatch an event, check an
    id, take a permit) add that method to their subclass; the life cycle stays this one.
    """

    name = ""
    #: ratio tag -> the name of the variant (of the same round) this one is divided by
    refs: dict[str, str]

    def __init__(self) -> None:
        self.refs = {}

    def passed(self, misses: int) -> None:
        """Raise if ``misses`` of a loop's operations failed (a broken loop is not timed)."""
        if misses:
            raise RuntimeError(f"{self.name}: {misses} failed acquires/releases")

    async def setup(self) -> None:
        """Untimed, once before the first round."""

    async def loop(self, n: int) -> None:
        """The timed part of a round: ``n`` operations."""
        raise NotImplementedError

    async def before_round(self) -> None:
        """Untimed, before each timed ``loop``."""

    async def after_round(self) -> None:
        """Untimed, after each timed ``loop``."""

    async def teardown(self) -> None:
        """Untimed, once after the last round."""
