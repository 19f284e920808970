"""The client address: the peer's, or X-Forwarded-For's only as far as trusted proxies vouch for it."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from switchboard.errors import ConfigError
from switchboard.settings import LimitsSettings, load_settings
from switchboard.settings.proxies import TrustedProxies, parse_trusted_proxies
from switchboard.web.clientaddr import client_address

PROXIES = parse_trusted_proxies("10.0.0.0/8, 2001:db8:ffff::/48")


def _address(peer: str | None, *forwarded: str, trusted: TrustedProxies = PROXIES) -> str:
    headers = CIMultiDict(("X-Forwarded-For", value) for value in forwarded)
    request = make_mocked_request("POST", "/api/chat/sessions", headers=headers)
    if peer is not None:
        request = request.clone(remote=peer)
    return client_address(request, trusted)


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        # an untrusted peer's header is ignored, whatever it claims
        ("198.51.100.9", ("203.0.113.1",), "198.51.100.9"),
        ("198.51.100.9", ("10.0.0.1, 203.0.113.1",), "198.51.100.9"),
        # a trusted proxy: the rightmost hop it did not write itself is the client
        ("10.1.2.3", ("203.0.113.5",), "203.0.113.5"),
        ("10.1.2.3", ("6.6.6.6, 203.0.113.5",), "203.0.113.5"),  # the client's own spoofed hop stays unread
        ("10.1.2.3", ("6.6.6.6, 203.0.113.5, 10.9.9.9",), "203.0.113.5"),  # two trusted proxies in a row
        ("10.1.2.3", ("6.6.6.6", "203.0.113.5, 10.9.9.9"), "203.0.113.5"),  # the header repeated
        ("10.1.2.3", ("10.0.0.7, 10.9.9.9",), "10.0.0.7"),  # only trusted hops: the leftmost
        ("10.1.2.3", (), "10.1.2.3"),  # a trusted peer sending no header is itself the client
        ("10.1.2.3", ("garbage, 203.0.113.5",), "203.0.113.5"),
        ("10.1.2.3", ("203.0.113.5, garbage",), "10.1.2.3"),  # a malformed hop stops the walk
        ("10.1.2.3", ("[2001:db8::1]:443",), "2001:db8::1"),
        ("10.1.2.3", ("192.0.2.1:5000",), "192.0.2.1"),
        ("2001:db8:ffff::1", ("2001:db8:1::5",), "2001:db8:1::5"),
        ("::ffff:10.1.2.3", ("203.0.113.5",), "203.0.113.5"),  # an IPv4-mapped peer is its IPv4 address
    ],
)
def test_forwarded_for_is_believed_only_from_trusted_proxies(
    peer: str, forwarded: tuple[str, ...], expected: str
) -> None:
    assert _address(peer, *forwarded) == expected


def test_without_trusted_proxies_the_header_is_never_read() -> None:
    assert _address("10.1.2.3", "203.0.113.5", trusted=()) == "10.1.2.3"


def test_a_peer_without_an_ip_address() -> None:
    assert _address(None, "203.0.113.5") == "unknown"


def test_parse_accepts_addresses_and_networks() -> None:
    assert [str(n) for n in parse_trusted_proxies(" 192.0.2.1 ,10.0.0.0/8,,::1 ")] == [
        "192.0.2.1/32",
        "10.0.0.0/8",
        "::1/128",
    ]
    assert parse_trusted_proxies("") == ()


def test_settings_parse_trusted_proxies_and_name_a_bad_entry() -> None:
    settings = load_settings({"SWITCHBOARD_TRUSTED_PROXIES": "10.0.0.0/8,192.0.2.1"})
    assert [str(n) for n in settings.trusted_proxies] == ["10.0.0.0/8", "192.0.2.1/32"]
    assert load_settings({}).trusted_proxies == ()
    with pytest.raises(ConfigError, match=r"SWITCHBOARD_TRUSTED_PROXIES: .*'proxy\.local' is not an IP address"):
        load_settings({"SWITCHBOARD_TRUSTED_PROXIES": "10.0.0.0/8,proxy.local"})


def test_limit_settings_have_defaults_and_refuse_negatives() -> None:
    assert load_settings({}).limits == LimitsSettings()
    settings = load_settings({"SWITCHBOARD_LIMITS__INBOX_DEPTH": "0", "SWITCHBOARD_LIMITS__STREAMS_PER_ADDRESS": "3"})
    assert settings.limits.inbox_depth == 0 and settings.limits.streams_per_address == 3
    assert settings.limits.messages_per_session_per_minute == LimitsSettings().messages_per_session_per_minute
    with pytest.raises(ConfigError, match="SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE"):
        load_settings({"SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE": "-1"})
