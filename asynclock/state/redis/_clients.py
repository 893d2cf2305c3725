"""redis-py clients from URLs, and the transport for a client: RedisState's construction.

:func:`client_from_url` builds what :meth:`RedisState.from_url
<asynclock.state.redis.RedisState.from_url>` hands to the state: a ``Redis`` (plain or from
``Sentinel.master_for``) or a ``RedisCluster``, with redis-py's own retries and per-read
timeouts off (the state bounds each operation itself), every option checked before anything
connects. :func:`transport_for` picks the transport by the client's type, once; ``Redis`` and
``RedisCluster`` are unrelated classes in redis-py, and so are their transports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.retry import Retry

from asynclock.state._url import StateURL, redact
from asynclock.state.redis._cluster import startup_nodes
from asynclock.state.redis._cluster_transport import ClusterTransport
from asynclock.state.redis._plain import PlainTransport
from asynclock.state.redis._sentinel import SentinelTransport, parse_sentinel_url

if TYPE_CHECKING:
    from collections.abc import Callable

    from asynclock.state.redis._transport import Transport

__all__ = ["client_from_url", "transport_for"]


def transport_for(client: object, *, replicas: int, op_timeout: float) -> Transport:
    """The transport of ``client``: cluster, Sentinel or one server (by its type).

    ``op_timeout``: the bound of a Sentinel lookup. ``TypeError`` for anything but a
    redis.asyncio client; ``ValueError`` for ``replicas`` on a cluster (no WAIT there).
    """
    if isinstance(client, RedisCluster):
        if replicas:
            raise ValueError("replicas=N is not supported on Redis Cluster")
        size = _pool_size(client.connection_kwargs.get("max_connections"))
        return ClusterTransport(client, size, f"Redis Cluster at {describe(client)}")
    if isinstance(client, Redis):
        pool = client.connection_pool
        size = _pool_size(getattr(pool, "max_connections", None))
        if isinstance(pool, SentinelConnectionPool):
            return SentinelTransport(pool, size, op_timeout)
        return PlainTransport(client, size, f"Redis at {describe(client)}")
    raise TypeError(
        f"client must be a redis.asyncio Redis or RedisCluster, got {type(client).__name__}"
    )


def client_from_url(
    url: str,
    *,
    connect_timeout: float,
    op_timeout: float | None,
    max_connections: int,
    replicas: int,
) -> tuple[Redis | RedisCluster, str]:
    """The client for ``url`` (any scheme of :meth:`RedisState.from_url`), and where it points
    (redacted). ``ValueError`` naming the URL (redacted) if it is malformed."""
    scheme = StateURL(url).scheme
    if scheme == "redis+sentinel":
        return _sentinel_client(url, connect_timeout, max_connections)
    if scheme == "redis+cluster":
        if replicas:
            raise ValueError("replicas=N is not supported on Redis Cluster")
        return _cluster_client(url, connect_timeout, max_connections)
    return _plain_client(url, connect_timeout, op_timeout, max_connections)


def _plain_client(
    url: str, connect_timeout: float, op: float | None, max_connections: int
) -> tuple[Redis, str]:
    """A client for ``redis://``, ``rediss://`` or ``unix://``, and where it points."""
    try:
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=op,
            socket_connect_timeout=connect_timeout,
            socket_timeout=None,
            retry=_no_retries(),
        )
    except ValueError as exc:
        raise ValueError(f"invalid Redis URL {redact(url)!r}: {exc}") from None
    _check_connection_options(url, pool)
    return Redis(connection_pool=pool), f"Redis at {redact(url)}"


