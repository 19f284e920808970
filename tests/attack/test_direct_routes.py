"""Hostile HTTP against the webhook hot path (direct routes, fixed answers, the body taken as it arrived).

Every attack goes over a real socket to the real app (``create_app``) served by :class:`GuardedAppRunner`, as
``switchboard web`` serves it. Where a direct route could answer differently from aiohttp's own dispatcher, the same
request is also sent to the same app served by aiohttp's plain ``AppRunner`` (no shortcut at all), and the two must
agree: a shortcut may only be faster, never different.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis
from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from switchboard import tracing
from switchboard.channels.slack.fake.payloads import sign_request
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update, sign_update
from switchboard.settings import HttpSettings, load_settings
from switchboard.web.app import create_app
from switchboard.web.server import FixedResponse, GuardedAppRunner
from tests.channels.slack_support import BOT_TOKEN as SLACK_TOKEN
from tests.channels.slack_support import SECRET as SLACK_SECRET

GUARD_S = 10.0
"""Only a guard against a hanging test."""
SECRET = "direct_route-secret-42"
MAX_BODY = 4096
BODY_TIMEOUT_S = 0.4
_ids = itertools.count(700_000)


def _update_id() -> int:
    return next(_ids)


@pytest.fixture
async def platforms() -> AsyncIterator[tuple[FakeTelegram, FakeSlack]]:
    async with FakeTelegram(token="42:direct") as telegram, FakeSlack(bot_token=SLACK_TOKEN) as slack:
        yield telegram, slack


@pytest.fixture
def env(base_env: dict[str, str], platforms: tuple[FakeTelegram, FakeSlack]) -> dict[str, str]:
    telegram, slack = platforms
    return base_env | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:direct",
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
        "SWITCHBOARD_SLACK__BOT_TOKEN": SLACK_TOKEN,
        "SWITCHBOARD_SLACK__SIGNING_SECRET": SLACK_SECRET,
        "SWITCHBOARD_SLACK__API_BASE_URL": slack.api_url,
        "SWITCHBOARD_QUEUE__MAX_BODY_BYTES": str(MAX_BODY),
        "SWITCHBOARD_QUEUE__INGEST_TIMEOUT_S": "2.0",
    }


@asynccontextmanager
async def _served(
    env: dict[str, str],
    *,
    plain: bool = False,
    http: HttpSettings | None = None,
    tweak: Callable[[web.Application], None] | None = None,
) -> AsyncIterator[tuple[int, web.BaseRunner]]:
    """The gateway app on a free port: through GuardedAppRunner, or aiohttp's own runner (``plain``)."""
    app = create_app(load_settings(env), listeners=False)
    if tweak is not None:
        tweak(app)
    runner: web.BaseRunner
    if plain:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, auto_decompress=False)
    else:
        http = http or HttpSettings(body_timeout_s=BODY_TIMEOUT_S, header_timeout_s=2.0)
        runner = GuardedAppRunner(app, http, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], runner
    finally:
        await runner.cleanup()


@pytest.fixture
async def port(env: dict[str, str]) -> AsyncIterator[int]:
    async with _served(env) as (bound, _):
        yield bound


def _signed(text: str = "hi", update_id: int | None = None) -> bytes:
    """A valid signed Telegram update (a fresh update id unless given), as its body bytes."""
    body, _ = sign_update(make_update(text, chat_id=5, update_id=update_id or _update_id()), SECRET)
    return body


