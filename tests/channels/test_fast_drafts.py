"""Drafts built without validating them again (``core.messages.trusted``) equal what validation makes of them.

The Telegram, Slack, WhatsApp, Messenger and Instagram readers build their hot-path drafts from the wire model pydantic
has just validated (or, for WhatsApp, from payload values each checked to be a ``str``) and skip validating the
copies. For every sample payload, validating each draft's dump (Python and JSON) must give the same model: a value of
the wrong type (an int for a str, a list for a tuple) fails validation or compares unequal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import BaseModel

from switchboard.channels.base import Channel, DeliveryStatus, RawRequest
from switchboard.channels.meta.instagram.adapter import InstagramChannel
from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.messaging.fake.payloads import IG_ACCOUNT_ID, PAGE_ID
from switchboard.channels.meta.messenger.adapter import MessengerChannel
from switchboard.channels.meta.messenger.settings import MessengerSettings
from switchboard.channels.meta.webhook import sign
from switchboard.channels.meta.whatsapp.adapter import WhatsAppChannel
from switchboard.channels.meta.whatsapp.fake.payloads import PHONE_NUMBER_ID
from switchboard.channels.meta.whatsapp.settings import WhatsAppSettings
from switchboard.channels.registry import BuildContext
from switchboard.channels.slack.adapter import SlackChannel
from switchboard.channels.slack.fake.payloads import sign_request
from switchboard.channels.slack.settings import SlackSettings
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.channels.web.adapter import WebChannel, parse_post
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    ConversationRef,
    InboundMessage,
    Posted,
    Sender,
    trusted,
)
from switchboard.errors import MalformedBodyError

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
META_SECRET = "5d41402abc4b2a76b9719d911017c592"
SECOND_NUMBER = "106540352242923"


def _request(path: str, body: bytes, headers: dict[str, str]) -> RawRequest:
    return RawRequest("POST", path, CIMultiDictProxy(CIMultiDict(headers)), {}, body)


def _assert_validates_to_itself(draft: InboundMessage) -> None:
    for model, cls in ((draft, InboundMessage), (draft.conversation, ConversationRef), (draft.sender, Sender)):
        _assert_model_validates_to_itself(model, cls)
    again = InboundMessage.model_validate_json(draft.model_dump_json())
    assert repr(again) == repr(draft)
    assert again.model_dump_json() == draft.model_dump_json()
    assert again.session_key == draft.session_key
    if isinstance(draft.event, Posted):
        for attachment in draft.event.attachments:
            _assert_model_validates_to_itself(attachment, type(attachment))


def _assert_model_validates_to_itself(model: BaseModel, cls: type[BaseModel]) -> None:
    assert type(model) is cls
    assert cls.model_validate(model.model_dump(), strict=True) == model
    assert cls.model_validate_json(model.model_dump_json()) == model
    assert list(model.__dict__) == list(cls.model_fields)  # field order, as validation stores them
    assert repr(cls.model_validate(model.model_dump(), strict=True)) == repr(model)


async def _telegram_drafts(require_mention: bool) -> list[InboundMessage]:
    settings = TelegramSettings.model_validate(
        {"bot_token": "123456:TEST-token", "secret_token": "s", "bot_username": "switchboard_test_bot"}
    )
    channel = TelegramChannel(settings, require_mention=require_mention, agent="assistant", tenant="acme")
    found: list[InboundMessage] = []
    for path in sorted((PAYLOADS / "telegram").glob("*.json")):
        try:
            inbound = await channel.receive(_request("/webhooks/telegram", path.read_bytes(), {}))
        except MalformedBodyError:
            continue
        found += inbound.messages
    await channel.aclose()
    return found


async def _slack_drafts(require_mention: bool) -> list[InboundMessage]:
    settings = SlackSettings.model_validate({"bot_token": "xoxb-1-test", "signing_secret": SLACK_SECRET})
    channel = SlackChannel(settings, require_mention=require_mention, agent="assistant", tenant="acme")
    found: list[InboundMessage] = []
    for path in sorted((PAYLOADS / "slack").glob("*.json")):
        payload: dict[str, Any] = json.loads(path.read_text())
        body, headers = sign_request(payload, SLACK_SECRET, form=path.name.endswith(".form.json"))
        found += (await channel.receive(_request("/webhooks/slack", body, headers))).messages
    await channel.aclose()
    return found


async def _meta_inbound(channel: Channel, folder: str) -> tuple[list[InboundMessage], list[DeliveryStatus]]:
    """Every draft and report of every sample payload of ``folder``, received through the adapter's verify."""
    drafts: list[InboundMessage] = []
    reports: list[DeliveryStatus] = []
    for path in sorted((PAYLOADS / folder).glob("*.json")):
        body = path.read_bytes()
        request = _request(f"/webhooks/{folder}", body, {"X-Hub-Signature-256": sign(body, META_SECRET)})
        await channel.verify(request)
        inbound = await channel.receive(request)
        drafts += inbound.messages
        reports += inbound.statuses
    await channel.aclose()
    return drafts, reports


