"""The sink asynclock reports to now: its one home, read on every hot path.

:func:`asynclock.metrics.set_metrics` writes :attr:`ActiveSink.sink`; the primitives read
``active.sink is not None`` before they build a report's arguments (a clock read, a
subtraction), so that check is one global and one slot read, as cheap as a module global.
"""

from __future__ import annotations

__all__ = ["ActiveSink", "active"]


class ActiveSink:
    """Holds the current sink (``None``: report nothing).

    Typed ``object``: the sink's protocol lives in :mod:`asynclock.metrics`, which imports this
    module; :func:`asynclock.metrics.set_metrics` checks it before storing it.
    """

    __slots__ = ("sink",)

    def __init__(self) -> None:
        self.sink: object | None = None


#: the process's one sink holder
active = ActiveSink()
