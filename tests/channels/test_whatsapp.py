"""The WhatsApp adapter inbound: handshake, signatures on raw bytes, and payload normalisation (one case table)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from switchboard.channels.base import RawRequest
from switchboard.channels.meta import webhook as _meta
from switchboard.channels.meta.whatsapp.adapter import WhatsAppChannel, parse_template, problems
from switchboard.channels.meta.whatsapp.factory import FACTORY
from switchboard.channels.meta.whatsapp.fake.payloads import PHONE_NUMBER_ID, sign_request, text_delivery
from switchboard.channels.meta.whatsapp.settings import WhatsAppSettings
from switchboard.channels.registry import BuildContext, factory
from switchboard.core.inbound import event_text, plan_turn
from switchboard.core.messages import (
    ChoiceSelected,
    Contact,
    ConversationRef,
    InboundMessage,
    Location,
    MessageDeleted,
    MessageEdited,
    Posted,
)
from switchboard.errors import MalformedBodyError, SignatureError

SECRET = "5d41402abc4b2a76b9719d911017c592"
VERIFY = "my-verify-token"
PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "whatsapp"
SECOND_NUMBER = "106540352242923"


def settings(**overrides: Any) -> WhatsAppSettings:
    values: dict[str, Any] = {
        "access_token": "EAAtest",
        "app_secret": SECRET,
        "verify_token": VERIFY,
        "phone_number_id": PHONE_NUMBER_ID,
        **overrides,
    }
    return WhatsAppSettings.model_validate(values)


def adapter(context: BuildContext | None = None, **overrides: Any) -> WhatsAppChannel:
    return WhatsAppChannel(settings(**overrides), context or BuildContext(agent="assistant", tenant="acme"))


def post(body: bytes, headers: dict[str, str]) -> RawRequest:
    return RawRequest("POST", "/webhooks/whatsapp", CIMultiDictProxy(CIMultiDict(headers)), {}, body)


def get(query: dict[str, str]) -> RawRequest:
    return RawRequest("GET", "/webhooks/whatsapp", CIMultiDictProxy(CIMultiDict()), query, b"")


def payload(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PAYLOADS / f"{name}.json").read_text())
    return data


async def receive(channel: WhatsAppChannel, data: dict[str, Any]) -> list[InboundMessage]:
    request = post(*sign_request(data, SECRET))
    await channel.verify(request)
    return list((await channel.receive(request)).messages)


# --------------------------------------------------------------------------- handshake and signature


async def test_the_handshake_echoes_the_challenge_as_plain_text() -> None:
    channel = adapter()
    request = get({"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "1158201444"})
    await channel.verify(request)
    inbound = await channel.receive(request)
    assert inbound.messages == ()
    assert (inbound.answer.status, inbound.answer.body, inbound.answer.content_type) == (
        200,
        b"1158201444",
        "text/plain",
    )


@pytest.mark.parametrize(
    "query",
    [
        {"hub.mode": "subscribe", "hub.verify_token": "wrong", "hub.challenge": "1"},
        {"hub.mode": "subscribe", "hub.verify_token": VERIFY.upper(), "hub.challenge": "1"},
        {"hub.mode": "unsubscribe", "hub.verify_token": VERIFY, "hub.challenge": "1"},
        {"hub.verify_token": VERIFY, "hub.challenge": "1"},
        {"hub.mode": "subscribe", "hub.challenge": "1"},
    ],
)
async def test_a_wrong_handshake_is_403(query: dict[str, str]) -> None:
    with pytest.raises(SignatureError) as caught:
        await adapter().verify(get(query))
    assert caught.value.status == 403


async def test_a_handshake_without_a_configured_verify_token_is_403() -> None:
    channel = adapter(verify_token=None)
    with pytest.raises(SignatureError) as caught:
        await channel.verify(get({"hub.mode": "subscribe", "hub.verify_token": "", "hub.challenge": "1"}))
    assert caught.value.status == 403


async def test_a_hostile_challenge_is_not_echoed() -> None:
    request = get({"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "<script>alert(1)</script>"})
    channel = adapter()
    await channel.verify(request)
    with pytest.raises(MalformedBodyError):
        await channel.receive(request)


async def test_a_correct_signature_verifies_and_meta_test_vector_matches() -> None:
    body = json.dumps({"object": "whatsapp_business_account", "entry": [], "é": "é"}).encode()
    assert b"\\u00e9" in body  # Meta escapes non-ASCII: the signature is over those exact bytes
    await adapter().verify(post(body, {_meta.SIGNATURE_HEADER: _meta.sign(body, SECRET)}))


@pytest.mark.parametrize(
    ("mutate", "status"),
    [
        (lambda body, h: (body[:-2] + bytes([body[-2] ^ 1]) + body[-1:], h), 401),  # one flipped byte
        (lambda body, h: (body, {_meta.SIGNATURE_HEADER: _meta.sign(body, "another-secret")}), 401),
        (lambda body, h: (body, {}), 401),
        (lambda body, h: (body, {"X-Hub-Signature": "sha1=" + "0" * 40}), 401),
        (lambda body, h: (body, {_meta.SIGNATURE_HEADER: h[_meta.SIGNATURE_HEADER].upper()}), 401),
        (lambda body, h: (body, {_meta.SIGNATURE_HEADER: h[_meta.SIGNATURE_HEADER][7:]}), 401),
        (lambda body, h: (body, {_meta.SIGNATURE_HEADER: "sha256=zz"}), 401),
    ],
)
async def test_a_bad_signature_is_refused(mutate: Any, status: int) -> None:
    body, headers = sign_request(text_delivery("Olá, préço?"), SECRET)
    bad_body, bad_headers = mutate(body, headers)
    with pytest.raises(SignatureError) as caught:
        await adapter().verify(post(bad_body, bad_headers))
    assert caught.value.status == status


async def test_a_body_re_encoded_with_raw_non_ascii_does_not_verify() -> None:
    data = text_delivery("Olá, préço?")
    body, headers = sign_request(data, SECRET)
    reencoded = json.dumps(data, ensure_ascii=False).encode()
    assert reencoded != body
    with pytest.raises(SignatureError):
        await adapter().verify(post(reencoded, headers))


async def test_no_app_secret_refuses_every_post_with_403() -> None:
    body, headers = sign_request(text_delivery("hi"), SECRET)
    with pytest.raises(SignatureError) as caught:
        await adapter(app_secret=None).verify(post(body, headers))
    assert caught.value.status == 403


async def test_two_signature_headers_are_refused() -> None:
    body, headers = sign_request(text_delivery("hi"), SECRET)
    doubled = CIMultiDict(headers)
    doubled.add(_meta.SIGNATURE_HEADER, headers[_meta.SIGNATURE_HEADER])
    request = RawRequest("POST", "/webhooks/whatsapp", CIMultiDictProxy(doubled), {}, body)
    with pytest.raises(SignatureError):
        await adapter().verify(request)


# --------------------------------------------------------------------------- the case table

PAULISTA = "Av. Paulista 1000, São Paulo"
IMAGE = {"kind": "image", "ref": "1003383421387256", "mime_type": "image/jpeg", "name": None, "size": None}

CASES: list[tuple[str, list[dict[str, Any]]]] = [
    ("text", [{"text": "Olá! Preço do plano?", "event": {"kind": "message", "attachments": []}}]),
    ("image", [{"text": "my receipt", "attachments": [IMAGE]}]),
    ("document", [{"text": "contract", "attachments": [{"kind": "document", "name": "contract.pdf"}]}]),
    ("audio", [{"text": "", "attachments": [{"kind": "audio", "mime_type": "audio/mpeg"}]}]),
    ("voice", [{"text": "", "attachments": [{"kind": "voice", "ref": "1003383421387259"}]}]),
    ("video", [{"text": "", "attachments": [{"kind": "video", "mime_type": "video/mp4"}]}]),
    ("sticker", [{"text": "[sticker]", "attachments": [{"kind": "image", "mime_type": "image/webp"}]}]),
    (
        "location",
        [
            {
                "text": "",
                "shared": [Location(latitude=-23.5505, longitude=-46.6333, name="Paulista Office", address=PAULISTA)],
                "reads": f"[location: -23.5505, -46.6333 — Paulista Office, {PAULISTA}]",
            }
        ],
    ),
    (
        "contacts",
        [
            {
                "text": "",
                "shared": [Contact(name="John Smith", phones=("+1 555 010 9999",), emails=("john@example.com",))],
                "reads": "[contact: John Smith, +1 555 010 9999, john@example.com]",
            }
        ],
    ),
    (
        "reply_context",
        [{"text": "yes, that one", "meta_reply_to": "wamid.HBgLMTU1NTAwMDExMTEVAgARGBJCQUI0QjQ2OTRERjM1NjVGAA=="}],
    ),
    ("reaction", [{"text": "[reacted 👍 to message wamid.HBgLMTU1NTAwMDExMTEVAgARGBJCQUI0QjQ2OTRERjM1NjVGAA==]"}]),
    ("reaction_removed", []),
    ("button_reply", [{"text": "Approve", "choice": ("approve:42", "wamid.OFFER0001")}]),
    ("list_reply", [{"text": "Pro", "choice": ("plan-pro", "wamid.OFFER0002")}]),
    ("template_button", [{"text": "Talk to us", "choice": ("talk-to-agent", "wamid.TEMPLATE0001")}]),
    ("statuses", []),
    ("system", []),
    ("request_welcome", []),
    ("unsupported", [{"text": "[a message this gateway cannot show (unsupported)]"}]),
    ("order", [{"text": "[a message this gateway cannot show (order)]"}]),
    ("edit", [{"text": "Olá! Preço do plano anual?", "edited": "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQzQTdGRkE0001"}]),
    ("edit_caption", [{"text": "my receipt, March", "edited": "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQzQTdGRkE0002"}]),
    ("revoke", [{"text": "", "deleted": "wamid.HBgLMTU1NTEyMzQ1NjcVAgASGBQzQTdGRkE0001"}]),
]


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[c[0] for c in CASES])
async def test_sample_payloads_are_normalised(name: str, expected: list[dict[str, Any]]) -> None:
    data = payload(name)
    drafts = await receive(adapter(), data)
    assert len(drafts) == len(expected)
    sent = data["entry"][0]["changes"][0]["value"].get("messages", [])
    for draft, want, wire in zip(drafts, expected, sent, strict=False):
        assert draft.dedup_key == wire["id"] == draft.platform_message_id
        assert draft.conversation.channel == "whatsapp"
        assert (draft.conversation.account, draft.conversation.agent, draft.conversation.tenant) == (
            "default",
            "assistant",
            "acme",
        )
        assert draft.conversation.conversation == wire["from"] == draft.sender.id
        assert draft.sender.name == "Ana Souza"
        assert draft.conversation.extra == {
            "phone_number_id": PHONE_NUMBER_ID,
            "wa_id": wire["from"],
            "wamid": wire["id"],
        }
        assert draft.text == want["text"]
        if "attachments" in want:
            assert isinstance(draft.event, Posted)
            [attachment] = draft.event.attachments
            for key, value in want["attachments"][0].items():
                assert getattr(attachment, key) == value
        if "choice" in want:
            assert isinstance(draft.event, ChoiceSelected)
            assert (draft.event.option_id, draft.event.offer_message_id) == want["choice"]
            assert draft.event.offered is False  # checked against the recorded offers by the drain, not here
        elif "edited" in want:
            assert draft.event == MessageEdited(original_id=want["edited"])
            assert event_text(draft) == f"edited an earlier message to: {want['text']}"
        elif "deleted" in want:
            assert draft.event == MessageDeleted(original_id=want["deleted"])
            assert event_text(draft) is None and plan_turn([draft]).kind == "silent"  # recorded, never answered
        else:
            assert isinstance(draft.event, Posted)
            assert list(draft.event.shared) == want.get("shared", [])
            assert event_text(draft) == want.get("reads", want["text"])
        if "meta_reply_to" in want:
            assert draft.meta["reply_to"] == want["meta_reply_to"]


def where(c: ConversationRef) -> tuple[str, ...]:
    """What names a conversation's session."""
    return (c.channel, c.account, c.agent, c.tenant, c.conversation, c.thread or "")


