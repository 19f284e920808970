"""Attachment references as an attack: SSRF through ``url_private`` / CDN URLs / ``file_path``, a platform that
lies about a file's size, decompression bombs, and redirects that would carry the bot token elsewhere.

An "attacker" HTTP server records every request it gets (with its headers). The adapters either refuse a reference
before any request leaves, or fetch it from the platform's host only, never sending a token anywhere else, and
never reading past the cap.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from switchboard.channels.discord.adapter import DiscordChannel
from switchboard.channels.registry import BuildContext
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError
from tests.channels._discord_fixtures import TOKEN as DISCORD_TOKEN
from tests.channels._discord_fixtures import settings as discord_settings
from tests.channels.slack_support import BOT_TOKEN as SLACK_TOKEN
from tests.channels.slack_support import make_channel
from tests.channels.test_telegram import TOKEN as TELEGRAM_TOKEN
from tests.channels.test_telegram import settings as telegram_settings

LIMIT = 256 * 1024
BOMB = gzip.compress(b"\0" * (64 * 2**20), compresslevel=9)  # 64 MiB of zeros in about 64 KiB
SLACK_DM = ConversationRef(channel="slack", conversation="D0DIRECT")
DISCORD_DM = ConversationRef(channel="discord", conversation="300", extra={"channel_id": "300"})
TELEGRAM_DM = ConversationRef(channel="telegram", conversation="42")


@dataclass
class Attacker:
    """A server that records what reached it; ``url`` is its root."""

    url: str = ""
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    redirect_to: str = ""
    file_path: str = "documents/file_1.pdf"

    def tokens_seen(self) -> list[str]:
        return [
            f"{path} {headers}"
            for path, headers in self.seen
            if "Authorization" in headers
            or any(t in path + str(headers) for t in (SLACK_TOKEN, TELEGRAM_TOKEN, DISCORD_TOKEN))
        ]


def _attacker_app(attacker: Attacker) -> web.Application:
    async def anything(request: web.Request) -> web.StreamResponse:
        attacker.seen.append((request.path_qs, dict(request.headers)))
        path = request.path
        if path.endswith("/redirect"):
            raise web.HTTPFound(attacker.redirect_to)
        if path.endswith("/bomb"):
            return web.Response(body=BOMB, headers={"Content-Encoding": "gzip", "Content-Type": "application/pdf"})
        if path.endswith("/liar"):
            response = web.StreamResponse(headers={"Content-Type": "application/pdf"})
            await response.prepare(request)
            for _ in range(64):  # 4 MiB without a Content-Length
                await response.write(b"x" * 65536)
            await response.write_eof()
            return response
        if path.endswith("/getFile"):
            answer = {"ok": True, "result": {"file_id": "f", "file_size": 10, "file_path": attacker.file_path}}
            return web.json_response(answer)
        return web.Response(body=b"secret metadata", content_type="text/plain")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


@pytest.fixture
async def attacker() -> AsyncIterator[Attacker]:
    found = Attacker()
    server = TestServer(_attacker_app(found))
    await server.start_server()
    found.url = str(server.make_url("")).rstrip("/")
    yield found
    await server.close()


@pytest.fixture
async def second() -> AsyncIterator[Attacker]:
    found = Attacker()
    server = TestServer(_attacker_app(found))
    await server.start_server()
    found.url = str(server.make_url("")).rstrip("/")
    yield found
    await server.close()


def _document(ref: str, size: int | None = None) -> Attachment:
    return Attachment(kind="document", ref=ref, name="report.pdf", size=size)


@pytest.mark.parametrize(
    "ref",
    [
        "{attacker}/files/steal",
        "https://127.0.0.1/latest/meta-data",
        "https://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "https://files.slack.com.evil.example/x",
        "https://evil.example#.slack.com/x",
        "https://evil.example?.slack.com",
        "http://files.slack.com/files-pri/T1/F1/x",  # not https
        "file:///etc/passwd",
        "//files.slack.com/x",
    ],
)
async def test_slack_never_fetches_a_non_slack_reference(attacker: Attacker, second: Attacker, ref: str) -> None:
    adapter = make_channel(second.url + "/api/")  # the configured API host is another server
    try:
        with pytest.raises(AttachmentError):
            await adapter.fetch(_document(ref.format(attacker=attacker.url)), SLACK_DM, LIMIT)
    finally:
        await adapter.aclose()
    assert attacker.seen == [] and second.seen == []


async def test_a_slack_redirect_never_carries_the_bot_token_to_another_host(
    attacker: Attacker, second: Attacker
) -> None:
    attacker.redirect_to = second.url + "/collected"
    adapter = make_channel(attacker.url + "/api/")  # a file on the (configured) API host redirects elsewhere
    try:
        await adapter.fetch(_document(attacker.url + "/files/redirect"), SLACK_DM, LIMIT)
    except AttachmentError:
        pass
    finally:
        await adapter.aclose()
    assert len(attacker.seen) == 1 and SLACK_TOKEN in attacker.seen[0][1].get("Authorization", "")
    assert second.tokens_seen() == []


@pytest.mark.parametrize("path", ["/files/bomb", "/files/liar"])
async def test_slack_stops_at_the_cap_whatever_the_size_said(attacker: Attacker, path: str) -> None:
    adapter = make_channel(attacker.url + "/api/")
    try:
        with pytest.raises(AttachmentError) as caught:
            await adapter.fetch(_document(attacker.url + path, size=10), SLACK_DM, LIMIT)
    finally:
        await adapter.aclose()
    assert caught.value.too_large


@pytest.mark.parametrize(
    "ref",
    [
        "{attacker}/attachments/1/2/x.pdf",
        "https://cdn.discordapp.com.evil.example/attachments/1/2/x.pdf",
        "http://cdn.discordapp.com/attachments/1/2/x.pdf",
        "https://169.254.169.254/latest/meta-data",
        "https://evil.example#cdn.discordapp.com",
    ],
)
async def test_discord_fetches_only_from_its_cdn(attacker: Attacker, second: Attacker, ref: str) -> None:
    adapter = DiscordChannel(discord_settings(second.url + "/api/v10"), BuildContext(account="default"))
    try:
        with pytest.raises(AttachmentError):
            await adapter.fetch(_document(ref.format(attacker=attacker.url)), DISCORD_DM, LIMIT)
    finally:
        await adapter.aclose()
    assert attacker.seen == [] and second.seen == []


@pytest.mark.parametrize("path", ["/api/v10/bomb", "/api/v10/liar", "/api/v10/redirect"])
async def test_discord_downloads_send_no_token_and_stop_at_the_cap(
    attacker: Attacker, second: Attacker, path: str
) -> None:
    attacker.redirect_to = second.url + "/collected"
    adapter = DiscordChannel(discord_settings(attacker.url + "/api/v10"), BuildContext(account="default"))
    try:
        with pytest.raises(AttachmentError) as caught:
            await adapter.fetch(_document(attacker.url + path, size=10), DISCORD_DM, LIMIT)
            raise AttachmentError("fetched", channel="discord")  # the redirect target answered: fine, no token
    finally:
        await adapter.aclose()
    assert attacker.tokens_seen() == [] and second.tokens_seen() == []
    if not path.endswith("redirect"):
        assert caught.value.too_large


@pytest.mark.parametrize(
    "file_path", ["../../../../etc/passwd", "{second}/steal", "//{host}/steal", "..", "%2e%2e/%2e%2e/x", "/\\{host}/x"]
)
async def test_a_telegram_file_path_never_leaves_the_bot_api_host(
    attacker: Attacker, second: Attacker, file_path: str
) -> None:
    host = second.url.split("//", 1)[1]
    attacker.file_path = file_path.format(second=second.url, host=host)
    adapter = TelegramChannel(telegram_settings(attacker.url))
    try:
        try:
            fetched = await adapter.fetch(_document("file-id-1"), TELEGRAM_DM, LIMIT)
        except AttachmentError:
            fetched = None
    finally:
        await adapter.aclose()
    assert second.seen == []
    downloads = [path for path, _ in attacker.seen if "/file/" in path]
    assert all(TELEGRAM_TOKEN not in path or path.startswith(f"/file/bot{TELEGRAM_TOKEN}/") for path in downloads)
    if fetched is not None:
        assert "/" not in fetched.name and "\\" not in fetched.name, fetched.name


@pytest.mark.parametrize("path", ["bomb", "liar"])
async def test_a_telegram_download_stops_at_the_cap_whatever_getfile_said(attacker: Attacker, path: str) -> None:
    attacker.file_path = f"documents/{path}"
    adapter = TelegramChannel(telegram_settings(attacker.url))
    try:
        with pytest.raises(AttachmentError) as caught:
            await adapter.fetch(_document("file-id-1", size=10), TELEGRAM_DM, LIMIT)
    finally:
        await adapter.aclose()
    assert caught.value.too_large
    assert json.dumps(str(caught.value)).find(TELEGRAM_TOKEN) == -1
