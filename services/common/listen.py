"""Whether the process can listen where its settings say, asked before it binds: a
taken port (a second `make run`) or a host that is not this one's is one line naming
the variable to change, rather than a server library's own error and a traceback."""

from __future__ import annotations

import errno
import os
import socket


class ListenError(OSError):
    """An address the process cannot listen on, said in one line that names the variable
    that sets it (a second `make run` on the same port, a host that is not this one's)."""

    def __init__(self, address: str, variable: str, cause: str) -> None:
        self.address = address
        self.variable = variable
        super().__init__(
            f"cannot listen on {address} ({variable}): {cause}; stop what listens there, "
            f"or set {variable} to another host:port"
        )


def check_listen(address: str, variable: str) -> None:
    """Fail with ListenError now if `address` cannot be bound (port 0 always can).

    Asked before gRPC binds, so that a taken port is one line here rather than gRPC's
    own error log and a traceback; gRPC's bind failing anyway (a race) is mapped too.
    """
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ListenError(address, variable, f"unknown host ({exc.strerror})") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As gRPC's own listener does: a port whose last connections linger in TIME_WAIT
        # is free to take.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise ListenError(address, variable, bind_cause(exc)) from None


def bind_cause(exc: OSError) -> str:
    """Why a bind failed, in words."""
    if exc.errno == errno.EADDRINUSE:
        return "the address is already in use (another server?)"
    return os.strerror(exc.errno) if exc.errno else str(exc)
