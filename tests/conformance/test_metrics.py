"""Metrics hooks: what a sink sees, on every backend, and the ready adapters."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock, Event, EventDispatcher, LockAcquisitionError, LockLostError
from asynclock.metrics import get_metrics, set_metrics

if TYPE_CHECKING:
    from collections.abc import Iterator

    from asynclock import State


class Recorder:
    """A sink that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def lock_acquired(self, key: str, wait: float, contended: bool) -> None:
        self.calls.append(("acquired", (key, wait, contended)))

    def lock_released(self, key: str, held: float) -> None:
        self.calls.append(("released", (key, held)))

    def lock_conflict(self, key: str) -> None:
        self.calls.append(("conflict", (key,)))

    def lock_renewed(self, key: str) -> None:
        self.calls.append(("renewed", (key,)))

    def lock_lost(self, key: str, reason: str) -> None:
        self.calls.append(("lost", (key, reason)))

    def dispatch_outcome(self, event_type: str, outcome: str, duration: float) -> None:
        self.calls.append(("outcome", (event_type, outcome, duration)))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    sink = Recorder()
    previous = set_metrics(sink)
    try:
        yield sink
    finally:
        set_metrics(previous)


async def test_acquire_hold_release_and_conflict(
    state: State, key: str, recorder: Recorder
) -> None:
    holder = AsyncLock(state, key, ttl=10.0)
    async with holder:
        await asyncio.sleep(0.02)
        assert not await AsyncLock(state, key, ttl=10.0).acquire(blocking=False)
        with pytest.raises(LockAcquisitionError):
            await AsyncLock(state, key, ttl=10.0).acquire(timeout=0.05)
    assert recorder.names() == ["acquired", "conflict", "conflict", "released"]
    acquired = recorder.calls[0][1]
    assert acquired[0] == key
    assert acquired[2] is False  # uncontended
    held = recorder.calls[-1][1][1]
    assert isinstance(held, float)
    assert 0.02 <= held < 5.0


async def test_a_waiter_reports_contended_and_its_wait(
    state: State, key: str, recorder: Recorder
) -> None:
    holder = AsyncLock(state, key, ttl=10.0)
    await holder.acquire()
    waiter = AsyncLock(state, key, ttl=10.0)

    async def wait_turn() -> None:
        async with waiter:
            pass

    task = asyncio.create_task(wait_turn())
    await asyncio.sleep(0.05)
    await holder.release()
    await asyncio.wait_for(task, 5.0)
    (_, (name, wait, contended)) = next(c for c in recorder.calls[1:] if c[0] == "acquired")
    assert name == key
    assert contended is True
    assert isinstance(wait, float)
    assert wait >= 0.04


async def test_renewals_and_a_loss_are_reported(state: State, key: str, recorder: Recorder) -> None:
    lock = AsyncLock(state, key, ttl=0.3, auto_renew=True, max_lifetime=0.5)
    with pytest.raises(LockLostError):
        async with lock:
            await asyncio.sleep(5)
    names = recorder.names()
    assert ("lost", (key, "max_lifetime=0.5 s passed")) in recorder.calls
    assert "renewed" in names
    assert "lost" in names
    assert names.index("lost") > names.index("renewed")


async def test_dispatch_outcomes_with_durations(state: State, recorder: Recorder) -> None:
    bot = EventDispatcher(state)

    @bot.on("mention")
    async def handle(event: Event) -> None:
        await asyncio.sleep(0.01)

    event = Event("mention", "slack", "C1", "T1", "m-metrics")
    await bot.dispatch(event)
    await bot.dispatch(event)
    outcomes = [args for name, args in recorder.calls if name == "outcome"]
    assert [(t, o) for t, o, _ in outcomes] == [("mention", "handled"), ("mention", "duplicate")]
    duration = outcomes[0][2]
    assert isinstance(duration, float)
    assert duration >= 0.01


async def test_a_failing_sink_never_breaks_a_lock(state: State, key: str) -> None:
    class Broken(Recorder):
        def lock_acquired(self, key: str, wait: float, contended: bool) -> None:
            raise RuntimeError("exporter down")

    previous = set_metrics(Broken())
    try:
        async with AsyncLock(state, key, ttl=5.0) as lock:
            assert lock.owned
    finally:
        set_metrics(previous)


def test_set_metrics_rejects_a_non_sink() -> None:
    with pytest.raises(TypeError, match="MetricsSink"):
        set_metrics(object())  # type: ignore[arg-type]
    assert get_metrics() is None


async def test_prometheus_adapter_fills_its_registry(state: State, key: str) -> None:
    from prometheus_client import CollectorRegistry

    from asynclock.metrics.prometheus import PrometheusMetrics

    registry = CollectorRegistry()
    previous = set_metrics(PrometheusMetrics(registry))
    try:
        async with AsyncLock(state, f"ig:{key}", ttl=5.0):
            pass
        bot = EventDispatcher(state)
        await bot.dispatch(Event("mention", "slack", "C1", "T1", f"m-{key}"))
    finally:
        set_metrics(previous)
    assert (
        registry.get_sample_value(
            "asynclock_lock_acquired_total", {"name": "ig", "contended": "no"}
        )
        == 1
    )
    assert registry.get_sample_value("asynclock_lock_hold_seconds_count", {"name": "ig"}) == 1
    assert (
        registry.get_sample_value(
            "asynclock_dispatch_outcomes_total", {"event_type": "mention", "outcome": "handled"}
        )
        == 1
    )


async def test_opentelemetry_adapter_records_instruments(state: State, key: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from asynclock.metrics.otel import OpenTelemetryMetrics

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    previous = set_metrics(OpenTelemetryMetrics(provider.get_meter("asynclock-test")))
    try:
        async with AsyncLock(state, f"ig:{key}", ttl=5.0):
            pass
    finally:
        set_metrics(previous)
    data = reader.get_metrics_data()
    assert data is not None
    names = {
        metric.name
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert {"asynclock.lock.wait", "asynclock.lock.hold", "asynclock.lock.acquired"} <= names
    provider.shutdown()
