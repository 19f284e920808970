"""The egress bridge inside a sandbox: TCP ``127.0.0.1:PORT`` to the host proxy's unix socket (stdlib only).

A sandbox has no network: its network namespace holds only loopback, and the host's egress proxy is reachable
only as a unix socket bound into it. Programs expect an HTTP proxy at a TCP address (``HTTP_PROXY``), so before
the command starts ``python -I -S bridge.py SOCKET PORT`` listens on loopback, forks a server that copies bytes
both ways between each accepted connection and a fresh connection to ``SOCKET``, and exits — the command starts
only once the port listens. The server dies with the sandbox.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import sys

__all__ = ["main", "serve"]

_CHUNK = 65536


def _close(selector: selectors.BaseSelector, peers: dict[socket.socket, socket.socket], sock: socket.socket) -> None:
    other = peers.pop(sock, None)
    for each in (sock, other):
        if each is None:
            continue
        peers.pop(each, None)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(each)
        each.close()


def serve(server: socket.socket, target: str) -> None:
    """Accept on ``server`` forever, joining each connection to a new connection to the unix socket ``target``."""
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ)
    peers: dict[socket.socket, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is server:
                client, _ = server.accept()
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    upstream.connect(target)
                except OSError:
                    client.close()
                    upstream.close()
                    continue
                peers[client], peers[upstream] = upstream, client
                selector.register(client, selectors.EVENT_READ)
                selector.register(upstream, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(_CHUNK)
                if data:
                    peers[sock].sendall(data)
                    continue
            except OSError:
                pass
            _close(selector, peers, sock)


def main(argv: list[str]) -> int:
    """Listen on ``127.0.0.1:PORT``, fork the server, and return once it is ready (exit status 0)."""
    target, port = argv[0], int(argv[1])
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", port))
    server.listen(64)
    if os.fork() > 0:
        return 0
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the command's output pipes are not held open by the bridge
        os.dup2(null, fd)
    serve(server, target)
    return 0


if __name__ == "__main__":  # pragma: no cover - runs in the sandbox
    sys.exit(main(sys.argv[1:]))