async def test_statuses_are_delivery_reports_for_the_users_conversation_not_messages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel = adapter()
    request = post(*sign_request(payload("statuses"), SECRET))
    await channel.verify(request)
    with caplog.at_level(logging.INFO, logger="switchboard.channels.meta.whatsapp.inbound"):
        inbound = await channel.receive(request)
    assert inbound.messages == ()
    assert [(s.status, s.platform_id, s.error) for s in inbound.statuses] == [
        ("sent", "wamid.OUT0001", ""),
        ("delivered", "wamid.OUT0001", ""),
        ("read", "wamid.OUT0001", ""),
        ("failed", "wamid.OUT0002", "131047 Re-engagement message"),  # code and title, never the details text
    ]
    [text] = await receive(channel, text_delivery("hi", sender="15551234567"))
    assert {where(s.conversation) for s in inbound.statuses} == {where(text.conversation)}
    [failed] = caplog.records  # one WARNING, for the failure; the others are counted by /metrics, not logged
    assert failed.levelno == logging.WARNING and "wamid.OUT0002" in failed.getMessage()
    assert "24 hours" not in failed.getMessage()


async def test_odd_statuses_are_skipped_and_an_unknown_number_names_no_account() -> None:
    data = payload("statuses")
    statuses = data["entry"][0]["changes"][0]["value"]["statuses"]
    statuses[0]["status"] = "deleted"  # not a state we record
    del statuses[1]["recipient_id"]
    data["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"] = "999"
    inbound = await adapter().receive(post(*sign_request(data, SECRET)))
    assert [s.status for s in inbound.statuses] == ["read", "failed"]
    assert {s.conversation.account for s in inbound.statuses} == {"unclaimed:999"}  # dropped by the router


