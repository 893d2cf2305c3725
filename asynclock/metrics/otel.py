"""A :class:`~asynclock.metrics.MetricsSink` for OpenTelemetry metrics.

Install with ``pip install 'asynclock[otel]'`` (the API; configure an SDK and an exporter as
usual), then::

    from opentelemetry import metrics
    from asynclock.metrics import set_metrics
    from asynclock.metrics.otel import OpenTelemetryMetrics

    set_metrics(OpenTelemetryMetrics(metrics.get_meter("asynclock")))

Instruments: histograms ``asynclock.lock.wait`` and ``asynclock.lock.hold`` (unit ``s``),
counters ``asynclock.lock.acquired``, ``asynclock.lock.conflicts``,
``asynclock.lock.renewals``, ``asynclock.lock.losses`` (attribute ``name`` =
``key_label(key)``), and ``asynclock.dispatch.outcomes`` / histogram
``asynclock.dispatch.duration`` (attributes ``event_type``, ``outcome``); for the durable
inbox, histogram ``asynclock.inbox.lag`` (unit ``s``), gauge ``asynclock.inbox.pending`` and
counter ``asynclock.inbox.dead_letters`` (attribute ``name``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asynclock.metrics import default_key_label

if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.metrics import Meter

__all__ = ("OpenTelemetryMetrics",)


class OpenTelemetryMetrics:
    """Reports asynclock's metrics through an OpenTelemetry ``Meter``.

    Args:
        meter: the meter to create the instruments on.
        key_label: maps a lock key to a bounded attribute value (never the key itself).
    """

    def __init__(
        self, meter: Meter, *, key_label: Callable[[str], str] = default_key_label
    ) -> None:
        self._label = key_label
        self.wait = meter.create_histogram("asynclock.lock.wait", unit="s")
        self.hold = meter.create_histogram("asynclock.lock.hold", unit="s")
        self.acquired = meter.create_counter("asynclock.lock.acquired")
        self.conflicts = meter.create_counter("asynclock.lock.conflicts")
        self.renewals = meter.create_counter("asynclock.lock.renewals")
        self.losses = meter.create_counter("asynclock.lock.losses")
        self.outcomes = meter.create_counter("asynclock.dispatch.outcomes")
        self.duration = meter.create_histogram("asynclock.dispatch.duration", unit="s")
        self.inbox_lag = meter.create_histogram("asynclock.inbox.lag", unit="s")
        self.inbox_pending = meter.create_gauge("asynclock.inbox.pending")
        self.dead_letters = meter.create_counter("asynclock.inbox.dead_letters")

    def lock_acquired(self, key: str, wait: float, contended: bool) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_acquired`."""
        name = self._label(key)
        self.wait.record(wait, {"name": name})
        self.acquired.add(1, {"name": name, "contended": contended})

    def lock_released(self, key: str, held: float) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_released`."""
        self.hold.record(held, {"name": self._label(key)})

    def lock_conflict(self, key: str) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_conflict`."""
        self.conflicts.add(1, {"name": self._label(key)})

    def lock_renewed(self, key: str) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_renewed`."""
        self.renewals.add(1, {"name": self._label(key)})

    def lock_lost(self, key: str, reason: str) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_lost`."""
        self.losses.add(1, {"name": self._label(key)})

    def dispatch_outcome(self, event_type: str, outcome: str, duration: float) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.dispatch_outcome`."""
        attributes = {"event_type": event_type, "outcome": outcome}
        self.outcomes.add(1, attributes)
        self.duration.record(duration, attributes)

    def inbox_entry(self, key: str, pending: int, age: float) -> None:
        """See :meth:`asynclock.metrics.InboxMetricsSink.inbox_entry`."""
        name = {"name": self._label(key)}
        self.inbox_lag.record(age, name)
        self.inbox_pending.set(pending, name)

    def inbox_dead_letter(self, key: str) -> None:
        """See :meth:`asynclock.metrics.InboxMetricsSink.inbox_dead_letter`."""
        self.dead_letters.add(1, {"name": self._label(key)})
