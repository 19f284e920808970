"""Teams file downloads: which hosts a hop may reach, who gets the bot's token, redirects and the size cap.

The policy is checked on its own (a table of URLs), then :meth:`TeamsChannel.fetch` against a local server standing
for the conversation's Connector (its ``serviceUrl``), with the bot's token from the fake Bot Framework.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from yarl import URL

from switchboard.channels.download import MAX_REDIRECTS
from switchboard.channels.teams.adapter import TeamsChannel
from switchboard.channels.teams.fake.platform import FakeTeams
from switchboard.channels.teams.files import CONNECTOR_HOSTS, file_allowed, sends_token, service_allowed
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError
from tests.channels.teams_support import APP_ID, PASSWORD, make_channel

SERVICE = "https://smba.trafficmanager.net/amer/"


@pytest.mark.parametrize(
    "url",
    [
        "https://contoso.sharepoint.com/personal/a/_layouts/15/download.aspx?UniqueId=1&tempauth=x",
        "https://contoso-my.sharepoint.com/personal/a/Documents/report.pdf",
        "https://contoso.sharepoint.com:443/x",
        "https://CONTOSO.SharePoint.com./x",
        "https://agency.sharepoint.us/x",
        "https://contoso.onedrive.com/x",
        "https://smba.trafficmanager.net/amer/v3/attachments/1/views/original",
        "https://smba.trafficmanager.net/emea/v3/attachments/1/views/original",
        "https://webchat.botframework.com/attachments/1",
    ],
)
def test_teams_file_hosts_are_allowed(url: str) -> None:
    assert file_allowed(URL(url), SERVICE, CONNECTOR_HOSTS)


@pytest.mark.parametrize(
    "url",
    [
        "http://contoso.sharepoint.com/x",
        "https://contoso.sharepoint.com:8443/x",
        "https://smba.trafficmanager.net@contoso.sharepoint.com/x",
        "https://user:pw@contoso.sharepoint.com/x",
        "https://sharepoint.com.evil.example/x",
        "https://evilsharepoint.com/x",
        "https://anyone.trafficmanager.net/x",
        "https://x.smba.trafficmanager.net/x",
        "https://smba.trafficmanager.net:444/amer/x",
        "http://smba.trafficmanager.net/amer/x",
        "http://169.254.169.254/latest/meta-data/",
        "https://169.254.169.254/latest/meta-data/",
        "https://127.0.0.1/x",
        "http://127.0.0.1:8080/x",
        "https://[::1]/x",
        "https://intranet/x",
        "/v3/attachments/1",
        "file:///etc/passwd",
    ],
)
def test_other_hosts_are_refused(url: str) -> None:
    assert not file_allowed(URL(url), SERVICE, CONNECTOR_HOSTS)


def test_a_service_origin_counts_only_when_it_is_a_connector_host() -> None:
    loopback = "http://127.0.0.1:3978/"
    assert not file_allowed(URL("http://127.0.0.1:3978/v3/attachments/1"), loopback, CONNECTOR_HOSTS)
    configured = (*CONNECTOR_HOSTS, "http://127.0.0.1:3978")  # a local fake, named as an origin
    assert file_allowed(URL("http://127.0.0.1:3978/v3/attachments/1"), loopback, configured)
    assert not file_allowed(URL("http://127.0.0.1:3979/v3/attachments/1"), loopback, configured)  # another port
    assert not file_allowed(URL("https://connector.example/v3/attachments/1"), "https://connector.example/", configured)
    sovereign = ("connector.example",)  # a host name: https on 443 only
    assert file_allowed(URL("https://connector.example/v3/attachments/1"), "https://connector.example/", sovereign)
    assert not file_allowed(URL("http://connector.example/v3/attachments/1"), "http://connector.example/", sovereign)


@pytest.mark.parametrize(
    "service_url",
    [
        "http://127.0.0.1:3978/amer/",
        "https://127.0.0.1/amer/",
        "http://169.254.169.254/latest/",
        "https://169.254.169.254/latest/",
        "http://smba.trafficmanager.net/amer/",
        "https://smba.trafficmanager.net:8443/amer/",
        "https://user:pw@smba.trafficmanager.net/amer/",
        "https://smba.trafficmanager.net.evil.example/amer/",
        "https://evil.trafficmanager.net/amer/",
        "file:///etc/",
        "/amer/",
        "not a url",
        "",
    ],
)
def test_a_service_url_off_the_connector_hosts_gets_no_reply(service_url: str) -> None:
    assert not service_allowed(service_url, CONNECTOR_HOSTS)


def test_the_connector_hosts_of_every_cloud_get_replies() -> None:
    for host in CONNECTOR_HOSTS:
        assert service_allowed(f"https://{host}/amer/", CONNECTOR_HOSTS), host
        assert service_allowed(f"https://{host.upper()}.:443/", CONNECTOR_HOSTS), host
    assert service_allowed("http://127.0.0.1:3978/amer/", ("http://127.0.0.1:3978",))


def test_only_the_verified_service_origin_gets_the_token() -> None:
    hosts = CONNECTOR_HOSTS
    assert sends_token(URL("https://smba.trafficmanager.net/amer/v3/attachments/1"), SERVICE, hosts)
    assert sends_token(URL("https://smba.trafficmanager.net/emea/v3/attachments/1"), SERVICE, hosts)  # same origin
    for url in (
        "https://contoso.sharepoint.com/x",
        "http://smba.trafficmanager.net/amer/v3/attachments/1",
        "https://smba.trafficmanager.net:444/amer/v3/attachments/1",
        "https://evil@smba.trafficmanager.net/amer/v3/attachments/1",
        "https://smba.infra.gcc.teams.microsoft.com/v3/attachments/1",  # a Connector host, not this conversation's
    ):
        assert not sends_token(URL(url), SERVICE, hosts), url
    assert not sends_token(URL("https://smba.trafficmanager.net/amer/x"), "not a url", hosts)
    loopback = "http://127.0.0.1:3978/amer/"  # the conversation's own origin, but no Connector host
    assert not sends_token(URL("http://127.0.0.1:3978/v3/attachments/1"), loopback, hosts)


# --------------------------------------------------------------------------- fetch against a local Connector


@dataclass
class Connector:
    """A local server standing for the conversation's Connector: serves files, redirects, records what it got."""

    url: str = ""
    hits: list[tuple[str, str | None]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append((request.path, request.headers.get("Authorization")))
        hops = request.match_info["tail"]
        if hops.startswith("hop/"):
            left = int(hops.split("/")[1])
            raise web.HTTPFound("/image" if left == 0 else f"/hop/{left - 1}")
        if hops == "big":
            return web.Response(body=b"x" * 5000, content_type="image/png")
        return web.Response(body=b"\x89PNG image", content_type="image/png")


@pytest.fixture
async def connector() -> AsyncIterator[Connector]:
    server = Connector()
    app = web.Application()
    app.router.add_get("/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


@pytest.fixture
async def channel(connector: Connector) -> AsyncIterator[TeamsChannel]:
    async with FakeTeams(app_id=APP_ID, app_password=PASSWORD) as fake:
        adapter = make_channel(fake, connector_hosts=(fake.base_url, connector.url))
        try:
            yield adapter
        finally:
            await adapter.aclose()


def _at(connector: Connector) -> ConversationRef:
    extra = {"service_url": connector.url + "/amer/", "conversation_type": "personal"}
    return ConversationRef(channel="teams", conversation="a:1", extra=extra)


async def test_an_inline_image_on_the_connector_is_fetched_with_the_token(
    channel: TeamsChannel, connector: Connector
) -> None:
    got = await channel.fetch(Attachment(kind="image", ref=connector.url + "/image"), _at(connector), 1 << 20)
    assert got.data == b"\x89PNG image" and got.mime_type == "image/png" and got.name == "image"
    ((path, authorization),) = connector.hits
    assert path == "/image" and authorization is not None and authorization.startswith("Bearer ")


async def test_redirects_on_the_connector_are_followed_by_hand_up_to_the_limit(
    channel: TeamsChannel, connector: Connector
) -> None:
    ref = f"{connector.url}/hop/{MAX_REDIRECTS - 1}"
    got = await channel.fetch(Attachment(kind="image", ref=ref), _at(connector), 1 << 20)
    assert got.data == b"\x89PNG image"
    assert len(connector.hits) == MAX_REDIRECTS + 1  # every hop was requested (and checked) by us
    assert all(auth is not None and auth.startswith("Bearer ") for _path, auth in connector.hits)
    connector.hits.clear()
    with pytest.raises(AttachmentError, match="redirects; not fetched"):
        await channel.fetch(Attachment(kind="image", ref=f"{connector.url}/hop/{MAX_REDIRECTS}"), _at(connector), 99)
    assert len(connector.hits) == MAX_REDIRECTS + 1  # the fifth hop is never requested


async def test_a_file_over_the_limit_is_refused(channel: TeamsChannel, connector: Connector) -> None:
    with pytest.raises(AttachmentError) as caught:
        await channel.fetch(Attachment(kind="image", ref=connector.url + "/big"), _at(connector), 4096)
    assert caught.value.too_large


async def test_a_download_url_off_the_allowed_hosts_is_never_requested(connector: Connector) -> None:
    """A loopback URL that is no Connector host is refused before any connection, also as the serviceUrl."""
    async with FakeTeams(app_id=APP_ID, app_password=PASSWORD) as fake:
        channel = make_channel(fake)
        try:
            for service_url in ("https://smba.trafficmanager.net/amer/", connector.url + "/amer/"):
                elsewhere = ConversationRef(channel="teams", conversation="a:1", extra={"service_url": service_url})
                for ref in (connector.url + "/image", connector.url.replace("127.0.0.1", "localhost") + "/image"):
                    with pytest.raises(AttachmentError, match="not fetched"):
                        await channel.fetch(Attachment(kind="document", ref=ref), elsewhere, 1 << 20)
        finally:
            await channel.aclose()
    assert connector.hits == []
