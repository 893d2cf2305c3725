"""``retry_on_lock_conflict`` without a backend: counting, waits, policies, validation.

The decorated coroutines raise ``LockAcquisitionError`` themselves (no lock involved), so these
tests pin the decorator's own rules; ``tests/conformance/test_retry.py`` runs it against real
locks on every backend. The waits each retry really slept are read from the decorator's log
records (``record.wait``), so no test depends on how fast a loaded machine sleeps; times are
tens of milliseconds with generous upper bounds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import pytest

from asynclock import (
    LockAcquisitionError,
    LockLostError,
    LockNotOwnedError,
    RetryStatistics,
    retry_on_lock_conflict,
)
from asynclock._lock.grant import granted_reason
from asynclock.cli._demo import format_result, run_demo
from tests._helpers import finish, loop_steps

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

KEY = "ig:contact:42"


def conflict(retry_after: float | None = 0.5, key: str = KEY) -> LockAcquisitionError:
    return LockAcquisitionError(key, 3.0, retry_after)


class Flaky:
    """A coroutine that conflicts ``failures`` times, then returns ``"done"``; it counts."""

    def __init__(self, failures: int, retry_after: float | None = 0.5) -> None:
        self.failures = failures
        self.retry_after = retry_after
        self.executions = 0
        self.errors: list[LockAcquisitionError] = []
        self.granted: list[str | None] = []

    async def __call__(self, *args: object, **kwargs: object) -> str:
        self.executions += 1
        self.granted.append(granted_reason())
        await asyncio.sleep(0)
        if self.executions <= self.failures:
            error = conflict(self.retry_after)
            self.errors.append(error)
            raise error
        return "done"


def decorated(
    flaky: Flaky, **options: object
) -> Callable[..., Coroutine[object, object, str | None]]:
    """``flaky`` under ``retry_on_lock_conflict(**options)`` (the decorator wants a function)."""

    async def handle(*args: object, **kwargs: object) -> str:
        return await flaky(*args, **kwargs)

    wrapped: Callable[..., Coroutine[object, object, str | None]] = retry_on_lock_conflict(
        **options  # type: ignore[call-overload]
    )(handle)
    return wrapped


def statistics_of(function: object) -> RetryStatistics:
    stats = getattr(function, "statistics")()  # noqa: B009 - set by the decorator
    assert isinstance(stats, RetryStatistics)
    return stats


def logged_waits(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [r.wait for r in caplog.records if hasattr(r, "wait")]


class TestAttempts:
    async def test_attempts_counts_total_executions(self) -> None:
        flaky = Flaky(failures=10)
        handle = decorated(flaky, wait=0.0, attempts=3)
        with pytest.raises(LockAcquisitionError) as raised:
            await handle()
        assert flaky.executions == 3  # Rails: attempts=3 runs at most 3 times, not 1 + 3
        assert raised.value is flaky.errors[-1]  # the last conflict is re-raised

    async def test_one_attempt_means_no_retry(self) -> None:
        flaky = Flaky(failures=1)
        with pytest.raises(LockAcquisitionError):
            await decorated(flaky, wait=0.0, attempts=1)()
        assert flaky.executions == 1

    async def test_returns_as_soon_as_an_execution_succeeds(self) -> None:
        flaky = Flaky(failures=2)
        handle = decorated(flaky, wait=0.0, attempts=3)
        assert await handle() == "done"
        assert flaky.executions == 3
        assert statistics_of(handle) == RetryStatistics(calls=1, conflicts=2, retries=2)

    async def test_a_success_first_time_runs_once(self) -> None:
        flaky = Flaky(failures=0)
        handle = decorated(flaky, wait=10.0, attempts=3)
        assert await asyncio.wait_for(handle(), 5.0) == "done"
        assert flaky.executions == 1
        assert statistics_of(handle) == RetryStatistics(calls=1)


class TestWait:
    async def test_seconds_plus_jitter_stay_within_w_and_w_times_one_plus_jitter(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")
        flaky = Flaky(failures=100)
        handle = decorated(flaky, wait=0.01, jitter=0.5, attempts=21)
        started = time.monotonic()
        with pytest.raises(LockAcquisitionError):
            await handle()
        elapsed = time.monotonic() - started
        waits = logged_waits(caplog)
        assert len(waits) == 20
        assert all(0.01 <= w <= 0.015 for w in waits), waits
        assert len({round(w, 9) for w in waits}) > 1, "jitter should vary the waits"
        assert elapsed >= sum(waits) - 0.001

    async def test_no_jitter_waits_exactly_the_seconds(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")
        flaky = Flaky(failures=3)
        assert await decorated(flaky, wait=0.01, jitter=0.0, attempts=4)() == "done"
        assert logged_waits(caplog) == [0.01, 0.01, 0.01]

    async def test_default_jitter_is_fifteen_percent(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")
        flaky = Flaky(failures=100)
        with pytest.raises(LockAcquisitionError):
            await decorated(flaky, wait=0.01, attempts=11)()
        assert all(0.01 <= w <= 0.0115 for w in logged_waits(caplog))

    async def test_callable_is_deterministic_and_counts_from_one(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")
        seen: list[int] = []

        def wait(executions: int) -> float:
            seen.append(executions)
            return 0.01 * executions

        flaky = Flaky(failures=3)
        assert await decorated(flaky, wait=wait, attempts=4, jitter=0.9)() == "done"
        assert seen == [1, 2, 3]  # 1 after the first failed execution
        assert logged_waits(caplog) == [0.01, 0.02, 0.03]  # no jitter on a callable

    async def test_callable_wait_really_sleeps(self) -> None:
        flaky = Flaky(failures=2)
        started = time.monotonic()
        await decorated(flaky, wait=lambda n: 0.02 * n, attempts=3)()
        elapsed = time.monotonic() - started
        assert 0.06 - 0.005 <= elapsed < 2.0

    async def test_lock_ttl_waits_the_errors_retry_after(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")
        flaky = Flaky(failures=2, retry_after=0.02)
        assert await decorated(flaky, wait="lock_ttl", attempts=3)() == "done"
        assert logged_waits(caplog) == [0.02, 0.02]

    async def test_lock_ttl_falls_back_to_the_ttl_when_retry_after_is_unknown(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")

        @retry_on_lock_conflict(wait="lock_ttl", attempts=2)
        async def handle() -> None:
            if not caplog.records:
                raise LockAcquisitionError(KEY, 0.01, None)

        await handle()
        assert logged_waits(caplog) == [0.01]


class TestOnExhaustion:
    async def test_raise_is_the_default(self) -> None:
        flaky = Flaky(failures=5)
        handle = decorated(flaky, wait=0.0, attempts=2)
        with pytest.raises(LockAcquisitionError):
            await handle()
        assert statistics_of(handle) == RetryStatistics(
            calls=1, conflicts=2, retries=1, exhausted=1
        )

    async def test_drop_returns_none_logs_and_counts(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")
        flaky = Flaky(failures=5)
        handle = decorated(flaky, wait=0.0, attempts=2, on_exhaustion="drop")
        assert await handle() is None
        assert flaky.executions == 2
        assert statistics_of(handle).dropped == 1
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "dropping" in warnings[0].getMessage()
        assert KEY in warnings[0].getMessage()
        assert "handle" in warnings[0].getMessage()

    async def test_process_without_lock_runs_once_more_granted(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")
        flaky = Flaky(failures=3)
        handle = decorated(flaky, wait=0.0, attempts=3, on_exhaustion="process_without_lock")
        assert await handle() == "done"
        assert flaky.executions == 4  # 3 attempts, then once more
        assert flaky.granted[:3] == [None, None, None]
        reason = flaky.granted[3]
        assert reason is not None
        assert KEY in reason
        assert granted_reason() is None  # reset once the call is over
        stats = statistics_of(handle)
        assert (stats.exhausted, stats.processed_without_lock, stats.dropped) == (1, 1, 0)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "without the lock" in warnings[0].getMessage()

    async def test_process_without_lock_resets_the_grant_when_the_call_fails(self) -> None:
        calls = 0

        @retry_on_lock_conflict(wait=0.0, attempts=1, on_exhaustion="process_without_lock")
        async def handle() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise conflict()
            raise KeyError("boom")

        with pytest.raises(KeyError):
            await handle()
        assert granted_reason() is None

    async def test_process_without_lock_a_conflict_in_the_last_run_is_raised(self) -> None:
        @retry_on_lock_conflict(wait=0.0, attempts=1, on_exhaustion="process_without_lock")
        async def handle() -> None:
            raise conflict()  # e.g. a blocking acquire with a timeout is still a conflict

        with pytest.raises(LockAcquisitionError):
            await handle()

    async def test_sync_callable_gets_the_original_arguments(self) -> None:
        received: list[tuple[tuple[object, ...], dict[str, object]]] = []

        def fallback(*args: object, **kwargs: object) -> str:
            received.append((args, kwargs))
            return "fallback"

        flaky = Flaky(failures=5)
        handle = decorated(flaky, wait=0.0, attempts=2, on_exhaustion=fallback)
        payload = {"entries": [1, 2]}
        assert await handle(payload, 7, account="acme") == "fallback"
        assert received == [((payload, 7), {"account": "acme"})]
        assert received[0][0][0] is payload  # the very objects, not copies
        assert flaky.executions == 2

    async def test_async_callable_is_awaited(self) -> None:
        received: list[object] = []

        async def fallback(entry: object, *, account: str) -> str:
            await asyncio.sleep(0)
            received.append((entry, account))
            return f"queued {entry}"

        flaky = Flaky(failures=5)
        handle = decorated(flaky, wait=0.0, attempts=2, on_exhaustion=fallback)
        assert await handle("e1", account="acme") == "queued e1"
        assert received == [("e1", "acme")]

    async def test_callable_is_not_called_when_an_attempt_succeeds(self) -> None:
        def fallback(*args: object) -> None:
            raise AssertionError("not exhausted")

        assert await decorated(Flaky(1), wait=0.0, attempts=2, on_exhaustion=fallback)() == "done"


class TestLockTtlWindow:
    def test_chatwoot_numbers_are_accepted(self) -> None:
        # wait=->(executions) { executions.seconds }, attempts: 3, with_lock(key, 3.seconds)
        retry_on_lock_conflict(
            wait=lambda n: n, attempts=3, lock_ttl=3.0, on_exhaustion="process_without_lock"
        )

    def test_a_fixed_one_second_wait_is_refused_with_the_arithmetic(self) -> None:
        with pytest.raises(ValueError, match="too short") as raised:
            retry_on_lock_conflict(
                wait=1.0, attempts=3, lock_ttl=3.0, on_exhaustion="process_without_lock"
            )
        message = str(raised.value)
        assert "1 + 1 = 2 s" in message
        assert "lock_ttl=3" in message
        assert "attempts=3" in message

    def test_jitter_does_not_count_towards_the_window(self) -> None:
        # the check uses the lower bound of each wait: 1.5 + 1.5 = 3 is enough, with any jitter
        retry_on_lock_conflict(wait=1.5, attempts=3, lock_ttl=3.0, jitter=0.5)
        with pytest.raises(ValueError, match="too short"):
            retry_on_lock_conflict(wait=1.4, attempts=3, lock_ttl=3.0, jitter=0.5)

    def test_one_attempt_has_no_window(self) -> None:
        with pytest.raises(ValueError, match=r"attempts=1 .* 0 s"):
            retry_on_lock_conflict(wait=10.0, attempts=1, lock_ttl=3.0)

    def test_wait_lock_ttl_is_always_long_enough(self) -> None:
        retry_on_lock_conflict(wait="lock_ttl", attempts=2, lock_ttl=30.0)

    def test_a_callable_named_in_the_message(self) -> None:
        def half_a_second(executions: int) -> float:
            return 0.5

        with pytest.raises(ValueError, match="half_a_second"):
            retry_on_lock_conflict(wait=half_a_second, attempts=3, lock_ttl=3.0)

    @pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
    def test_bad_lock_ttl(self, bad: float) -> None:
        with pytest.raises(ValueError, match="lock_ttl"):
            retry_on_lock_conflict(wait=1.0, lock_ttl=bad)


class TestInvalidValues:
    @pytest.mark.parametrize("attempts", [0, -3])
    def test_attempts_below_one(self, attempts: int) -> None:
        with pytest.raises(ValueError, match=f"attempts must be >= 1.*{attempts}"):
            retry_on_lock_conflict(attempts=attempts)

    @pytest.mark.parametrize("attempts", [True, 2.0, "3", None])
    def test_attempts_of_the_wrong_type(self, attempts: object) -> None:
        with pytest.raises(TypeError, match="attempts"):
            retry_on_lock_conflict(attempts=attempts)  # type: ignore[call-overload]

    @pytest.mark.parametrize("wait", [-0.5, float("inf"), float("nan")])
    def test_bad_seconds(self, wait: float) -> None:
        with pytest.raises(ValueError, match="wait must be finite seconds >= 0"):
            retry_on_lock_conflict(wait=wait)

    @pytest.mark.parametrize("wait", [True, None, [1.0]])
    def test_wait_of_the_wrong_type(self, wait: object) -> None:
        with pytest.raises(TypeError, match="wait"):
            retry_on_lock_conflict(wait=wait)  # type: ignore[call-overload]

    def test_unknown_wait_string(self) -> None:
        with pytest.raises(ValueError, match="lock_ttl"):
            retry_on_lock_conflict(wait="forever")  # type: ignore[call-overload]

    async def test_a_wait_callable_returning_a_negative_fails_at_call_time(self) -> None:
        flaky = Flaky(failures=5)
        handle = decorated(flaky, wait=lambda n: 0.01 - 0.02 * n, attempts=3)  # decoration: ok
        with pytest.raises(ValueError, match=r"wait\(1\) must return finite seconds >= 0.*-0\.01"):
            await handle()
        assert flaky.executions == 1

    async def test_a_wait_callable_returning_a_non_number(self) -> None:
        handle = decorated(Flaky(5), wait=lambda n: "soon", attempts=3)
        with pytest.raises(TypeError, match="'soon'"):
            await handle()

    def test_a_negative_wait_callable_with_lock_ttl_fails_at_decoration(self) -> None:
        with pytest.raises(ValueError, match=r"wait\(1\)"):
            retry_on_lock_conflict(wait=lambda n: -1.0, attempts=3, lock_ttl=3.0)

    @pytest.mark.parametrize(("jitter", "error"), [(-0.1, ValueError), (True, TypeError)])
    def test_bad_jitter(self, jitter: float, error: type[Exception]) -> None:
        with pytest.raises(error, match="jitter"):
            retry_on_lock_conflict(jitter=jitter)

    def test_unknown_on_exhaustion(self) -> None:
        with pytest.raises(ValueError, match="'retry_forever'"):
            retry_on_lock_conflict(on_exhaustion="retry_forever")  # type: ignore[call-overload]

    def test_a_sync_function_is_refused_at_decoration(self) -> None:
        def handle() -> None:
            return None

        with pytest.raises(TypeError, match="async def"):
            retry_on_lock_conflict()(handle)  # type: ignore[arg-type]

    def test_a_coroutine_returning_lambda_is_refused(self) -> None:
        async def real() -> None:
            return None

        with pytest.raises(TypeError, match="async def"):
            retry_on_lock_conflict()(lambda: real())


class TestPassThrough:
    @pytest.mark.parametrize(
        "error",
        [
            KeyError("boom"),
            LockNotOwnedError(KEY, "someone"),
            LockLostError(KEY, "someone"),
            TimeoutError(),
        ],
    )
    async def test_other_exceptions_pass_through_at_once(self, error: Exception) -> None:
        executions = 0

        @retry_on_lock_conflict(wait=0.0, attempts=5)
        async def handle() -> None:
            nonlocal executions
            executions += 1
            raise error

        with pytest.raises(type(error)) as raised:
            await handle()
        assert raised.value is error
        assert executions == 1
        assert statistics_of(handle) == RetryStatistics(calls=1)

    async def test_cancelled_during_the_wait_is_not_retried(self) -> None:
        flaky = Flaky(failures=5)
        handle = decorated(flaky, wait=30.0, attempts=5)
        task = asyncio.create_task(handle())
        await loop_steps(5)  # the first execution has failed: now in the 30 s wait
        assert flaky.executions == 1
        assert statistics_of(handle).retries == 1  # counted right before the sleep
        task.cancel()
        assert isinstance(await asyncio.wait_for(finish(task), 5.0), asyncio.CancelledError)
        assert flaky.executions == 1

    async def test_cancelled_during_an_attempt_is_not_retried(self) -> None:
        executions = 0
        inside = asyncio.Event()

        @retry_on_lock_conflict(wait=0.0, attempts=5)
        async def handle() -> None:
            nonlocal executions
            executions += 1
            inside.set()
            await asyncio.sleep(30.0)

        task = asyncio.create_task(handle())
        await inside.wait()
        task.cancel()
        assert isinstance(await asyncio.wait_for(finish(task), 5.0), asyncio.CancelledError)
        assert executions == 1

    async def test_a_cancelled_error_raised_by_the_function_is_not_retried(self) -> None:
        executions = 0

        @retry_on_lock_conflict(wait=0.0, attempts=5)
        async def handle() -> None:
            nonlocal executions
            executions += 1
            raise asyncio.CancelledError

        with pytest.raises(asyncio.CancelledError):
            await handle()
        assert executions == 1


class Handler:
    def __init__(self) -> None:
        self.failures = 1
        self.seen: list[object] = []

    @retry_on_lock_conflict(wait=0.0, attempts=3)
    async def instance(self, entry: str) -> str:
        self.seen.append(self)
        if self.failures:
            self.failures -= 1
            raise conflict()
        return f"instance {entry}"

    @classmethod
    @retry_on_lock_conflict(wait=0.0, attempts=3, on_exhaustion="drop")
    async def below_classmethod(cls, entry: str) -> str:
        raise conflict()

    @retry_on_lock_conflict(wait=0.0, attempts=3, on_exhaustion="process_without_lock")
    @classmethod
    async def above_classmethod(cls, entry: str) -> str:
        if granted_reason() is None:
            raise conflict()
        return f"{cls.__name__} {entry}"

    @retry_on_lock_conflict(wait=0.0, attempts=2)
    @staticmethod
    async def above_staticmethod(entry: str) -> str:
        return f"static {entry}"


class TestMethods:
    async def test_instance_method_gets_self_on_every_execution(self) -> None:
        handler = Handler()
        assert await handler.instance("e1") == "instance e1"
        assert handler.seen == [handler, handler]

    async def test_classmethod_under_the_decorator(self) -> None:
        assert await Handler.below_classmethod("e1") is None
        assert statistics_of(Handler.below_classmethod).dropped >= 1

    async def test_classmethod_above_the_decorator(self) -> None:
        assert await Handler.above_classmethod("e1") == "Handler e1"
        assert await Handler().above_classmethod("e2") == "Handler e2"
        assert statistics_of(Handler.above_classmethod).processed_without_lock >= 2

    async def test_staticmethod_above_the_decorator(self) -> None:
        assert await Handler.above_staticmethod("e1") == "static e1"
        assert await Handler().above_staticmethod("e2") == "static e2"

    def test_wraps_keeps_the_name_and_docstring(self) -> None:
        @retry_on_lock_conflict()
        async def handle_webhook(payload: object) -> None:
            """Handle one webhook."""

        assert handle_webhook.__name__ == "handle_webhook"
        assert handle_webhook.__doc__ == "Handle one webhook."
        assert asyncio.iscoroutinefunction(handle_webhook)


class TestCounters:
    async def test_concurrent_calls_keep_separate_counters(self) -> None:
        # Each call conflicts twice, then succeeds: with attempts=3 every call succeeds only if
        # each counts its own executions (a shared counter would exhaust after 3 conflicts).
        failures: dict[int, int] = dict.fromkeys(range(20), 2)
        executions: dict[int, int] = dict.fromkeys(range(20), 0)

        @retry_on_lock_conflict(wait=lambda n: 0.005, attempts=3)
        async def handle(n: int) -> int:
            executions[n] += 1
            await asyncio.sleep(0)
            if failures[n]:
                failures[n] -= 1
                raise conflict()
            return n

        assert await asyncio.gather(*(handle(n) for n in range(20))) == list(range(20))
        assert set(executions.values()) == {3}
        assert statistics_of(handle) == RetryStatistics(calls=20, conflicts=40, retries=40)

    async def test_successive_calls_start_from_one(self) -> None:
        flaky = Flaky(failures=2)
        handle = decorated(flaky, wait=0.0, attempts=3)
        assert await handle() == "done"
        flaky.executions, flaky.failures = 0, 2
        assert await handle() == "done"  # a shared counter would have run out here

    async def test_statistics_is_a_frozen_snapshot(self) -> None:
        flaky = Flaky(failures=1)
        handle = decorated(flaky, wait=0.0, attempts=2)
        before = statistics_of(handle)
        await handle()
        assert before == RetryStatistics()
        assert statistics_of(handle) == RetryStatistics(calls=1, conflicts=1, retries=1)
        with pytest.raises(AttributeError):
            before.calls = 5  # type: ignore[misc]

    async def test_each_decoration_has_its_own_statistics(self) -> None:
        first = decorated(Flaky(1), wait=0.0, attempts=2)
        second = decorated(Flaky(0), wait=0.0, attempts=2)
        await first()
        await second()
        assert statistics_of(first).conflicts == 1
        assert statistics_of(second).conflicts == 0


class TestLogging:
    async def test_each_retry_and_the_exhaustion_name_function_key_and_execution(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")

        @retry_on_lock_conflict(wait=0.0, attempts=3, on_exhaustion="drop")
        async def handle_instagram_event() -> None:
            raise conflict()

        await handle_instagram_event()
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 4  # 2 retries, the exhaustion, the drop warning
        assert all("handle_instagram_event" in m and KEY in m for m in messages)
        assert "execution 1 of 3" in messages[0]
        assert "execution 2 of 3" in messages[1]
        assert "execution 3 of 3" in messages[2]
        assert "exhausted" in messages[2]
        assert [getattr(r, "executions", None) for r in caplog.records[:3]] == [1, 2, 3]


class TestDemo:
    async def test_the_demo_retry_section_shows_duplicates_losses_and_neither(self) -> None:
        result = await run_demo("memory://", tasks=20, contacts=5, gap=0.02)
        by_variant = {t.variant: t for t in result.storms}
        assert list(by_variant) == ["no lock", "lock, no retry", "lock + retry"]
        assert by_variant["no lock"].duplicates == 15
        assert by_variant["lock, no retry"].lost == 15
        assert by_variant["lock, no retry"].duplicates == 0
        retried = by_variant["lock + retry"]
        assert (retried.duplicates, retried.lost, retried.processed_twice) == (0, 0, 0)
        assert retried.retry is not None
        assert retried.retry.processed_without_lock > 0
        text = format_result(result)
        assert "lock + retry_on_lock_conflict" in text
        assert "no message lost (no retry: 15 dropped)" in text

    async def test_the_demo_can_skip_the_retry_section(self) -> None:
        result = await run_demo("memory://", tasks=4, contacts=2, gap=0.0, retry=False)
        assert result.storms == ()
        assert "retry_on_lock_conflict" not in format_result(result)
