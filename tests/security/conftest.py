"""Fixtures of the security tests: throwaway Redis servers with an ACL user, or TLS only.

Without ``redis-server`` (or ``openssl`` for TLS) a test is skipped locally and fails in CI
(``CI=true``), like the backend matrix.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.security._servers import Certificates, SecureRedis
from tests.support.servers import require_binary

if TYPE_CHECKING:
    from collections.abc import Iterator

#: the ACL user of ``acl_redis`` and its password (the tests look for it in every output)
ACL_USER = "alice"
ACL_PASSWORD = "s3cret-Alice-7f3a"


#: why the tests need the programs they require
WHY = "the security tests start their own Redis servers"


@pytest.fixture
def acl_redis() -> Iterator[SecureRedis]:
    """A Redis whose only user is ``alice`` with a password (the default user is off)."""
    binary = require_binary("redis-server", WHY)
    server = SecureRedis(
        binary,
        *("--user", ACL_USER, "on", f">{ACL_PASSWORD}", "~*", "&*", "+@all"),
        *("--user", "default", "off"),
    )
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def certificates() -> Iterator[Certificates]:
    openssl = require_binary("openssl", WHY)
    with tempfile.TemporaryDirectory(prefix="asynclock-certs-") as folder:
        yield Certificates(openssl, Path(folder))


@pytest.fixture
def tls_redis(certificates: Certificates) -> Iterator[SecureRedis]:
    """A Redis that speaks TLS only (no plain port), with a certificate of ``certificates``."""
    binary = require_binary("redis-server", WHY)
    server = SecureRedis(binary, tls=certificates)
    try:
        yield server
    finally:
        server.close()
