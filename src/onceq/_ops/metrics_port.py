"""The metrics port, taken before anything else: a port in use refuses the run at once.

`bind_socket` is called synchronously by each command before it checks the queue,
opens the ledger or takes a delivery, so a port in use refuses the run with one line
and exit 4 (Conflict) and nothing is consumed or created. Kept apart from the server
(onceq._ops.metrics_server) so taking the port loads neither aiohttp nor prometheus_client.
"""

from __future__ import annotations

import errno
import socket

from onceq.errors import Conflict, UsageError

__all__ = ["bind_socket", "host_port"]


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or one line saying why not.

    In use → Conflict (exit 4): another process holds the port (often a second
    consumer started with the same --metrics-port). Any other refusal (an address
    that is not this host's, a port below 1024 without the right) → UsageError (2).
    """
    where = host_port(host, port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"{where}: cannot serve metrics: {exc.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # SO_REUSEADDR: a consumer restarted at once may bind again while the old
        # connections sit in TIME_WAIT; on Linux it never lets two listeners share a port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise Conflict(f"{where}: cannot serve metrics: the port is in use") from None
        raise UsageError(f"{where}: cannot serve metrics: {exc.strerror}") from None
    sock.setblocking(False)
    return sock
