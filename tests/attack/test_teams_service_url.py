"""Hostile spellings of a Teams conversation's ``serviceUrl``: replies and the bot's token go to the Connector only.

A forged activity names the ``serviceUrl`` the gateway replies to (with the bot's token). Every spelling that a URL
parser could read as another host, port, scheme or user must be refused; the Connector's own spellings pass, and
what passes is parsed (by the same parser the client uses) to a Connector host on https:443.
"""

from __future__ import annotations

import pytest
from yarl import URL

from switchboard.channels.teams.files import CONNECTOR_HOSTS, sends_token, service_allowed

REFUSED = [
    "https://smba.trafficmanager.net.evil.com/amer/",
    "https://evil.com\\@smba.trafficmanager.net/",
    "https://smba.trafficmanager.net\\evil.com/",
    "https://smba.trafficmanager.net%2eevil.com/",
    "https://smba%2etrafficmanager.net/",
    "https://smba.trafficmanager.net\u3002evil.com/",  # an ideographic full stop: IDNA maps it to "."
    "https://\u0455mba.trafficmanager.net/",  # Cyrillic dze for the s
    "https://user@smba.trafficmanager.net/",
    "https://smba.trafficmanager.net:443@evil.com/",
    "https://smba.trafficmanager.net:8443/",
    "http://smba.trafficmanager.net/",
    "wss://smba.trafficmanager.net/",
    "https://[::1]/",
    "https://127.0.0.1/",
    "https://smba.trafficmanager.net\t.evil.com/",
    "https://smba.trafficmanager.net\x00.evil.com/",
    "https:/smba.trafficmanager.net/",
    "https:smba.trafficmanager.net/",
    "//smba.trafficmanager.net/",
    "",
    "smba.trafficmanager.net",
]
PASSED = [
    "https://smba.trafficmanager.net/amer/",
    "HTTPS://SMBA.TRAFFICMANAGER.NET/amer/",
    "https://smba.trafficmanager.net./emea/",
    "https://smba.trafficmanager.net:443/amer/",
    "https://smba.trafficmanager.net#@evil.com/",
    "https://smba.trafficmanager.net?@evil.com/",
]


@pytest.mark.parametrize("service_url", REFUSED)
def test_a_hostile_service_url_is_refused(service_url: str) -> None:
    assert not service_allowed(service_url, CONNECTOR_HOSTS)
    assert not sends_token(URL("https://smba.trafficmanager.net/amer/v3/x"), service_url, CONNECTOR_HOSTS)


@pytest.mark.parametrize("service_url", PASSED)
def test_what_passes_reaches_a_connector_host_on_https(service_url: str) -> None:
    assert service_allowed(service_url, CONNECTOR_HOSTS)
    base = service_url if service_url.endswith("/") else service_url + "/"
    target = URL(base).join(URL("v3/conversations/c/activities"))  # how the client's session resolves its calls
    assert (target.scheme, (target.host or "").rstrip("."), target.port) == ("https", "smba.trafficmanager.net", 443)
    assert target.user is None
