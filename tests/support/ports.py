"""Loopback ports for the servers and apps the tests start themselves."""

from __future__ import annotations

import socket


def bound_socket() -> socket.socket:
    """A TCP socket bound to a free port on 127.0.0.1 (the caller listens on it, or hands it to
    a server, and closes it): the port cannot be taken by anyone else in between."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
    except BaseException:
        sock.close()
        raise
    return sock


def port_of(sock: socket.socket) -> int:
    """The port a socket is bound to."""
    port: int = sock.getsockname()[1]
    return port


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for a server started in
    another process, which binds it itself)."""
    with bound_socket() as sock:
        return port_of(sock)
