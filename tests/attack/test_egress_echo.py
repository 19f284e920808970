"""A host that a secret is bound to echoes it back, in every part of a raw HTTP response it controls.

Each case is a real response from a raw TCP server on loopback, sent through the real forwarder: the secret must
come back as its placeholder (or the response be refused), whatever part of the response carries it and however
its body is framed or encoded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from yarl import URL

from switchboard.egress.forward import Outcome
from tests.egress.conftest import PUBLIC, SECRET_VALUE, make_world

__all__ = ["make_world"]

SECRET = SECRET_VALUE.encode()


def _chunked(body: bytes, size: int = 7) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size))


def _plain(body: bytes, *head: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in head) + b"content-length: %d\r\n\r\n" % len(body) + body
    )


RESPONSES: dict[str, bytes] = {
    "reason phrase": b"HTTP/1.1 200 " + SECRET + b"\r\ncontent-length: 2\r\n\r\nok",
    "header name": _plain(b"ok", b"x-" + SECRET + b": 1"),
    "set-cookie base64": _plain(b"ok", b"set-cookie: s=" + base64.b64encode(b"u:" + SECRET) + b"; Path=/"),
    "location hex": _plain(b"ok", b"location: https://api.example.test/?t=" + SECRET.hex().upper().encode()),
    "location percent": _plain(b"ok", b"location: /x?t=" + SECRET.replace(b"-", b"%2d").replace(b"_", b"%5F")),
    "early hints": b"HTTP/1.1 103 Early Hints\r\nlink: </" + SECRET + b">; rel=preload\r\n\r\n" + _plain(b"ok"),
    "body split across chunks": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    + _chunked(b"token=" + SECRET)
    + b"0\r\n\r\n",
    "chunked trailer": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-t\r\n\r\n"
    + _chunked(b"ok")
    + b"0\r\nx-t: "
    + SECRET
    + b"\r\n\r\n",
    "http/1.0 read to close": b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\n" + SECRET.swapcase(),
    "GZIP upper case": _plain(gzip.compress(SECRET), b"Content-Encoding: GZIP"),
    "gzip with spaces": _plain(gzip.compress(SECRET), b"content-encoding:  gzip "),
    "gzip, identity": _plain(gzip.compress(SECRET), b"content-encoding: gzip, identity"),
    "two content-encoding headers": _plain(
        zlib.compress(gzip.compress(SECRET)), b"content-encoding: gzip", b"content-encoding: deflate"
    ),
    "transfer-encoding gzip": b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
    + _chunked(gzip.compress(SECRET))
    + b"0\r\n\r\n",
}


async def _serve_raw(answer: bytes) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, PUBLIC, 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def raw_world(make_world: Callable[..., Any]) -> AsyncIterator[Callable[[bytes], Any]]:
    servers: list[asyncio.Server] = []

    async def ask(answer: bytes) -> Outcome:
        server, port = await _serve_raw(answer)
        servers.append(server)
        world = await make_world(SWITCHBOARD_EGRESS__PORTS=f"80,443,{port}")
        url = URL(f"http://api.example.test:{port}/echo")  # a host GITHUB_TOKEN is bound to
        return await world.forwarder.forward(world.grant, "GET", url, [("accept", "*/*")], b"")

    yield ask
    for server in servers:
        server.close()


@pytest.mark.parametrize("case", list(RESPONSES))
async def test_no_part_of_a_bound_hosts_response_carries_the_secret(
    raw_world: Callable[[bytes], Any], case: str
) -> None:
    outcome: Outcome = await raw_world(RESPONSES[case])
    if outcome.refused is not None:
        assert case != "transfer-encoding gzip", outcome  # decoded like a content coding, not refused
        return  # refused as a whole: nothing of it reaches the sandbox
    shown = [outcome.reason.encode("latin-1")]
    shown += [f"{name}: {value}".encode("latin-1") for name, value in outcome.headers]
    shown.append(outcome.body)
    for undo in (gzip.decompress, zlib.decompress):  # what a client could still undo itself
        with contextlib.suppress(OSError, zlib.error, EOFError):
            shown.append(undo(outcome.body))
    everything = b"\n".join(shown)
    for form in (SECRET, SECRET.hex().encode(), base64.b64encode(b"u:" + SECRET)):
        assert form.lower() not in everything.lower(), (case, outcome)
