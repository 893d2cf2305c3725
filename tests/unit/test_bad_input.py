"""Bad input through the public API (issue #7), on MemoryState: it works or is refused clearly.

Hypothesis drives keys, TTLs, timeouts, URLs and Event payloads. For each value the rule of
``tests/security/_hostile.py`` says whether it must work; when it must not, the call raises a
``ValueError``/``TypeError`` whose message names the value, and afterwards nothing is held: the
key is free and a fresh acquire works. ``tests/conformance/test_hostile_input.py`` runs the key
and TTL properties on every backend.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asynclock import (
    AsyncLock,
    Deduper,
    Event,
    EventDispatcher,
    LockAcquisitionError,
    MemoryState,
    Outcome,
    StateUnavailableError,
    retry_on_lock_conflict,
    state_from_url,
)
from tests.security._hostile import (
    error_kind,
    key_is_valid,
    keys,
    names_value,
    non_str_keys,
    seconds,
    timeout_is_valid,
    ttl_is_valid,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from asynclock import State

SECRET = "hunter2-Secret"
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def raised(
    call: Callable[[], object], *also: type[Exception]
) -> ValueError | TypeError | Exception | None:
    """The ``ValueError``/``TypeError`` (or one of ``also``) that ``call()`` raised, or None."""
    catch: tuple[type[Exception], ...] = (ValueError, TypeError, *also)
    try:
        call()
    except catch as error:
        return error
    return None


def assert_refused(error: BaseException, kind: type[Exception], value: object, what: str) -> None:
    assert type(error) is kind or isinstance(error, kind), (type(error), error)
    message = str(error)
    assert names_value(message, value), f"{message!r} does not name {value!r}"
    assert what in message, f"{message!r} does not name the parameter {what!r}"


async def assert_free(state: MemoryState, key: str) -> None:
    """Nothing holds ``key`` and a fresh acquire/release works."""
    assert not await AsyncLock(state, key).locked()
    probe = AsyncLock(state, key, ttl=5.0)
    assert await probe.acquire(blocking=False)
    await probe.release()


# -- keys ---------------------------------------------------------------------------------------


class TestKeys:
    @FAST
    @given(key=keys())
    async def test_lock_key_works_or_is_refused_by_name(self, key: str) -> None:
        state = MemoryState()
        kind = error_kind(key, key_is_valid)
        if kind is not None:
            with pytest.raises(kind) as caught:
                AsyncLock(state, key)
            assert_refused(caught.value, kind, key, "key")
            assert state.size() == (0, 0)
            return
        lock = AsyncLock(state, key, ttl=5.0)
        assert repr(lock)  # never raises
        async with lock:
            held_inside = lock.owned
            assert await AsyncLock(state, key).locked()
            assert not await AsyncLock(state, key, ttl=5.0).acquire(blocking=False)
        assert (held_inside, lock.owned) == (True, False)
        await assert_free(state, key)

    @FAST
    @given(event_id=keys())
    async def test_dedupe_id_works_or_is_refused_by_name(self, event_id: str) -> None:
        state = MemoryState()
        dedupe = Deduper(state, ttl=5.0)
        kind = error_kind(event_id, key_is_valid)
        if kind is not None:
            for call in (dedupe.first_seen, dedupe.forget):
                with pytest.raises(kind) as caught:
                    await call(event_id)
                assert_refused(caught.value, kind, event_id, "event id")
            with pytest.raises(kind):
                async with dedupe.claim(event_id):
                    pytest.fail("entered a claim of an invalid id")
            assert state.size() == (0, 0)
            return
        assert await dedupe.first_seen(event_id)
        assert not await dedupe.first_seen(event_id)
        assert await dedupe.forget(event_id)
        async with dedupe.claim(event_id) as fresh:
            assert fresh
        assert not await dedupe.first_seen(event_id)

    @FAST
    @given(namespace=keys())
    def test_dedupe_namespace(self, namespace: str) -> None:
        kind = error_kind(namespace, key_is_valid)
        if kind is None:
            assert Deduper(MemoryState(), namespace=namespace).namespace == namespace
            return
        with pytest.raises(kind) as caught:
            Deduper(MemoryState(), namespace=namespace)
        assert_refused(caught.value, kind, namespace, "namespace")

    @settings(max_examples=60, deadline=None)
    @given(key=non_str_keys())
    async def test_non_str_keys_are_type_errors(self, key: object) -> None:
        state = MemoryState()
        anything: Any = key
        with pytest.raises(TypeError) as caught:
            AsyncLock(state, anything)
        assert_refused(caught.value, TypeError, key, "key")
        with pytest.raises(TypeError) as caught:
            await Deduper(state).first_seen(anything)
        assert_refused(caught.value, TypeError, key, "event id")
        assert state.size() == (0, 0)


# -- TTLs and timeouts --------------------------------------------------------------------------


class TestDurations:
    @FAST
    @given(ttl=seconds())
    async def test_lock_ttl(self, ttl: object) -> None:
        state = MemoryState()
        anything: Any = ttl
        kind = error_kind(ttl, ttl_is_valid)
        if kind is not None:
            with pytest.raises(kind) as caught:
                AsyncLock(state, "k", ttl=anything)
            assert_refused(caught.value, kind, ttl, "ttl")
            await assert_free(state, "k")
            return
        lock = AsyncLock(state, "k", ttl=anything)
        assert lock.ttl == float(anything)
        assert await lock.acquire(blocking=False)
        await release_unless_expired(lock)
        await assert_free(state, "k")

    @FAST
    @given(ttl=seconds())
    async def test_extend_ttl_never_corrupts_the_held_lock(self, ttl: object) -> None:
        state = MemoryState()
        anything: Any = ttl
        lock = AsyncLock(state, "k", ttl=30.0)
        assert await lock.acquire()
        kind = None if ttl is None else error_kind(ttl, ttl_is_valid)  # None: the lock's ttl
        if kind is not None:
            with pytest.raises(kind) as caught:
                await lock.extend(anything)
            assert_refused(caught.value, kind, ttl, "ttl")
            assert lock.owned  # the refused extend left the lock as it was
            assert await AsyncLock(state, "k").locked()
            await lock.release()
        else:
            await lock.extend(anything)
            await release_unless_expired(lock, None if ttl is None else float(anything))
        await assert_free(state, "k")

    @FAST
    @given(ttl=seconds())
    async def test_deduper_ttl(self, ttl: object) -> None:
        anything: Any = ttl
        kind = error_kind(ttl, ttl_is_valid)
        if kind is not None:
            with pytest.raises(kind) as caught:
                Deduper(MemoryState(), ttl=anything)
            assert_refused(caught.value, kind, ttl, "ttl")
            return
        dedupe = Deduper(MemoryState(), ttl=anything)
        assert await dedupe.first_seen("evt")
        assert await dedupe.forget("evt") or float(anything) < 0.5

    @FAST
    @given(timeout=seconds())
    async def test_constructor_timeout(self, timeout: object) -> None:
        state = MemoryState()
        anything: Any = timeout
        kind = error_kind(timeout, timeout_is_valid)
        if kind is not None:
            with pytest.raises(kind) as caught:
                AsyncLock(state, "k", timeout=anything)
            assert_refused(caught.value, kind, timeout, "timeout")
            return
        async with AsyncLock(state, "k", ttl=5.0, timeout=anything):
            pass
        await assert_free(state, "k")

    @FAST
    @given(timeout=seconds())
    async def test_acquire_timeout_on_a_busy_key(self, timeout: object) -> None:
        state = MemoryState()
        anything: Any = timeout
        holder = AsyncLock(state, "k", ttl=30.0)
        assert await holder.acquire()
        waiter = AsyncLock(state, "k", ttl=5.0)
        kind = error_kind(timeout, timeout_is_valid)
        if kind is not None:
            with pytest.raises(kind) as caught:
                await waiter.acquire(timeout=anything)
            assert_refused(caught.value, kind, timeout, "timeout")
        elif timeout is not None and float(anything) <= 0.01:
            with pytest.raises(LockAcquisitionError):
                await waiter.acquire(timeout=anything)
        else:  # a long wait: give up from outside, as a caller's own deadline would
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(waiter.acquire(timeout=anything), 0.01)
        assert not waiter.owned
        assert holder.owned
        await holder.release()
        await assert_free(state, "k")

    @settings(max_examples=80, deadline=None)
    @given(max_lifetime=seconds())
    def test_max_lifetime(self, max_lifetime: object) -> None:
        anything: Any = max_lifetime
        kind = error_kind(
            max_lifetime,
            lambda v: v is None or (timeout_is_valid(v, allow_none=False) and float(v) > 0),  # type: ignore[arg-type]
        )
        if kind is None:
            AsyncLock(MemoryState(), "k", auto_renew=True, max_lifetime=anything)
            return
        with pytest.raises(kind) as caught:
            AsyncLock(MemoryState(), "k", auto_renew=True, max_lifetime=anything)
        assert_refused(caught.value, kind, max_lifetime, "max_lifetime")

    @pytest.mark.parametrize("blocking", [None, 0, 1, "yes", "", [True]], ids=repr)
    def test_blocking_must_be_a_bool(self, blocking: object) -> None:
        anything: Any = blocking
        if blocking is None:
            with pytest.raises(TypeError, match="blocking must be a bool, got None"):
                AsyncLock(MemoryState(), "k", blocking=anything)
            return
        with pytest.raises(TypeError, match=re.escape(repr(blocking))):
            AsyncLock(MemoryState(), "k", blocking=anything)


async def release_unless_expired(lock: AsyncLock, ttl: float | None = None) -> None:
    """Release ``lock``; a TTL of a few milliseconds may have run out first (that is fine).

    ``ttl``: the TTL the lock was last given, when an ``extend`` changed it from ``lock.ttl``.
    """
    from asynclock import LockNotOwnedError

    try:
        await lock.release()
    except LockNotOwnedError:
        assert (lock.ttl if ttl is None else ttl) < 1.0, "a lock with a long TTL was lost"


# -- the dispatcher and retry options -----------------------------------------------------------


class TestDispatcherOptions:
    @FAST
    @given(value=seconds(), option=st.sampled_from(["lock_ttl", "dedupe_ttl"]))
    def test_ttls(self, value: object, option: str) -> None:
        kind = error_kind(value, ttl_is_valid)
        options: dict[str, Any] = {option: value}
        if kind is None:
            EventDispatcher(MemoryState(), **options)
            return
        with pytest.raises(kind) as caught:
            EventDispatcher(MemoryState(), **options)
        assert_refused(caught.value, kind, value, option)

    @FAST
    @given(value=seconds(), option=st.sampled_from(["debounce", "queue_timeout"]))
    def test_durations(self, value: object, option: str) -> None:
        # debounce: seconds >= 0; queue_timeout: seconds > 0, or None for no limit
        options: dict[str, Any] = {option: value}
        if option == "debounce":
            valid = timeout_is_valid(value, allow_none=False)
        else:
            valid = timeout_is_valid(value) and value != 0
        error = raised(lambda: EventDispatcher(MemoryState(), **options))
        if error is None:
            assert valid, f"{option}={value!r} was accepted"
            return
        assert not valid, (value, error)
        assert names_value(str(error), value), (str(error), value)
        assert option in str(error)

    @FAST
    @given(
        policy=st.one_of(st.text(max_size=10), st.none(), st.integers()),
        scope=st.one_of(st.text(max_size=10), st.none(), st.integers()),
    )
    def test_policy_and_scope_names(self, policy: object, scope: object) -> None:
        options: dict[str, Any] = {"on_lock_conflict": policy, "lock_scope": scope}
        valid_policy = policy in ("drop", "force", "queue", "latest", "debounce", "concurrent")
        valid_scope = scope in ("thread", "channel")
        if valid_policy and valid_scope:
            EventDispatcher(MemoryState(), **options)
            return
        with pytest.raises((ValueError, TypeError)) as caught:
            EventDispatcher(MemoryState(), **options)
        bad = policy if not valid_policy else scope
        assert names_value(str(caught.value), bad), str(caught.value)


class TestRetryOptions:
    @FAST
    @given(wait=seconds())
    def test_wait(self, wait: object) -> None:
        anything: Any = wait
        error = raised(lambda: retry_on_lock_conflict(wait=anything))
        if error is None:
            assert timeout_is_valid(wait, allow_none=False) or wait == "lock_ttl", wait
            return
        assert not timeout_is_valid(wait, allow_none=False), (wait, error)
        assert names_value(str(error), wait), (str(error), wait)

    @FAST
    @given(attempts=st.one_of(st.integers(-5, 10), st.floats(), st.text(max_size=3), st.none()))
    def test_attempts(self, attempts: object) -> None:
        anything: Any = attempts
        valid = isinstance(attempts, int) and not isinstance(attempts, bool) and attempts >= 1
        if valid:
            retry_on_lock_conflict(attempts=anything)
            return
        with pytest.raises((ValueError, TypeError)) as caught:
            retry_on_lock_conflict(attempts=anything)
        assert names_value(str(caught.value), attempts), str(caught.value)


# -- URLs ---------------------------------------------------------------------------------------

BAD_URLS = (
    "",
    "garbage",
    "://",
    "redis:/127.0.0.1:6379",
    "http://127.0.0.1:6379/0",
    "mongodb://h/db",
    "foo+bar://x",
    "\x00",
    "redis://127.0.0.1:notaport/0",
    "redis://127.0.0.1:99999/0",
    "redis://127.0.0.1:-1/0",
    "redis://127.0.0.1:6379/notadb",
    "redis://127.0.0.1:6379/-1",
    "redis://127.0.0.1:6379/0?no_such_option=1",
    "redis://127.0.0.1:6379/0?socket_timeout=abc",
    "redis://[::1/0",
    "rediss://127.0.0.1:xx/0",
    "postgresql://127.0.0.1:notaport/db",
    "postgresql://127.0.0.1:99999/db",
    "postgres://[::1/db",
    "postgresql://a:1,b:bad/db",
    "mysql://127.0.0.1:notaport/db",
    "mysql://127.0.0.1:99999/db",
    "mysql://127.0.0.1:3306/",
    "mysql://",
    "mysql://[::1/db",
)


def with_password(url: str) -> str:
    """``url`` with ``user:SECRET@`` in front of its host (when it has a ``//``)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}user:{SECRET}@{rest}" if sep and rest else url


class TestUrls:
    @pytest.mark.parametrize("url", BAD_URLS, ids=repr)
    async def test_bad_urls_are_value_errors_when_built(self, url: str) -> None:
        for candidate in (url, with_password(url)):
            with pytest.raises(ValueError) as caught:
                state_from_url(candidate)
            message = str(caught.value)
            assert SECRET not in message
            assert SECRET not in repr(caught.value)
            if caught.value.__cause__ is not None:
                assert SECRET not in str(caught.value.__cause__)
            assert "url" in message.lower() or "port" in message.lower(), message

    @pytest.mark.parametrize("url", [None, 6379, b"redis://127.0.0.1:6379/0", ["memory://"]])
    def test_non_str_urls_are_type_errors(self, url: object) -> None:
        anything: Any = url
        with pytest.raises(TypeError, match=type(url).__name__):
            state_from_url(anything)

    @settings(max_examples=200, deadline=None)
    @given(
        url=st.one_of(
            st.text(max_size=40),
            st.builds(
                lambda scheme, rest: f"{scheme}://{rest}",
                st.sampled_from(["redis", "rediss", "postgresql", "mysql", "memory", "nope"]),
                st.text(alphabet=st.sampled_from("ab1:@/?=&[]%-.\x00 é"), max_size=30),
            ),
        )
    )
    async def test_any_url_builds_or_raises_value_or_type_error(self, url: str) -> None:
        # Building never connects: it either gives a state (closed at once) or a clear error.
        secret_url = with_password(url)
        built: list[State] = []

        def build(candidate: str) -> None:
            built.append(state_from_url(candidate, **_short_timeouts(candidate)))

        for candidate in (url, secret_url):
            built.clear()
            # NotImplementedError: redis+cluster:// before issue #8
            error = raised(lambda c=candidate: build(c), NotImplementedError)  # type: ignore[misc]
            if error is not None:
                assert SECRET not in str(error), str(error)
            for state in built:
                assert SECRET not in repr(state)
                await state.aclose()

    async def test_missing_host_defaults_to_localhost_and_fails_cleanly(self) -> None:
        # "redis://" and "redis://:1/0" mean localhost (redis-py's rule); an unused port is
        # then a StateUnavailableError in time, never a hang or a driver error.
        state = state_from_url("redis://:1/0", connect_timeout=0.5, op_timeout=0.5)
        try:
            with pytest.raises(StateUnavailableError):
                await AsyncLock(state, "k").acquire()
        finally:
            await state.aclose()


def _short_timeouts(url: str) -> dict[str, object]:
    scheme = url.partition("://")[0].lower()
    if scheme in ("redis", "rediss", "unix", "postgresql", "postgres", "mysql"):
        return {"connect_timeout": 0.2, "op_timeout": 0.2}
    return {}


# -- events -------------------------------------------------------------------------------------

_FIELD = st.one_of(keys(), st.none(), st.integers(), st.binary(max_size=4))
_RAW = st.one_of(
    st.dictionaries(
        st.sampled_from(["event_id", "text", "user"]),
        st.one_of(keys(), st.integers(), st.none()),
        max_size=3,
    ),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.text(max_size=5),
)


def event_is_valid(fields: dict[str, object]) -> bool:
    for name in ("type", "adapter", "channel_id", "thread_id"):
        if not isinstance(fields[name], str):
            return False
    message_id = fields["message_id"]
    if message_id is not None and not isinstance(message_id, str):
        return False
    return isinstance(fields["raw"], dict)


def event_keys_valid(event: Event) -> bool:
    """Whether the keys the dispatcher derives from ``event`` are valid keys."""
    dedupe = event.dedupe_key
    return key_is_valid(event.thread_key) and (dedupe is None or key_is_valid(dedupe))


class TestEvents:
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        type_=st.one_of(st.sampled_from(["mention", "*", ""]), _FIELD),
        adapter=_FIELD,
        channel_id=_FIELD,
        thread_id=_FIELD,
        message_id=_FIELD,
        raw=_RAW,
    )
    async def test_event_payloads_dispatch_or_are_refused(
        self,
        type_: object,
        adapter: object,
        channel_id: object,
        thread_id: object,
        message_id: object,
        raw: object,
    ) -> None:
        fields: dict[str, Any] = {
            "type": type_,
            "adapter": adapter,
            "channel_id": channel_id,
            "thread_id": thread_id,
            "message_id": message_id,
            "raw": raw,
        }
        if not event_is_valid(fields):
            with pytest.raises(TypeError) as caught:
                Event(**fields)
            assert "Event." in str(caught.value)
            return
        event = Event(**fields)
        state = MemoryState()
        handled: list[Event] = []
        bot = EventDispatcher(state, raise_errors=True)

        @bot.on("*")
        async def handle(got: Event) -> None:
            handled.append(got)

        try:
            if not event_keys_valid(event):
                with pytest.raises(ValueError) as refused:
                    await bot.dispatch(event)
                message = str(refused.value)
                assert "\\x00" in message or "surrogate" in message or "Unicode" in message
                assert not handled
            else:
                assert await bot.dispatch(event) is Outcome.HANDLED
                assert handled == [event]
                again = await bot.dispatch(event)
                assert again is (Outcome.DUPLICATE if event.dedupe_key else Outcome.HANDLED)
                await assert_free(state, event.thread_key)
        finally:
            await bot.aclose()
        locks, _ = state.size()
        assert locks == 0, "a lock was left held"

    @pytest.mark.parametrize("event_id", [0, -1, 1.5, math.inf, b"\x00", ("a",), "0"], ids=repr)
    async def test_raw_event_id_of_any_type_becomes_a_string_key(self, event_id: object) -> None:
        event = Event("m", "slack", "C1", "T1", raw={"event_id": event_id})
        assert event.dedupe_key == str(event_id)
        bot = EventDispatcher(MemoryState())
        bot.on("*")(lambda _event: None)
        assert await bot.dispatch(event) is Outcome.HANDLED
        assert await bot.dispatch(event) is Outcome.DUPLICATE
        await bot.aclose()

    async def test_dispatch_refuses_what_is_not_an_event(self) -> None:
        bot = EventDispatcher(MemoryState())
        anything: Any = {"type": "mention"}
        with pytest.raises(TypeError, match="dict"):
            await bot.dispatch(anything)
        await bot.aclose()