def _sentinel_client(url: str, connect_timeout: float, max_connections: int) -> tuple[Redis, str]:
    """``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?options]``.

    The host:port pairs are sentinels; the credentials, database and options are the
    master's, except ``sentinel_username`` and ``sentinel_password`` (the sentinels' own
    AUTH). Nothing connects before the first operation.
    """
    try:
        sentinels, service, data_url, _ = parse_sentinel_url(url)
        pool = BlockingConnectionPool.from_url(data_url)
    except ValueError as exc:
        raise ValueError(f"invalid Redis Sentinel URL {redact(url)!r}: {exc}") from None
    kwargs = dict(pool.connection_kwargs)
    for name in ("host", "port"):
        kwargs.pop(name, None)
    sentinel_kwargs: dict[str, object] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": connect_timeout,
        "retry": _no_retries(),
    }
    for name in ("sentinel_username", "sentinel_password"):
        value = kwargs.pop(name, None)
        if value is not None:
            sentinel_kwargs[name.removeprefix("sentinel_")] = value
    kwargs.pop("connection_class", None)
    try:
        pool.connection_class(**kwargs)  # no I/O: only checks the keywords
    except TypeError as exc:
        raise ValueError(f"invalid Redis Sentinel URL {redact(url)!r}: {exc}") from None
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        sentinels,
        sentinel_kwargs=sentinel_kwargs,
        **{**kwargs, "socket_connect_timeout": connect_timeout, "socket_timeout": None},
    )
    client = sentinel.master_for(service, max_connections=max_connections)
    return client, f"Redis Sentinel service {service!r} at {redact(url)}"


def _cluster_client(
    url: str, connect_timeout: float, max_connections: int
) -> tuple[RedisCluster, str]:
    """``redis+cluster://[user:password@]host:port[,host:port...]``: any node(s) of the cluster.

    ``max_connections`` is per master. Nothing connects before the first operation.
    """
    rest = url.partition("://")[2]
    userinfo, _, hosts = rest.rpartition("@")
    hosts, _, query = hosts.partition("?")
    hosts = hosts.split("/", 1)[0]
    nodes = [part.strip() for part in hosts.split(",") if part.strip()]
    if not nodes:
        raise ValueError(f"invalid Redis Cluster URL {redact(url)!r}: no host:port")
    first = f"redis://{userinfo + '@' if userinfo else ''}{nodes[0]}"
    try:
        from redis.asyncio.cluster import ClusterNode

        startup = []
        for node in nodes:
            host, sep, port = node.rpartition(":")
            if not sep:
                host, port = node, "6379"
            startup.append(ClusterNode(host.strip("[]") or "127.0.0.1", int(port)))
        client = RedisCluster.from_url(
            first + (f"?{query}" if query else ""),
            startup_nodes=startup[1:],
            max_connections=max_connections,
            socket_connect_timeout=connect_timeout,
            socket_timeout=None,
            retry=_no_retries(),
        )
    except (ValueError, redis_errors.RedisClusterException) as exc:
        raise ValueError(f"invalid Redis Cluster URL {redact(url)!r}: {exc}") from None
    return client, f"Redis Cluster at {redact(url)}"


def _check_connection_options(url: str, pool: BlockingConnectionPool) -> None:
    """Reject what redis-py would only fail on at the first command: an unknown ``?option``
    (a TypeError from the connection class) or a database that is not a number >= 0."""
    kwargs = pool.connection_kwargs
    try:
        pool.connection_class(**kwargs)  # no I/O: only checks the keywords
    except TypeError as exc:
        raise ValueError(f"invalid Redis URL {redact(url)!r}: {exc}") from None
    path = urlsplit(url).path.strip("/") if StateURL(url).scheme != "unix" else ""
    db = kwargs.get("db", 0)
    if (path and not path.isdigit()) or not isinstance(db, int) or db < 0:
        raise ValueError(
            f"invalid Redis URL {redact(url)!r}: the database must be a number >= 0, "
            f"got {path or db!r}"
        )


def _no_retries() -> Retry:
    """redis-py's own retries off: RedisState bounds every operation with its own deadline."""
    # redis-py 5.0 leaves Retry and NoBackoff unannotated; called through Callable types the
    # calls are typed on every version of the declared range
    make_retry = cast("Callable[[object, int], Retry]", Retry)
    make_backoff = cast("Callable[[], object]", NoBackoff)
    return make_retry(make_backoff(), 0)


def _pool_size(size: object) -> int:
    return size if isinstance(size, int) and 0 < size < 2**31 else 50


def describe(client: Redis | RedisCluster) -> str:
    """Where ``client`` points, without secrets: ``host:port/db``, a socket, or the nodes."""
    if isinstance(client, RedisCluster):
        return ",".join(node.name for node in startup_nodes(client))
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