def _post(
    path: str = "/webhooks/telegram",
    body: bytes | None = None,
    *,
    version: str = "1.1",
    extra: str = "",
    secret: str = SECRET,
    method: str = "POST",
) -> bytes:
    body = _signed() if body is None else body
    head = (
        f"{method} {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Telegram-Bot-Api-Secret-Token: {secret}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


class Answer:
    """One HTTP response read off the wire."""

    def __init__(self, status_line: bytes, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status_line = status_line
        self.headers = headers
        self.body = body

    @property
    def status(self) -> int:
        return int(self.status_line.split(b" ")[1])

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def __repr__(self) -> str:
        return f"<Answer {self.status_line!r} {self.headers} {self.body[:80]!r}>"


async def _read_answer(reader: asyncio.StreamReader, *, head_request: bool = False) -> Answer:
    async with asyncio.timeout(GUARD_S):
        head = await reader.readuntil(b"\r\n\r\n")
        status, *lines = head[:-4].split(b"\r\n")
        assert re.fullmatch(rb"HTTP/1\.[01] \d{3} [^\r\n]*", status), status
        headers = []
        for line in lines:
            assert b": " in line, line
            key, value = line.split(b": ", 1)
            headers.append((key.decode("latin-1"), value.decode("latin-1")))
        lengths = [v for k, v in headers if k.lower() == "content-length"]
        assert len(lengths) <= 1, headers
        body = b"" if head_request or not lengths else await reader.readexactly(int(lengths[0]))
    return Answer(status, headers, body)


async def _closed_after(reader: asyncio.StreamReader, wait: float = 0.3) -> bool:
    try:
        async with asyncio.timeout(wait):
            return await reader.read(1) == b""
    except TimeoutError:
        return False


@asynccontextmanager
async def _connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def _exchange(port: int, request: bytes, **kwargs: Any) -> tuple[Answer, bool]:
    async with _connection(port) as (reader, writer):
        writer.write(request)
        answer = await _read_answer(reader, **kwargs)
        return answer, await _closed_after(reader)


def _inbox_total(r: redis.Redis) -> int:
    return sum(int(r.llen(key)) for key in r.keys("sb:*:inbox"))


def _no_errors(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [(r.name, r.getMessage()) for r in bad]


# --- pipelining, versions and keep-alive ------------------------------------------------------------------------------


async def test_pipelined_direct_and_routed_requests_are_answered_in_order(
    port: int, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Five requests in one write on one connection: direct, routed, refused, routed-by-account, direct."""
    before = _inbox_total(sync_redis)
    requests = [
        _post(),  # direct: 200
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",  # routed
        _post(secret="wrong"),  # direct: 401
        _post("/webhooks/telegram/default"),  # routed to the same handler by the dispatcher
        _post(body=b"{not json"),  # direct: 400
        _post(),  # direct: 200 again on the same connection
    ]
    async with _connection(port) as (reader, writer):
        writer.write(b"".join(requests))
        answers = [await _read_answer(reader) for _ in requests]
        assert not await _closed_after(reader)
    assert [a.status for a in answers] == [200, 200, 403, 200, 400, 200], answers
    assert answers[0].body == b'{"ok":true}' and answers[5].body == b'{"ok":true}'
    assert json.loads(answers[2].body)["error"]["code"] == "bad_signature"
    assert _inbox_total(sync_redis) == before + 3
    _no_errors(caplog)


@pytest.mark.parametrize(
    ("version", "connection", "kept", "connection_header"),
    [
        ("1.1", "", True, []),
        ("1.1", "Connection: close\r\n", False, ["close"]),
        ("1.1", "Connection: keep-alive\r\n", True, []),
        ("1.0", "", False, []),
        ("1.0", "Connection: keep-alive\r\n", True, ["keep-alive"]),
        ("1.0", "Connection: close\r\n", False, []),
    ],
)
async def test_http_versions_and_connection_choices_are_honoured(
    port: int, version: str, connection: str, kept: bool, connection_header: list[str]
) -> None:
    answer, closed = await _exchange(port, _post(version=version, extra=connection))
    assert answer.status == 200
    assert answer.status_line.startswith(f"HTTP/{version} 200 OK".encode())
    assert answer.header("Connection") == connection_header
    assert closed is not kept
    assert len(answer.header("Date")) == 1 and len(answer.header("Server")) == 1


async def test_a_kept_http10_connection_serves_a_second_request(port: int) -> None:
    async with _connection(port) as (reader, writer):
        for _ in range(2):
            writer.write(_post(version="1.0", extra="Connection: keep-alive\r\n"))
            answer = await _read_answer(reader)
            assert answer.status == 200 and answer.header("Connection") == ["keep-alive"]
        writer.write(_post(version="1.0"))  # no keep-alive: the last one
        assert (await _read_answer(reader)).status == 200
        assert await _closed_after(reader, 2.0)


async def test_expect_100_continue_is_answered_then_the_body_is_taken(port: int, sync_redis: redis.Redis) -> None:
    before = _inbox_total(sync_redis)
    body = _signed()
    request = _post(body=body, extra="Expect: 100-continue\r\n")
    head = request[: -len(body)]
    async with _connection(port) as (reader, writer):
        writer.write(head)
        interim = await _read_answer(reader, head_request=True)
        assert interim.status == 100
        writer.write(body)
        answer = await _read_answer(reader)
    assert answer.status == 200 and answer.body == b'{"ok":true}'
    assert _inbox_total(sync_redis) == before + 1


# --- chunked bodies ---------------------------------------------------------------------------------------------------


def _chunked(body: bytes, *, size: int = 7, trailer: bytes = b"", end: bool = True) -> bytes:
    head = (
        "POST /webhooks/telegram HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Telegram-Bot-Api-Secret-Token: {SECRET}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)
    )
    return head + chunks + (b"0\r\n" + trailer + b"\r\n" if end else b"")


@pytest.mark.parametrize("trailer", [b"", b"X-Trailer: yes\r\n"])
async def test_a_valid_chunked_body_is_queued(port: int, sync_redis: redis.Redis, trailer: bytes) -> None:
    before = _inbox_total(sync_redis)
    answer, _ = await _exchange(port, _chunked(_signed(), trailer=trailer))
    assert answer.status == 200
    assert _inbox_total(sync_redis) == before + 1


@pytest.mark.parametrize("slow", [False, True])
async def test_an_oversized_chunked_body_is_413_and_writes_nothing(
    port: int, sync_redis: redis.Redis, slow: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """No Content-Length to refuse it by: whole (taken as it arrived) or still arriving (read), it is 413."""
    text = "x" * (MAX_BODY + 100)
    body = _signed(text)
    request = _chunked(body, size=1024)
    before = sorted(sync_redis.keys("*"))
    async with _connection(port) as (reader, writer):
        if slow:
            cut = len(request) // 3
            writer.write(request[:cut])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(request[cut:])
        else:
            writer.write(request)
        answer = await _read_answer(reader)
    assert answer.status == 413
    assert json.loads(answer.body)["error"]["code"] == "body_too_large"
    assert sorted(sync_redis.keys("*")) == before
    _no_errors(caplog)


async def test_a_truncated_chunked_body_is_closed_by_the_body_timeout(
    port: int, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    before = _inbox_total(sync_redis)
    request = _chunked(_signed(), end=False)
    async with _connection(port) as (reader, writer):
        writer.write(request[:-5])
        async with asyncio.timeout(BODY_TIMEOUT_S + 3):
            rest = await reader.read()  # the server closes it: nothing, or at most an error answer
    assert b" 200 " not in rest[:20]
    assert _inbox_total(sync_redis) == before
    _no_errors(caplog)


async def test_a_content_length_larger_than_the_body_is_closed_by_the_body_timeout(
    env: dict[str, str], sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    before = _inbox_total(sync_redis)
    body = _signed()
    request = _post(body=body).replace(b"Content-Length: %d" % len(body), b"Content-Length: %d" % (len(body) + 50))
    async with _served(env) as (port, runner):
        async with _connection(port) as (reader, writer):
            writer.write(request)
            async with asyncio.timeout(BODY_TIMEOUT_S + 3):
                rest = await reader.read()
        assert isinstance(runner, GuardedAppRunner) and runner.guard.total["slow_body"] == 1
    assert b" 200 " not in rest[:20]
    assert _inbox_total(sync_redis) == before
    _no_errors(caplog)


# --- the client that leaves -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_client_that_leaves_before_the_answer_leaves_no_error(
    port: int, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.DEBUG)
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", port))
        if how == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(_post())
        sock.close()
    await asyncio.sleep(0.5)
    answer, _ = await _exchange(port, _post())
    assert answer.status == 200
    _no_errors(caplog)


# --- methods and request targets --------------------------------------------------------------------------------------


async def test_head_and_options_on_a_direct_path_are_405_without_a_body(port: int) -> None:
    head, _ = await _exchange(port, _post(method="HEAD"), head_request=True)
    assert head.status == 405 and head.header("Allow") == ["POST"]
    async with _connection(port) as (reader, writer):
        writer.write(_post(method="HEAD") + _post())  # a HEAD answer has no body: the next answer must follow whole
        assert (await _read_answer(reader, head_request=True)).status == 405
        assert (await _read_answer(reader)).status == 200
    options, _ = await _exchange(port, _post(method="OPTIONS"))
    assert options.status == 405


async def test_a_lowercase_method_is_never_served_as_post(port: int, sync_redis: redis.Redis) -> None:
    before = _inbox_total(sync_redis)
    answer, _ = await _exchange(port, _post(method="post"))
    assert answer.status in (400, 405, 501)
    assert _inbox_total(sync_redis) == before


TARGETS = [
    "/webhooks/telegram",
    "/webhooks/telegram/",
    "//webhooks/telegram",
    "/webhooks//telegram",
    "/webhooks/%74elegram",
    "/webhooks/telegram?x=1",
    "/webhooks/telegram#x",
    "/webhooks%2Ftelegram",
    "/webhooks%2ftelegram",
    "%2Fwebhooks/telegram",
    "/webhooks/telegram%2F",
    "/webhooks/./telegram",
    "/x/../webhooks/telegram",
    "/webhooks/TELEGRAM",
    "/webhooks/telegram%00",
    "/webhooks/telegram;x",
    "http://h/webhooks/telegram",
    "http://h/webhooks%2Ftelegram",
    "http://h//webhooks/telegram",
    "*",
]


async def test_request_targets_are_answered_as_aiohttp_itself_answers_them(
    env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Each target to the gateway's runner and to aiohttp's plain runner of the same app: the same status."""
    results: dict[str, list[int]] = {}
    for plain in (False, True):
        async with _served(env, plain=plain) as (bound, _):
            for target in TARGETS:
                answer, _ = await _exchange(bound, _post(target))  # a fresh update each time: no deduplication
                results.setdefault(target, []).append(answer.status)
        if not plain:  # aiohttp's plain runner logs a bad target at ERROR; the gateway's runner must not
            _no_errors(caplog)
    differ = {target: statuses for target, statuses in results.items() if statuses[0] != statuses[1]}
    assert not differ, differ


# --- malformed framing ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: {n}\r\nContent-Length: {n}\r\n",
        "Content-Length: {n}\r\nContent-Length: 3\r\n",
        "Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n",
        "Content-Length: +{n}\r\n",
        "Content-Length: -1\r\n",
        "Transfer-Encoding: gzip, chunked\r\n",
    ],
)
async def test_ambiguous_framing_is_400_and_writes_nothing(
    port: int, sync_redis: redis.Redis, framing: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = _signed()
    head = (
        "POST /webhooks/telegram HTTP/1.1\r\nHost: x\r\n"
        f"X-Telegram-Bot-Api-Secret-Token: {SECRET}\r\n{framing.format(n=len(body))}\r\n"
    ).encode()
    before = sorted(sync_redis.keys("*"))
    async with _connection(port) as (reader, writer):
        writer.write(head + body)
        answer = await _read_answer(reader)
        assert await _closed_after(reader, 2.0)
    assert answer.status == 400
    assert sorted(sync_redis.keys("*")) == before
    _no_errors(caplog)


# --- many connections -------------------------------------------------------------------------------------------------


async def test_the_connection_cap_holds_and_the_direct_route_still_serves(
    env: dict[str, str], sync_redis: redis.Redis
) -> None:
    http = HttpSettings(max_connections=20, header_timeout_s=5.0, body_timeout_s=5.0)
    async with _served(env, http=http) as (port, runner):
        assert isinstance(runner, GuardedAppRunner)
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(60)]
        await asyncio.sleep(0.2)
        assert runner.guard.open_connections <= 20
        before = _inbox_total(sync_redis)

        async def one() -> int:
            answer, _ = await _exchange(port, _post())
            return answer.status

        statuses = await asyncio.gather(*(one() for _ in range(15)))
        assert statuses == [200] * 15
        assert _inbox_total(sync_redis) == before + 15
        assert runner.guard.total["shed"] >= 40
        for _, writer in idle:
            writer.close()


# --- shared fixed answers ---------------------------------------------------------------------------------------------


async def test_slack_challenges_each_get_their_own_body_and_the_cache_stays_bounded(port: int) -> None:
    async def challenge(token: str) -> Answer:
        body, headers = sign_request({"type": "url_verification", "token": "t", "challenge": token}, SLACK_SECRET)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() != "content-length")
        request = (
            f"POST /webhooks/slack HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        answer, _ = await _exchange(port, request)
        return answer

    tokens = [f"challenge-{i:04d}-" + "y" * (i % 50) for i in range(300)]
    for batch in range(0, len(tokens), 50):
        answers = await asyncio.gather(*(challenge(t) for t in tokens[batch : batch + 50]))
        for token, answer in zip(tokens[batch : batch + 50], answers, strict=True):
            assert answer.status == 200 and answer.body == token.encode()
            assert answer.header("Content-Type") == ["text/plain"]  # what aiohttp sends for a bytes body
    assert len(FixedResponse._cache) <= 256


# --- hooks and tracing ------------------------------------------------------------------------------------------------


async def test_response_prepare_hooks_see_every_webhook_answer(env: dict[str, str]) -> None:
    """An app with ``on_response_prepare`` hooks: every answer of a webhook goes through them, direct or routed."""

    def tweak(app: web.Application) -> None:
        async def tag(request: web.Request, response: web.StreamResponse) -> None:
            response.headers["X-Hooked"] = "1"

        app.on_response_prepare.append(tag)

    async with _served(env, tweak=tweak) as (port, _):
        for request in (_post(), _post(secret="wrong"), _post(body=b"{"), _post(body=b"x" * (MAX_BODY + 1))):
            answer, _ = await _exchange(port, request)
            assert answer.header("X-Hooked") == ["1"], answer


async def test_tracing_records_a_webhook_span_for_a_direct_route(env: dict[str, str]) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        async with _served(env) as (port, _):
            for request in (_post(), _post(secret="wrong")):
                await _exchange(port, request)
    finally:
        tracing.install(None)
        provider.shutdown()
    webhooks = [s for s in exporter.get_finished_spans() if s.name == "webhook"]
    statuses = sorted(int(str(s.attributes["http.response.status_code"])) for s in webhooks if s.attributes)
    assert statuses == [200, 403]
    assert all(s.attributes and s.attributes["switchboard.channel"] == "telegram" for s in webhooks)
