"""The webhook shortcuts of the web tier's server: direct routes and fixed answers, over real sockets.

A :class:`FixedResponse` must be what aiohttp itself would send for the same answer (status line, headers, body, and
whether the connection stays open), for every HTTP version and keep-alive choice a platform's client may make; a
direct route must serve only what the URL dispatcher would have sent to the same handler.
"""

from __future__ import annotations

import asyncio
import email.utils
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import HttpVersion, HttpVersion10, HttpVersion11, web
from aiohttp.test_utils import make_mocked_request

from switchboard.settings import HttpSettings
from switchboard.web.server import DIRECT_ROUTES, DirectHandler, FixedResponse, GuardedAppRunner, header_lines

GUARD_S = 5.0
"""Only a guard against a hanging test."""
ANSWERS = [
    (200, b'{"ok":true}', "application/json"),  # Telegram, the web chat
    (200, b"", None),  # Slack's empty 200
    (202, b"", None),  # Teams' accepted activity
    (200, b"challenge-1234", "text/plain"),  # a handshake echo
    (200, b'{"type":5}', "application/json"),  # Discord's deferred response
]
REQUESTS = [("1.1", None), ("1.1", "close"), ("1.0", None), ("1.0", "keep-alive")]


def _aiohttp_answer(status: int, body: bytes, content_type: str | None) -> web.Response:
    """The same answer as aiohttp builds it (the webhook route's path when it cannot use a fixed one)."""
    if content_type is None:
        response = web.Response(status=status, body=body or None)
        response.headers.pop("Content-Type", None)
        return response
    return web.Response(status=status, body=body, content_type=content_type)


