"""The shared Meta layer: Graph error classification, the account map, and the request check on its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from switchboard.channels.base import RawRequest
from switchboard.channels.meta import webhook as _meta
from switchboard.channels.meta.graph import (
    GraphError,
    GraphRateLimited,
    backoff_s,
    classify,
    media_allowed,
    sends_token,
)
from switchboard.channels.meta.webhook import UNCLAIMED_PREFIX, AccountMap, sign, verify_request
from switchboard.errors import MalformedBodyError, SignatureError


def error(code: int, subcode: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"message": "x", "type": "OAuthException", "code": code, "fbtrace_id": "t"}
    if subcode is not None:
        body["error_subcode"] = subcode
    return {"error": body}


@pytest.mark.parametrize(
    ("status", "answer", "kind"),
    [
        (400, error(4), "rate"),
        (400, error(17), "rate"),
        (400, error(32), "rate"),
        (400, error(613), "rate"),
        (400, error(80007), "rate"),
        (400, error(130429), "rate"),
        (400, error(131056), "rate"),
        (429, None, "rate"),
        (401, error(190), "auth"),
        (400, error(102), "auth"),
        (403, error(10), "auth"),
        (403, error(200), "auth"),
        (401, None, "auth"),
        (400, error(131047), "window"),
        (400, error(10, 2018278), "window"),
        (400, error(10, 2534022), "window"),
        (400, error(131026), "recipient"),
        (400, error(551), "recipient"),
        (400, error(100, 2018001), "recipient"),
        (500, error(1), "transient"),
        (503, None, "transient"),
        (400, error(131000), "transient"),
        (200, None, "transient"),
        (400, error(100), "refused"),
        (400, error(100, 33), "refused"),
        (400, "not json", "refused"),
    ],
)
def test_graph_errors_are_classified(status: int, answer: Any, kind: str) -> None:
    found = classify(status, answer, channel="whatsapp", what="POST 1/messages")
    if kind == "rate":
        assert isinstance(found, GraphRateLimited) and found.retryable and 0 < found.retry_after <= 75
    else:
        assert isinstance(found, GraphError) and not isinstance(found, GraphRateLimited)
        assert found.kind == kind
        assert found.retryable is (kind == "transient")


def test_back_off_is_jittered_around_the_codes_default() -> None:
    waits = {round(backoff_s(131056), 3) for _ in range(50)}
    assert len(waits) > 1 and all(4.5 <= w <= 7.5 for w in waits)
    assert all(22.5 <= backoff_s(4) <= 37.5 for _ in range(20))


def test_the_account_map_claims_only_accounts_of_the_same_app() -> None:
    accounts = {"a": ("111", b"s1"), "b": ("222", b"s1"), "c": ("333", b"s2"), "d": (None, b"s1")}
    found = AccountMap.build(accounts, lambda s: s[0], lambda s: s[1], own=("a", accounts["a"]))
    assert found.by_id == {"111": "a", "222": "b"}
    assert found.account_for("222") == "b"
    assert found.account_for("333") == f"{UNCLAIMED_PREFIX}333"


def test_the_receiving_account_wins_a_shared_id() -> None:
    accounts = {"first": ("111", b"s"), "second": ("111", b"s")}
    found = AccountMap.build(accounts, lambda s: s[0], lambda s: s[1], own=("second", accounts["second"]))
    assert found.account_for("111") == "second"


def request(method: str, body: bytes = b"", headers: dict[str, str] | None = None, **query: str) -> RawRequest:
    return RawRequest(method, "/webhooks/x", CIMultiDictProxy(CIMultiDict(headers or {})), query, body)


async def test_verify_request_checks_get_and_post_separately() -> None:
    verify_request(
        request("GET", **{"hub.mode": "subscribe", "hub.verify_token": "tok"}),
        app_secret=b"s",
        verify_token=b"tok",
        channel="messenger",
    )
    verify_request(
        request("POST", b"{}", {"X-Hub-Signature-256": sign(b"{}", "s")}),
        app_secret=b"s",
        verify_token=None,
        channel="messenger",
    )
    with pytest.raises(SignatureError) as caught:
        verify_request(request("POST", b"{}"), app_secret=b"s", verify_token=b"tok", channel="messenger")
    assert caught.value.status == 401 and caught.value.channel == "messenger"


GRAPH = "https://graph.facebook.com/v23.0"
FAKE_GRAPH = "http://127.0.0.1:8555/v23.0"


@pytest.mark.parametrize(
    ("url", "graph", "allowed", "token"),
    [
        ("https://lookaside.fbsbx.com/whatsapp_business/attachments/?mid=1", GRAPH, True, True),
        ("https://lookaside.fbsbx.com:443/ig_messaging_cdn/?asset_id=1", GRAPH, True, True),
        ("https://scontent.xx.fbcdn.net/v/t1/x.jpg?oh=sig", GRAPH, True, False),  # signed CDN: never the token
        ("https://scontent-cdg4-1.cdninstagram.com/x.mp4", GRAPH, True, False),
        ("https://graph.facebook.com/v23.0/123", GRAPH, True, True),
        ("http://127.0.0.1:8555/_fake/media/1", FAKE_GRAPH, True, True),  # the configured (fake) Graph origin
        ("http://127.0.0.1:8556/_fake/media/1", FAKE_GRAPH, False, False),  # another port of the same host
        ("http://localhost:8555/_fake/media/1", FAKE_GRAPH, False, False),
        ("http://lookaside.fbsbx.com/x", GRAPH, False, False),
        ("https://lookaside.fbsbx.com:8443/x", GRAPH, False, False),
        ("https://user:pw@lookaside.fbsbx.com/x", GRAPH, False, False),
        ("https://fbcdn.net.evil.example/x.jpg", GRAPH, False, False),
        ("https://evilfbcdn.net/x.jpg", GRAPH, False, False),
        ("https://169.254.169.254/latest/meta-data/", GRAPH, False, False),
        ("file:///etc/passwd", GRAPH, False, False),
        ("/_fake/media/1", FAKE_GRAPH, False, False),
    ],
)
def test_which_media_urls_a_download_reaches_and_which_get_the_token(
    url: str, graph: str, allowed: bool, token: bool
) -> None:
    assert media_allowed(URL(url), graph) is allowed
    if allowed:  # the token question is only asked of hops that pass
        assert sends_token(URL(url), graph) is token


def _reference_delivery(body: bytes, object_name: str) -> Any:
    """What ``load_delivery`` gave before it parsed with pydantic-core: ``json.loads`` and the surrogate repair."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "malformed"
    payload = _meta._repaired(payload)
    if not isinstance(payload, dict) or payload.get("object") != object_name:
        return "malformed"
    return payload if isinstance(payload.get("entry", []), list) else "malformed"


