"""Redis with an ACL user and password, and Redis over TLS, on throwaway servers (issue #7)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock, Deduper, StateUnavailableError, state_from_url
from tests.security.conftest import ACL_PASSWORD, ACL_USER

if TYPE_CHECKING:
    from asynclock import State
    from tests.security._servers import Certificates, SecureRedis

pytestmark = [pytest.mark.security, pytest.mark.redis]

TIMEOUTS = {"connect_timeout": 2.0, "op_timeout": 2.0}


async def round_trip(state: State) -> None:
    """A lock and a dedupe record, end to end, including a second client's view."""
    async with AsyncLock(state, "security:lock", ttl=10.0) as lock:
        assert lock.owned
        assert await AsyncLock(state, "security:lock").locked()
        assert not await AsyncLock(state, "security:lock").acquire(blocking=False)
    assert not await AsyncLock(state, "security:lock").locked()
    dedupe = Deduper(state, ttl=10.0)
    assert await dedupe.first_seen("evt-1")
    assert not await dedupe.first_seen("evt-1")
    assert await dedupe.forget("evt-1")


def everything_said(error: BaseException, caplog: pytest.LogCaptureFixture) -> str:
    """The error's text and repr, its whole cause chain, and every captured log record."""
    parts: list[str] = []
    seen: BaseException | None = error
    while seen is not None:
        parts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    for record in caplog.records:
        parts.append(record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            parts.append(logging.Formatter().formatException(record.exc_info))
    return "\n".join(parts)


class TestAcl:
    async def test_user_and_password_in_the_url(self, acl_redis: SecureRedis) -> None:
        url = f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{acl_redis.port}/0"
        async with state_from_url(url, **TIMEOUTS) as state:
            assert ACL_PASSWORD not in repr(state)
            await round_trip(state)

    async def test_without_credentials_the_server_refuses(
        self, acl_redis: SecureRedis, caplog: pytest.LogCaptureFixture
    ) -> None:
        async with state_from_url(f"redis://127.0.0.1:{acl_redis.port}/0", **TIMEOUTS) as s:
            with pytest.raises(StateUnavailableError) as caught:
                await AsyncLock(s, "k").acquire()
            assert "auth" in everything_said(caught.value, caplog).lower()
            assert not await _locked_as_alice(acl_redis, "k")

    async def test_wrong_password_is_unavailable_and_never_shown(
        self, acl_redis: SecureRedis, caplog: pytest.LogCaptureFixture
    ) -> None:
        wrong = "Wr0ng-Passw0rd-91c2"
        url = f"redis://{ACL_USER}:{wrong}@127.0.0.1:{acl_redis.port}/0"
        caplog.set_level(logging.DEBUG)
        async with state_from_url(url, **TIMEOUTS) as state:
            assert wrong not in repr(state)
            with pytest.raises(StateUnavailableError) as caught:
                await AsyncLock(state, "k", ttl=5.0).acquire()
            with pytest.raises(StateUnavailableError):
                await Deduper(state).first_seen("evt")
        said = everything_said(caught.value, caplog)
        assert wrong not in said
        assert ACL_PASSWORD not in said
        assert "127.0.0.1" in str(caught.value), "the error names the server"


class TestTls:
    async def test_rediss_with_the_test_ca(
        self, tls_redis: SecureRedis, certificates: Certificates
    ) -> None:
        url = (
            f"rediss://127.0.0.1:{tls_redis.port}/0"
            f"?ssl_cert_reqs=required&ssl_ca_certs={certificates.ca_cert}"
        )
        async with state_from_url(url, **TIMEOUTS) as state:
            await round_trip(state)

    async def test_a_client_that_does_not_trust_the_ca_is_refused(
        self, tls_redis: SecureRedis, caplog: pytest.LogCaptureFixture
    ) -> None:
        # the system's CAs only: the test CA is unknown, so the handshake must fail
        url = f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_cert_reqs=required"
        caplog.set_level(logging.DEBUG)
        async with state_from_url(url, **TIMEOUTS) as state:
            with pytest.raises(StateUnavailableError) as caught:
                await AsyncLock(state, "k", ttl=5.0).acquire()
        text = everything_said(caught.value, caplog).lower()
        assert "certificate" in text or "ssl" in text, text[:500]

    async def test_plain_redis_to_a_tls_port_fails_cleanly(self, tls_redis: SecureRedis) -> None:
        async with state_from_url(f"redis://127.0.0.1:{tls_redis.port}/0", **TIMEOUTS) as s:
            with pytest.raises(StateUnavailableError):
                await AsyncLock(s, "k", ttl=5.0).acquire()


async def _locked_as_alice(server: SecureRedis, key: str) -> bool:
    url = f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{server.port}/0"
    async with state_from_url(url, **TIMEOUTS) as state:
        return await AsyncLock(state, key).locked()
