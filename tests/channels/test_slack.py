"""The Slack adapter inbound: v0 signatures on raw bytes, payload normalisation (one case table), handshakes."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from switchboard.channels.base import RawRequest
from switchboard.channels.slack.adapter import SlackChannel, problems
from switchboard.channels.slack.factory import FACTORY
from switchboard.channels.slack.fake.payloads import form_body, make_event, sign_request
from switchboard.channels.slack.settings import SlackSettings
from switchboard.core.messages import ChoiceSelected, MessageDeleted, MessageEdited, Posted
from switchboard.errors import MalformedBodyError, SignatureError

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
NOW = 1_700_000_100
PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "slack"


def settings(**overrides: Any) -> SlackSettings:
    values: dict[str, Any] = {"bot_token": "xoxb-1-test", "signing_secret": SECRET, **overrides}
    return SlackSettings.model_validate(values)


def adapter(**overrides: Any) -> SlackChannel:
    return SlackChannel(settings(**overrides), account="default", clock=lambda: NOW)


def raw(body: bytes, headers: dict[str, str]) -> RawRequest:
    return RawRequest("POST", "/webhooks/slack", CIMultiDictProxy(CIMultiDict(headers)), {}, body)


def signed(
    payload: dict[str, Any] | bytes, *, form: bool = False, timestamp: int = NOW, secret: str = SECRET
) -> RawRequest:
    body, headers = sign_request(payload, secret, timestamp=timestamp, form=form)
    return raw(body, headers)


def payload(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PAYLOADS / name).read_text())
    return data


# --------------------------------------------------------------------------- signature


async def test_a_correct_signature_verifies() -> None:
    await adapter().verify(signed(payload("dm.json")))


@pytest.mark.parametrize(
    ("case", "status"),
    [
        ("wrong_secret", 401),
        ("stale_timestamp", 401),
        ("future_timestamp", 401),
        ("signature_over_other_timestamp", 401),
        ("missing_signature", 401),
        ("missing_timestamp", 401),
        ("repeated_signature", 401),
        ("non_numeric_timestamp", 401),
        ("v1_scheme", 401),
        ("non_ascii_signature", 401),
    ],
)
async def test_forged_requests_are_refused(case: str, status: int) -> None:
    body, headers = sign_request(payload("dm.json"), SECRET, timestamp=NOW)
    headers = dict(headers)
    multi = CIMultiDict(headers)
    if case == "wrong_secret":
        body, headers = sign_request(body, "another-secret", timestamp=NOW)
        multi = CIMultiDict(headers)
    elif case == "stale_timestamp":
        body, headers = sign_request(body, SECRET, timestamp=NOW - 301)
        multi = CIMultiDict(headers)
    elif case == "future_timestamp":
        body, headers = sign_request(body, SECRET, timestamp=NOW + 301)
        multi = CIMultiDict(headers)
    elif case == "signature_over_other_timestamp":
        _, other = sign_request(body, SECRET, timestamp=NOW - 10)
        multi["X-Slack-Signature"] = other["X-Slack-Signature"]
    elif case == "missing_signature":
        del multi["X-Slack-Signature"]
    elif case == "missing_timestamp":
        del multi["X-Slack-Request-Timestamp"]
    elif case == "repeated_signature":
        multi.add("X-Slack-Signature", headers["X-Slack-Signature"])
    elif case == "non_numeric_timestamp":
        multi["X-Slack-Request-Timestamp"] = f"{NOW}.0"
    elif case == "v1_scheme":
        multi["X-Slack-Signature"] = "v1=" + headers["X-Slack-Signature"][3:]
    elif case == "non_ascii_signature":
        multi["X-Slack-Signature"] = "v0=\udcff" + headers["X-Slack-Signature"][4:]
    with pytest.raises(SignatureError) as caught:
        await adapter().verify(RawRequest("POST", "/webhooks/slack", CIMultiDictProxy(multi), {}, body))
    assert caught.value.status == status


async def test_no_signing_secret_refuses_everything_with_403() -> None:
    channel = SlackChannel(SlackSettings(bot_token="xoxb-1", app_token="xapp-1"), clock=lambda: NOW)  # type: ignore[arg-type]
    with pytest.raises(SignatureError) as caught:
        await channel.verify(signed(payload("dm.json")))
    assert caught.value.status == 403
    assert "SWITCHBOARD_SLACK__SIGNING_SECRET" in str(caught.value)


async def test_thousands_of_bit_flips_never_verify() -> None:
    rng = random.Random(8)
    body, headers = sign_request(payload("channel_app_mention.json"), SECRET, timestamp=NOW)
    channel = adapter()
    for _ in range(3000):
        flipped = bytearray(body)
        index = rng.randrange(len(flipped))
        flipped[index] ^= 1 << rng.randrange(8)
        with pytest.raises(SignatureError):
            await channel.verify(raw(bytes(flipped), headers))


async def test_url_verification_is_answered_only_after_the_signature() -> None:
    body = payload("url_verification.json")
    channel = adapter()
    with pytest.raises(SignatureError):
        await channel.verify(signed(body, secret="forged"))
    request = signed(body)
    await channel.verify(request)
    inbound = await channel.receive(request)
    assert inbound.messages == ()
    assert inbound.answer.status == 200
    assert inbound.answer.body == body["challenge"].encode()


async def test_ssl_check_is_answered_empty_without_a_signature() -> None:
    request = raw(b"ssl_check=1&token=abc", {"Content-Type": "application/x-www-form-urlencoded"})
    channel = adapter()
    await channel.verify(request)
    inbound = await channel.receive(request)
    assert inbound.messages == () and inbound.answer.status == 200 and inbound.answer.body == b""
    with pytest.raises(SignatureError):  # anything more than the probe needs a signature
        await channel.verify(raw(b"ssl_check=1&payload=%7B%7D", {"Content-Type": "application/x-www-form-urlencoded"}))


# --------------------------------------------------------------------------- the case table

OFFER_TS = "1700000020.000100"
"""The message carrying the select, radio group and overflow menu of the pick samples."""
CASES: list[tuple[str, dict[str, Any] | None]] = [
    ("dm.json", {"kind": "message", "text": "Hello & welcome <3", "conversation": "D0DIRECT", "thread": None}),
    (
        "dm_in_thread.json",
        {
            "kind": "message",
            "text": "in an assistant thread",
            "conversation": "D0DIRECT",
            "thread": "1700000000.000200",
        },
    ),
    (
        "channel_app_mention.json",
        {
            "kind": "message",
            "text": "what is this (https://example.com)?",
            "conversation": "C0GENERAL",
            "thread": "1700000001.000100",
        },
    ),
    (
        "channel_message_mention.json",
        {"kind": "message", "text": "hey summarise", "conversation": "C0GENERAL", "thread": "1700000001.000100"},
    ),
    ("channel_no_mention.json", None),
    (
        "channel_thread_reply.json",
        {"kind": "message", "text": "and then?", "conversation": "C0GENERAL", "thread": "1700000001.000100"},
    ),
    ("own_message.json", None),
    ("bot_message.json", None),
    (
        "message_changed.json",
        {"kind": "edited", "text": "corrected text", "conversation": "D0DIRECT", "original": "1700000005.000100"},
    ),
    ("message_changed_own.json", None),
    (
        "message_deleted.json",
        {"kind": "deleted", "text": "", "conversation": "D0DIRECT", "original": "1700000006.000100"},
    ),
    ("file_share.json", {"kind": "message", "text": "", "conversation": "D0DIRECT", "files": 2}),
    (
        "channel_broadcast_in_text.json",
        {"kind": "message", "text": "tell @here about it", "conversation": "C0GENERAL", "thread": "1700000008.000100"},
    ),
    ("channel_join.json", None),
    ("app_rate_limited.json", None),
    (
        "block_actions.form.json",
        {"kind": "choice", "text": "Approve", "conversation": "C0GENERAL", "thread": "1700000001.000100"},
    ),
    *(
        (
            f"block_actions_{element}.form.json",
            {"kind": "choice", "text": label, "conversation": "C0GENERAL", "option": option, "offer": OFFER_TS},
        )
        for element, label, option in [
            ("static_select", "Bananas", "fruit.banana"),
            ("radio_buttons", "*Apples*", "fruit.apple"),
            ("overflow", "Cherries", "fruit.cherry"),
        ]
    ),
    ("block_actions_checkboxes.form.json", None),  # several ticks at once: no one option picked
    ("block_actions_users_select.form.json", None),  # a user picker answers no offer
]


def test_every_payload_file_is_in_the_table() -> None:
    assert sorted(p.name for p in PAYLOADS.glob("*.json")) == sorted(
        [name for name, _ in CASES] + ["url_verification.json"]
    )


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[name for name, _ in CASES])
async def test_payloads_normalise(name: str, expected: dict[str, Any] | None) -> None:
    channel = adapter()
    request = signed(payload(name), form=name.endswith(".form.json"))
    await channel.verify(request)
    inbound = await channel.receive(request)
    assert inbound.answer.status == 200 and inbound.answer.body == b""
    if expected is None:
        assert inbound.messages == ()
        return
    (message,) = inbound.messages
    assert message.conversation.channel == "slack" and message.conversation.agent == ""
    assert message.conversation.conversation == expected["conversation"]
    assert message.text == expected["text"]
    if "thread" in expected:
        assert message.conversation.thread == expected["thread"]
        assert message.conversation.extra.get("thread_ts") == expected["thread"]
    event = message.event
    match expected["kind"]:
        case "message":
            assert isinstance(event, Posted)
            assert len(event.attachments) == expected.get("files", 0)
        case "edited":
            assert isinstance(event, MessageEdited) and event.original_id == expected["original"]
        case "deleted":
            assert isinstance(event, MessageDeleted) and event.original_id == expected["original"]
        case "choice":
            assert isinstance(event, ChoiceSelected)
            assert event.option_id == expected.get("option", "approve") and event.ack_ref is None
            assert event.offer_message_id == expected.get("offer", "1700000010.000100")


async def test_file_share_carries_references_not_credentials() -> None:
    inbound = await adapter().receive(signed(payload("file_share.json")))
    (message,) = inbound.messages
    assert isinstance(message.event, Posted)
    pdf, png = message.event.attachments
    assert (pdf.kind, pdf.name, pdf.size, pdf.mime_type) == ("document", "report.pdf", 48213, "application/pdf")
    assert pdf.ref.endswith("/download/report.pdf") and png.kind == "image"
    assert "xoxb" not in message.model_dump_json()


async def test_mention_and_message_events_of_one_message_share_a_dedup_key() -> None:
    channel = adapter()
    mention = (await channel.receive(signed(payload("channel_app_mention.json")))).messages[0]
    message = (await channel.receive(signed(payload("channel_message_mention.json")))).messages[0]
    assert mention.dedup_key == message.dedup_key
    retried = (await channel.receive(signed(payload("channel_app_mention.json")))).messages[0]
    assert retried.dedup_key == mention.dedup_key


async def test_channel_messages_without_a_mention_are_answered_when_mentions_are_not_required() -> None:
    channel = SlackChannel(settings(), require_mention=False, clock=lambda: NOW)
    (message,) = (await channel.receive(signed(payload("channel_no_mention.json")))).messages
    assert message.text == "chatter between humans"


async def test_the_bot_identity_from_auth_test_drops_its_messages_without_authorizations() -> None:
    channel = adapter()
    channel.identity.bot_user_id, channel.identity.bot_id = "U0BOTUSER", "B0BOTID"
    event = make_event("echo", user="U0BOTUSER")
    del event["authorizations"]
    assert (await channel.receive(signed(event))).messages == ()


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"type": 5}',
        b'{"type": "event_callback", "event": "nope"}',
        b'{"type": "url_verification"}',
        b"\xff\xfe",
    ],
)
async def test_malformed_bodies_are_400(body: bytes) -> None:
    with pytest.raises(MalformedBodyError):
        await adapter().receive(signed(body))


@pytest.mark.parametrize("body", [b"payload=not-json", b"payload=%5B%5D", b"nothing=here", b"payload=\xff"])
async def test_malformed_forms_are_400(body: bytes) -> None:
    with pytest.raises(MalformedBodyError):
        await adapter().receive(signed(body, form=True))


async def test_a_pick_without_a_selected_option_is_acknowledged_and_dropped() -> None:
    click = payload("block_actions_static_select.form.json")
    del click["actions"][0]["selected_option"]  # a select cleared (Slack sends no option)
    inbound = await adapter().receive(signed(form_body(click), form=True))
    assert inbound.messages == () and inbound.answer.status == 200 and inbound.answer.body == b""


def test_problems_say_what_is_missing() -> None:
    assert problems(settings()) == []
    missing = problems(SlackSettings())
    assert any("SWITCHBOARD_SLACK__BOT_TOKEN" in p for p in missing)
    assert any("SWITCHBOARD_SLACK__SIGNING_SECRET" in p and "SWITCHBOARD_SLACK__APP_TOKEN" in p for p in missing)
    assert any("xapp-" in p for p in problems(settings(app_token="xoxb-wrong")))
    assert any("end with /" in p for p in problems(settings(api_base_url="https://slack.com/api")))
    assert FACTORY.name == "slack" and FACTORY.settings is SlackSettings


def test_the_app_manifest_asks_for_what_the_adapter_uses() -> None:
    import yaml

    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "slack-app-manifest.yaml").read_text())
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert {"chat:write", "files:read", "files:write", "assistant:write", "app_mentions:read", "im:history"} <= scopes
    events = manifest["settings"]["event_subscriptions"]
    assert {"app_mention", "message.im", "message.channels"} <= set(events["bot_events"])
    assert events["request_url"] == manifest["settings"]["interactivity"]["request_url"]
    assert events["request_url"].endswith("/webhooks/slack")
    assert manifest["settings"]["interactivity"]["is_enabled"] is True
    commands = manifest["features"]["slash_commands"]
    assert "commands" in scopes and {c["command"] for c in commands} >= {"/ask", "/reset", "/stop"}
    assert {c["url"] for c in commands} == {events["request_url"]}


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _replace_at(tree: Any, path: list[int], value: Any) -> Any:
    """``tree`` with the node reached by ``path`` (indices into sorted keys / list positions) replaced."""
    if not path or not isinstance(tree, dict | list) or not tree:
        return value
    keys = sorted(tree) if isinstance(tree, dict) else list(range(len(tree)))
    key = keys[path[0] % len(keys)]
    copy = dict(tree) if isinstance(tree, dict) else list(tree)
    copy[key] = _replace_at(tree[key], path[1:], value)  # type: ignore[index]
    return copy


@hyp_settings(max_examples=400, deadline=None)
@given(
    name=st.sampled_from(sorted(p.name for p in PAYLOADS.glob("*.json"))),
    path=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=4),
    value=_JSONISH,
)
async def test_signed_payloads_of_any_shape_are_read_or_refused_with_400(
    name: str, path: list[int], value: Any
) -> None:
    mutated = _replace_at(payload(name), path, value)
    form = name.endswith(".form.json")
    body = form_body(mutated) if form and isinstance(mutated, dict) else json.dumps(mutated).encode()
    channel = adapter()
    request = signed(body, form=form)
    await channel.verify(request)
    try:
        inbound = await channel.receive(request)
    except MalformedBodyError:
        return
    assert inbound.answer.status == 200
    for message in inbound.messages:
        assert message.conversation.channel == "slack" and isinstance(message.text, str)