_PAYLOADS = Path(__file__).resolve().parents[1] / "payloads"
_SAMPLES = [
    (path.read_bytes(), {"whatsapp": "whatsapp_business_account", "messenger": "page", "instagram": "instagram"}[d])
    for d in ("whatsapp", "messenger", "instagram")
    for path in sorted((_PAYLOADS / d).glob("*.json"))
]
_ODD = [
    b'{"object":"page","entry":[{"id":"1","x":"\\ud800"}]}',  # a lone surrogate: repaired
    b'{"object":"page","entry":[{"id":"1","x":"\\ud83d\\ude00 \\udc00"}]}',  # a pair and a lone one
    b'{"object":"page","entry":[{"id":"1","x":"\xed\xa0\x80"}]}',  # a lone surrogate as raw UTF-8 bytes
    '{"object":"page","entry":[{"id":"é"}]}'.encode("utf-16"),  # json.loads detects UTF-16
    b'\xef\xbb\xbf{"object":"page","entry":[]}',  # a UTF-8 byte order mark
    b'{"object":"page","entry":[' + b"[" * 300 + b"]" * 300 + b"]}",  # nesting pydantic-core refuses
    b'{"object":"page","entry":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}",  # nesting json.loads refuses too
    b'{"object":"page","entry":[{"n":123456789012345678901234567890,"f":1e400,"g":-0.0}]}',
    b'{"object":"page","object":"page","entry":[1],"entry":[2]}',  # duplicate keys: the last wins
    b'{"object":"page","entry":[{"x":"\x01"}]}',  # a raw control character
    b'{"object":"page","entry":[1,]}',
    b'{"object":"page","entry":[]} trailing',
    b'{"object":"page","entry":{}}',
    b'["object","page"]',
    b"",
]


@pytest.mark.parametrize(("body", "object_name"), _SAMPLES + [(body, "page") for body in _ODD])
def test_a_delivery_is_read_exactly_as_json_loads_reads_it(body: bytes, object_name: str) -> None:
    expected = _reference_delivery(body, object_name)
    try:
        got: Any = _meta.load_delivery(body, object_name, "messenger")
    except MalformedBodyError:
        got = "malformed"
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert type(got) is type(expected)