async def _serve(app: web.Application) -> AsyncIterator[int]:
    runner = GuardedAppRunner(app, HttpSettings(), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def _exchange(port: int, request: bytes) -> tuple[bytes, list[tuple[str, str]], bytes, bool]:
    """Send ``request``; the status line, the headers in order, the body, and whether the server then closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        async with asyncio.timeout(GUARD_S):
            head = await reader.readuntil(b"\r\n\r\n")
        status, *lines = head[:-4].split(b"\r\n")
        headers = [(k.decode(), v.decode()) for k, v in (line.split(b": ", 1) for line in lines)]
        length = int(dict(headers).get("Content-Length", "0"))
        async with asyncio.timeout(GUARD_S):
            body = await reader.readexactly(length)
        try:
            async with asyncio.timeout(0.3):
                closed = await reader.read(1) == b""
        except TimeoutError:
            closed = False
        return status, headers, body, closed
    finally:
        writer.close()


def _request(method: str, path: str, version: str, connection: str | None, body: bytes = b"{}") -> bytes:
    head = f"{method} {path} HTTP/{version}\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    if connection is not None:
        head += f"Connection: {connection}\r\n"
    return head.encode() + b"\r\n" + body


@pytest.mark.parametrize(("version", "connection"), REQUESTS)
@pytest.mark.parametrize(("status", "body", "content_type"), ANSWERS)
async def test_a_fixed_answer_is_what_aiohttp_sends_for_it(
    version: str, connection: str | None, status: int, body: bytes, content_type: str | None
) -> None:
    async def fixed(request: web.Request) -> web.StreamResponse:
        answer = FixedResponse.of(request, status, body, content_type)
        assert answer is not None
        return answer

    async def plain(request: web.Request) -> web.StreamResponse:
        return _aiohttp_answer(status, body, content_type)

    app = web.Application()
    app.router.add_post("/fixed", fixed)
    app.router.add_post("/plain", plain)
    async for port in _serve(app):
        ours = await _exchange(port, _request("POST", "/fixed", version, connection))
        theirs = await _exchange(port, _request("POST", "/plain", version, connection))

    (our_status, our_headers, our_body, our_close), (status_line, their_headers, their_body, their_close) = ours, theirs
    assert our_status == status_line
    assert len(our_headers) == len(their_headers)  # no header twice, none missing
    assert {k: v for k, v in our_headers if k != "Date"} == {k: v for k, v in their_headers if k != "Date"}
    date = dict(our_headers)["Date"]
    assert email.utils.format_datetime(email.utils.parsedate_to_datetime(date), usegmt=True) == date
    assert (
        (our_body, our_close)
        == (their_body, their_close)
        == (body, connection == "close" or (version == "1.0" and connection is None))
    )


@pytest.mark.parametrize(("version", "connection"), REQUESTS)
async def test_a_one_off_answer_with_headers_is_what_aiohttp_sends_for_it(version: str, connection: str | None) -> None:
    headers = {"Access-Control-Allow-Origin": "*", "Access-Control-Max-Age": "600"}  # the web chat's 202

    async def once(request: web.Request) -> web.StreamResponse:
        answer = FixedResponse.once(request, 202, b'{"message_id":"0a1b"}', "application/json", header_lines(headers))
        assert answer is not None
        return answer

    async def plain(request: web.Request) -> web.StreamResponse:
        return web.Response(status=202, body=b'{"message_id":"0a1b"}', content_type="application/json", headers=headers)

    app = web.Application()
    app.router.add_post("/once", once)
    app.router.add_post("/plain", plain)
    async for port in _serve(app):
        ours = await _exchange(port, _request("POST", "/once", version, connection))
        theirs = await _exchange(port, _request("POST", "/plain", version, connection))
    assert ours[0] == theirs[0] and ours[2:] == theirs[2:]
    assert len(ours[1]) == len(theirs[1])
    assert {k: v for k, v in ours[1] if k != "Date"} == {k: v for k, v in theirs[1] if k != "Date"}
    with pytest.raises(ValueError, match="line break"):
        header_lines({"X-Evil": "a\r\nSet-Cookie: x"})


async def test_a_kept_connection_is_served_again_after_a_fixed_answer() -> None:
    async def fixed(request: web.Request) -> web.StreamResponse:
        answer = FixedResponse.of(request, 200, b'{"ok":true}', "application/json")
        assert answer is not None
        return answer

    app = web.Application()
    app.router.add_post("/fixed", fixed)
    async for port in _serve(app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request("POST", "/fixed", "1.1", None) * 3)  # pipelined: three answers, in order
        async with asyncio.timeout(GUARD_S):
            answers = [await reader.readuntil(b'{"ok":true}') for _ in range(3)]
        writer.close()
    assert all(answer.startswith(b"HTTP/1.1 200 OK\r\n") for answer in answers)


def test_fixed_answers_are_shared_per_answer_and_never_built_for_what_they_cannot_carry() -> None:
    def request(method: str, version: HttpVersion) -> web.BaseRequest:
        return make_mocked_request(method, "/", version=version)

    kept = request("POST", HttpVersion11)
    closed = request("POST", HttpVersion10)  # HTTP/1.0 without Connection: keep-alive
    one = FixedResponse.of(kept, 200, b'{"ok":true}', "application/json")
    assert FixedResponse.of(kept, 200, b'{"ok":true}', "application/json") is one
    assert FixedResponse.of(closed, 200, b'{"ok":true}', "application/json") is not one
    closed_empty = FixedResponse.of(closed, 200, b"", None)
    assert one is not None and one.keep_alive and closed_empty is not None and not closed_empty.keep_alive
    assert FixedResponse.of(kept, 202, b"", None) is not None
    assert FixedResponse.of(kept, 204, b"", None) is None and FixedResponse.of(kept, 304, b"", None) is None
    assert FixedResponse.of(kept, 101, b"", None) is None
    assert FixedResponse.of(request("HEAD", HttpVersion11), 200, b'{"ok":true}', "application/json") is None


def _app(*, middleware: bool = False) -> web.Application:
    async def direct(app: web.Application, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(text=f"direct {await request.text()}")

    async def routed(request: web.Request) -> web.StreamResponse:
        return web.Response(text=f"routed {request.method}")

    middlewares = []
    if middleware:

        @web.middleware
        async def tag(
            request: web.Request, handler: Callable[..., Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            return await handler(request)

        middlewares.append(tag)
    app = web.Application(middlewares=middlewares)
    routes: dict[str, DirectHandler] = {"/hook": direct}
    app[DIRECT_ROUTES] = routes
    app.router.add_route("*", "/hook", routed)
    app.router.add_route("*", "/hook/{account}", routed)
    return app


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        (_request("POST", "/hook", "1.1", "close", b"hi"), b"direct hi"),
        (_request("GET", "/hook", "1.1", "close", b""), b"routed GET"),
        (_request("PUT", "/hook", "1.1", "close", b""), b"routed PUT"),
        (_request("POST", "/hook/x", "1.1", "close", b""), b"routed POST"),
        (_request("POST", "/hook?x=1", "1.1", "close", b"q"), b"direct q"),  # the path, as the dispatcher sees it
        (  # an Expect handshake is the dispatcher's (it answers 100 Continue before the body comes)
            b"POST /hook HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n"
            b"Connection: close\r\n\r\nhi",
            b"routed POST",
        ),
    ],
)
async def test_a_direct_route_takes_only_a_plain_post_to_its_exact_path(request_bytes: bytes, expected: bytes) -> None:
    async for port in _serve(_app()):
        answer = await _until_closed(port, request_bytes)
    assert answer.endswith(b"\r\n\r\n" + expected), answer


async def test_an_app_with_middlewares_never_skips_them() -> None:
    async for port in _serve(_app(middleware=True)):
        answer = await _until_closed(port, _request("POST", "/hook", "1.1", "close", b"hi"))
    assert answer.endswith(b"\r\n\r\nrouted POST"), answer


async def _until_closed(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    async with asyncio.timeout(GUARD_S):
        answer = await reader.read(-1)
    writer.close()
    return answer
