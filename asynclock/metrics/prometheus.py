"""A :class:`~asynclock.metrics.MetricsSink` for ``prometheus-client``.

Install with ``pip install 'asynclock[prometheus]'``, then::

    from asynclock.metrics import set_metrics
    from asynclock.metrics.prometheus import PrometheusMetrics

    set_metrics(PrometheusMetrics())          # registers on prometheus_client's default registry

Metrics (prefix ``asynclock_``): ``lock_wait_seconds`` and ``lock_hold_seconds`` histograms,
``lock_acquired_total``, ``lock_conflicts_total``, ``lock_renewals_total``,
``lock_losses_total`` counters, all labelled ``name`` (``key_label(key)``, by default the
key's first ``:``-separated part), and ``dispatch_outcomes_total`` / ``dispatch_seconds``
labelled ``event_type`` and ``outcome``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from asynclock.metrics import default_key_label

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ("PrometheusMetrics",)

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_HOLD_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class PrometheusMetrics:
    """Reports asynclock's metrics to a ``prometheus_client`` registry.

    Args:
        registry: where to register (default: prometheus_client's global ``REGISTRY``).
        namespace: the metric name prefix.
        key_label: maps a lock key to a bounded label value (never the key itself: keys are
            usually one per conversation).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "asynclock",
        key_label: Callable[[str], str] = default_key_label,
    ) -> None:
        # every metric of this sink has the same prefix and registry
        where = registry if registry is not None else REGISTRY
        counter = functools.partial(Counter, namespace=namespace, registry=where)
        gauge = functools.partial(Gauge, namespace=namespace, registry=where)
        histogram = functools.partial(Histogram, namespace=namespace, registry=where)
        self._label = key_label
        self.wait = histogram(
            "lock_wait_seconds",
            "Seconds from an acquire call to holding the lock.",
            ["name"],
            buckets=_LATENCY_BUCKETS,
        )
        self.hold = histogram(
            "lock_hold_seconds", "Seconds a lock was held.", ["name"], buckets=_HOLD_BUCKETS
        )
        self.acquired = counter("lock_acquired", "Locks acquired.", ["name", "contended"])
        self.conflicts = counter("lock_conflicts", "Acquires that gave up on a held key.", ["name"])
        self.renewals = counter("lock_renewals", "Auto-renewals of held locks.", ["name"])
        self.losses = counter("lock_losses", "Held locks lost.", ["name"])
        self.outcomes = counter(
            "dispatch_outcomes", "EventDispatcher outcomes.", ["event_type", "outcome"]
        )
        self.dispatch_seconds = histogram(
            "dispatch_seconds",
            "Seconds per EventDispatcher.dispatch.",
            ["event_type", "outcome"],
            buckets=_LATENCY_BUCKETS,
        )

        self.inbox_lag = histogram(
            "inbox_lag_seconds",
            "Seconds from accept to a worker taking the entry (the oldest of its key).",
            ["name"],
            buckets=_HOLD_BUCKETS,
        )
        self.inbox_pending = gauge(
            "inbox_pending",
            "Entries pending in an inbox when a worker last took one (per key label).",
            ["name"],
        )
        self.dead_letters = counter(
            "inbox_dead_letters", "Inbox entries dead-lettered after their last attempt.", ["name"]
        )

    def lock_acquired(self, key: str, wait: float, contended: bool) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_acquired`."""
        name = self._label(key)
        self.wait.labels(name).observe(wait)
        self.acquired.labels(name, "yes" if contended else "no").inc()

    def lock_released(self, key: str, held: float) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_released`."""
        self.hold.labels(self._label(key)).observe(held)

    def lock_conflict(self, key: str) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_conflict`."""
        self.conflicts.labels(self._label(key)).inc()

    def lock_renewed(self, key: str) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_renewed`."""
        self.renewals.labels(self._label(key)).inc()

    def lock_lost(self, key: str, reason: str) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.lock_lost`."""
        self.losses.labels(self._label(key)).inc()

    def dispatch_outcome(self, event_type: str, outcome: str, duration: float) -> None:
        """See :meth:`asynclock.metrics.MetricsSink.dispatch_outcome`."""
        self.outcomes.labels(event_type, outcome).inc()
        self.dispatch_seconds.labels(event_type, outcome).observe(duration)

    def inbox_entry(self, key: str, pending: int, age: float) -> None:
        """See :meth:`asynclock.metrics.InboxMetricsSink.inbox_entry`."""
        name = self._label(key)
        self.inbox_lag.labels(name).observe(age)
        self.inbox_pending.labels(name).set(pending)

    def inbox_dead_letter(self, key: str) -> None:
        """See :meth:`asynclock.metrics.InboxMetricsSink.inbox_dead_letter`."""
        self.dead_letters.labels(self._label(key)).inc()
