"""Whether a TCP port can be listened on, asked before anything is started, so ``keyrange
serve`` on a port in use fails at once naming the port instead of after starting Postgres
and a broker (and leaving the user to read a bind error in the middle of their logs)."""

from __future__ import annotations

import errno
import socket


def port_problem(host: str, port: int) -> str | None:
    """Why nothing could listen on ``host:port`` now, or None when it is free.

    Bound the way servers bind (``SO_REUSEADDR``), so a port a stopped server left in
    TIME_WAIT counts as free, as it is for the server that binds it next.
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror}"
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use"
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None