def two_numbers() -> BuildContext:
    return BuildContext(
        account="default",
        agent="assistant",
        accounts={"default": settings(), "sales": settings(phone_number_id=SECOND_NUMBER)},
    )


async def test_a_multi_entry_delivery_yields_every_message_for_its_own_number() -> None:
    drafts = await receive(adapter(two_numbers()), payload("multi_entry"))
    assert [d.text for d in drafts] == ["first", "second", "", "to the second number"]
    assert [d.conversation.account for d in drafts] == ["default", "default", "default", "sales"]
    assert [d.conversation.agent for d in drafts] == ["assistant"] * 3 + [""]  # the router routes "sales" itself
    assert [d.sender.name for d in drafts] == ["Ana Souza", "Bruno", "Ana Souza", "Carla"]


async def test_a_number_no_account_claims_gets_an_unclaimed_account_name() -> None:
    [draft] = await receive(adapter(), payload("unknown_number"))
    assert draft.conversation.account == "unclaimed:999999999999999"
    assert draft.conversation.agent == ""


async def test_an_account_of_another_app_is_never_claimed() -> None:
    context = BuildContext(
        accounts={"default": settings(), "other-app": settings(phone_number_id=SECOND_NUMBER, app_secret="x" * 32)}
    )
    drafts = await receive(adapter(context), payload("multi_entry"))
    assert drafts[-1].conversation.account == f"unclaimed:{SECOND_NUMBER}"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"object": "page", "entry": []}',
        b'{"object": "whatsapp_business_account", "entry": {}}',
        b'{"object": "whatsapp_business_account", "entry": [1]}',
    ],
)
async def test_malformed_bodies_are_400(body: bytes) -> None:
    channel = adapter()
    request = post(*sign_request(body, SECRET))
    await channel.verify(request)
    with pytest.raises(MalformedBodyError):
        await channel.receive(request)


# --------------------------------------------------------------------------- configuration


def test_the_factory_is_in_the_table_and_takes_get_for_the_handshake() -> None:
    assert factory("whatsapp") is FACTORY
    assert FACTORY.webhook_methods == frozenset({"GET", "POST"})
    assert FACTORY.fake == "switchboard.channels.meta.whatsapp.fake.platform"


def test_check_names_what_is_missing() -> None:
    found = problems(WhatsAppSettings(access_token="EAA"))  # type: ignore[arg-type]
    assert any("SWITCHBOARD_WHATSAPP__PHONE_NUMBER_ID" in p for p in found)
    assert any("SWITCHBOARD_WHATSAPP__APP_SECRET" in p for p in found)
    assert any("SWITCHBOARD_WHATSAPP__VERIFY_TOKEN" in p for p in found)
    assert problems(settings()) == []
    assert any("name:language" in p for p in problems(settings(window_template="Hello World")))


def test_window_templates_parse() -> None:
    assert parse_template("hello_world:en_US") == ("hello_world", "en_US")
    assert parse_template("bad template") is None
    assert parse_template(None) is None
