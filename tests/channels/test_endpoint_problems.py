"""`switchboard check` refuses a platform base URL that is plain http to another host, in every channel alike."""

from __future__ import annotations

import pytest

from switchboard.channels.meta.instagram import adapter as instagram
from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.messenger import adapter as messenger
from switchboard.channels.meta.messenger.settings import MessengerSettings
from switchboard.channels.meta.whatsapp import adapter as whatsapp
from switchboard.channels.meta.whatsapp.settings import WhatsAppSettings
from switchboard.channels.teams import factory as teams
from switchboard.channels.teams.settings import TeamsSettings
from switchboard.settings.channels import secure_endpoint


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://graph.facebook.com/v23.0", True),
        ("http://127.0.0.1:8123/v23.0", True),
        ("http://localhost:9000", True),
        ("http://[::1]:9000", True),
        ("http://graph.facebook.com/v23.0", False),
        ("http://127.0.0.1.evil.example/", False),
        ("ftp://graph.facebook.com", False),
        ("graph.facebook.com", False),
        ("https://", False),
        ("http://[::1", False),
    ],
)
def test_secure_endpoint(url: str, ok: bool) -> None:
    assert secure_endpoint(url) is ok


def _problems(channel: str, url: str) -> list[str]:
    match channel:
        case "whatsapp":
            return whatsapp.problems(WhatsAppSettings(access_token="t", app_secret="s", verify_token="v",
                                                      phone_number_id="1", graph_base_url=url))  # fmt: skip
        case "messenger":
            return messenger.problems(MessengerSettings(page_access_token="t", app_secret="s", verify_token="v",
                                                        graph_base_url=url))  # fmt: skip
        case "instagram":
            return instagram.problems(InstagramSettings(access_token="t", app_secret="s", verify_token="v",
                                                        graph_base_url=url))  # fmt: skip
        case "teams":
            return teams.problems(TeamsSettings(app_id="a", app_password="p", login_base_url=url))
    raise AssertionError(channel)


@pytest.mark.parametrize("channel", ["whatsapp", "messenger", "instagram", "teams"])
def test_every_channel_refuses_plain_http_to_another_host_and_accepts_its_fake(channel: str) -> None:
    assert any("https" in problem for problem in _problems(channel, "http://graph.example.com/v23.0"))
    assert not any("URL" in problem or "https" in problem for problem in _problems(channel, "http://127.0.0.1:9/v1"))