def _assert_meta_drafts(drafts: list[InboundMessage], reports: list[DeliveryStatus], own: str, least: int) -> None:
    assert len(drafts) >= least
    for draft in drafts:
        _assert_validates_to_itself(draft)
        routed = ("assistant", "acme") if draft.conversation.account == own else ("", "default")
        assert (draft.conversation.agent, draft.conversation.tenant, draft.id) == (*routed, "")
    for report in reports:
        _assert_model_validates_to_itself(report.conversation, ConversationRef)


async def test_every_whatsapp_sample_draft_and_report_equals_its_validated_self() -> None:
    own = WhatsAppSettings.model_validate(
        {"access_token": "EAA", "app_secret": META_SECRET, "phone_number_id": PHONE_NUMBER_ID}
    )
    second = own.model_copy(update={"phone_number_id": SECOND_NUMBER})
    context = BuildContext(agent="assistant", tenant="acme", accounts={"default": own, "second": second})
    drafts, reports = await _meta_inbound(WhatsAppChannel(own, context), "whatsapp")
    _assert_meta_drafts(drafts, reports, "default", 20)
    assert {d.conversation.account for d in drafts} >= {"default", "second"}  # routed and unrouted conversations
    assert any(isinstance(d.event, Posted) and d.event.attachments for d in drafts) and len(reports) >= 2
    assert all(d.event.kind != "message" or type(d.event) is Posted for d in drafts)


async def test_every_messenger_and_instagram_sample_draft_and_report_equals_its_validated_self() -> None:
    context = BuildContext(agent="assistant", tenant="acme")
    page = MessengerSettings.model_validate(
        {"page_access_token": "EAAG", "app_secret": META_SECRET, "page_id": PAGE_ID}
    )
    drafts, reports = await _meta_inbound(MessengerChannel(page, context), "messenger")
    _assert_meta_drafts(drafts, reports, "default", 12)
    assert any(isinstance(d.event, Posted) and d.event.attachments for d in drafts) and reports
    ig = InstagramSettings.model_validate(
        {"access_token": "IG", "app_secret": META_SECRET, "account_id": IG_ACCOUNT_ID}
    )
    drafts, reports = await _meta_inbound(InstagramChannel(ig, context), "instagram")
    _assert_meta_drafts(drafts, reports, "default", 10)
    assert any(isinstance(d.event, Posted) and d.event.attachments for d in drafts) and reports


@pytest.mark.parametrize("require_mention", [True, False])
async def test_every_telegram_sample_draft_equals_its_validated_self(require_mention: bool) -> None:
    drafts = await _telegram_drafts(require_mention)
    assert len(drafts) >= 15  # the table's messages, commands, edits, photos and button taps
    for draft in drafts:
        _assert_validates_to_itself(draft)
        assert (draft.conversation.agent, draft.conversation.tenant, draft.id) == ("assistant", "acme", "")


@pytest.mark.parametrize("require_mention", [True, False])
async def test_every_slack_sample_draft_equals_its_validated_self(require_mention: bool) -> None:
    drafts = await _slack_drafts(require_mention)
    assert len(drafts) >= 6
    for draft in drafts:
        _assert_validates_to_itself(draft)
        assert (draft.conversation.agent, draft.conversation.tenant, draft.id) == ("assistant", "acme", "")


def test_trusted_takes_exactly_the_fields_and_refuses_a_missing_or_unknown_one() -> None:
    sender = trusted(Sender, id="7", name="Ann", is_bot=False)
    assert sender == Sender(id="7", name="Ann") and list(sender.__dict__) == ["id", "name", "is_bot"]
    assert isinstance(sender, BaseModel) and hash(sender) == hash(Sender(id="7", name="Ann"))
    with pytest.raises(TypeError):
        trusted(Sender, id="7", name="Ann")
    with pytest.raises(TypeError):
        trusted(Sender, id="7", name="Ann", is_bot=False, extra="x")


def test_every_web_chat_sample_draft_equals_its_validated_self() -> None:
    conversation = ConversationRef(tenant="acme", agent="assistant", channel="web", conversation="c0ffee")
    channel = WebChannel(None)
    drafts = [
        channel.inbound(conversation, parse_post(path.read_bytes()))
        for path in sorted((PAYLOADS / "web").glob("*.json"))
    ]
    upload = Attachment(kind="image", ref="u1", name="a.png", mime_type="image/png", size=3)
    drafts.append(channel.inbound(conversation, parse_post(b'{"text": "", "attachments": ["u1"]}'), (upload,)))
    assert len(drafts) >= 8 and any(isinstance(d.event, ChoiceSelected) for d in drafts)
    for draft in drafts:
        _assert_validates_to_itself(draft)
