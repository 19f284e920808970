"""The Teams adapter against the fake Bot Framework: tokens checked with the fake's keys, activities normalised,
replies posted under the service URL's path, cards, edits, typing, the bot token and the signing keys cached."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from switchboard.channels.render.split import measure
from switchboard.channels.render.teams import MAX_TEXT, render_parts, render_teams
from switchboard.channels.teams.adapter import ACCEPTED, TeamsChannel
from switchboard.channels.teams.factory import problems
from switchboard.channels.teams.fake.platform import FakeTeams, SigningKey
from switchboard.core.actions import (
    AckChoice,
    Choice,
    EditText,
    OfferChoice,
    SendError,
    SendText,
    SendTyping,
    StreamText,
)
from switchboard.core.messages import ChoiceSelected, MessageDeleted, MessageEdited, Posted
from switchboard.errors import DeliveryError, RateLimitedError, SignatureError
from tests.channels.slack_support import AttemptProgress, Progress
from tests.channels.teams_support import (
    APP_ID,
    BOT_ID,
    PASSWORD,
    PAYLOADS,
    make_channel,
    payload,
    personal,
    raw,
    signed_request,
    teams_settings,
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTeams]:
    async with FakeTeams(app_id=APP_ID, app_password=PASSWORD) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeTeams) -> AsyncIterator[TeamsChannel]:
    adapter = make_channel(fake)
    yield adapter
    await adapter.aclose()


# --------------------------------------------------------------------------- inbound

PERSONAL = "a:1HkC_personal-chat-id"
GROUP = "19:meeting_group-chat@thread.v2"
THREAD = "19:general-channel-id@thread.tacv2;messageid=1764617400300"

CASES: list[tuple[str, dict[str, Any] | None]] = [
    ("personal.json", {"kind": "message", "text": "What is the **status** of order 42?", "conversation": PERSONAL}),
    ("group_mention.json", {"kind": "message", "text": "summarise this chat please", "conversation": GROUP}),
    ("group_no_mention.json", None),
    ("channel_thread_mention.json", {"kind": "message", "text": "draft the release notes", "conversation": THREAD}),
    ("channel_thread_reply_no_mention.json", None),
    ("card_submit.json", {"kind": "choice", "text": "Approve", "conversation": PERSONAL, "option": "approve"}),
    # an Input.ChoiceSet (id switchboard_choice) submitted with its card: the value is the picked option's
    (
        "card_choice_set.json",
        {"kind": "choice", "text": "fruit.banana", "conversation": PERSONAL, "option": "fruit.banana"},
    ),
    ("conversation_update.json", None),
    ("installation_update.json", None),
    ("typing.json", None),
    ("own_message.json", None),
    (
        "message_update.json",
        {
            "kind": "edited",
            "text": "What is the status of order 43?",
            "conversation": PERSONAL,
            "original": "1764617400123",
        },
    ),
    ("message_delete.json", {"kind": "deleted", "text": "", "conversation": PERSONAL, "original": "1764617400123"}),
    ("file_attachment.json", {"kind": "message", "text": "", "conversation": PERSONAL, "files": 1}),
]


def test_every_payload_file_is_in_the_table() -> None:
    assert sorted(p.name for p in PAYLOADS.glob("*.json")) == sorted(name for name, _ in CASES)


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[name for name, _ in CASES])
async def test_payloads_verify_and_normalise(
    fake: FakeTeams, channel: TeamsChannel, name: str, expected: dict[str, Any] | None
) -> None:
    request = raw(*signed_request(fake, payload(name, fake.service_url)))
    await channel.verify(request)
    inbound = await channel.receive(request)
    assert inbound.answer == ACCEPTED
    if expected is None:
        assert inbound.messages == ()
        return
    (message,) = inbound.messages
    conversation = message.conversation
    assert conversation.channel == "teams" and conversation.conversation == expected["conversation"]
    assert conversation.extra["service_url"] == fake.service_url  # the verified one: replies go there only
    assert conversation.extra["bot_id"] == BOT_ID
    assert message.text == expected["text"]
    event = message.event
    match expected["kind"]:
        case "message":
            assert isinstance(event, Posted) and len(event.attachments) == expected.get("files", 0)
        case "choice":
            assert isinstance(event, ChoiceSelected) and event.option_id == expected["option"]
            assert event.offer_message_id == "1:000123"
        case "edited":
            assert isinstance(event, MessageEdited) and event.original_id == expected["original"]
        case "deleted":
            assert isinstance(event, MessageDeleted) and event.original_id == expected["original"]


async def test_personal_group_and_thread_are_separate_sessions(fake: FakeTeams, channel: TeamsChannel) -> None:
    keys = set()
    for name in ("personal.json", "group_mention.json", "channel_thread_mention.json"):
        request = raw(*signed_request(fake, payload(name, fake.service_url)))
        await channel.verify(request)
        (message,) = (await channel.receive(request)).messages
        keys.add(message.session_key)
    assert len(keys) == 3


async def test_without_require_mention_group_chatter_reaches_the_agent(fake: FakeTeams) -> None:
    channel = make_channel(fake, require_mention=False)
    try:
        request = raw(*signed_request(fake, payload("group_no_mention.json", fake.service_url)))
        await channel.verify(request)
        (message,) = (await channel.receive(request)).messages
        assert message.text == "<at>Grace</at> lunch?"  # only the bot's own mention is removed
    finally:
        await channel.aclose()


async def test_an_edit_is_not_taken_for_a_resend_of_the_message(fake: FakeTeams, channel: TeamsChannel) -> None:
    keys = []
    for name in ("personal.json", "message_update.json", "message_delete.json"):
        activity = payload(name, fake.service_url)
        activity["id"] = "1764617400123"
        request = raw(*signed_request(fake, activity))
        (message,) = (await channel.receive(request)).messages
        keys.append(message.dedup_key)
    assert len(set(keys)) == 3


async def test_signing_keys_are_fetched_once_and_again_only_for_a_new_kid(fake: FakeTeams) -> None:
    channel = TeamsChannel(teams_settings(fake), key_refresh_cooldown_s=0.0)
    try:
        for _ in range(5):
            await channel.verify(raw(*signed_request(fake, payload("personal.json", fake.service_url))))
        assert (fake.metadata_requests, fake.keys_requests) == (1, 1)
        rotated = SigningKey("rotated-key")
        fake.extra_keys.append(rotated)  # Microsoft publishes a new key; tokens start naming it
        activity = payload("personal.json", fake.service_url)
        body = json.dumps(activity).encode()
        await channel.verify(raw(body, rotated.authorization(APP_ID, fake.service_url)))
        assert fake.keys_requests == 2
    finally:
        await channel.aclose()


async def test_unknown_kids_refetch_the_keys_at_most_once_per_cooldown(fake: FakeTeams, channel: TeamsChannel) -> None:
    await channel.verify(raw(*signed_request(fake, payload("personal.json", fake.service_url))))
    body = json.dumps(payload("personal.json", fake.service_url)).encode()
    for n in range(20):
        with pytest.raises(SignatureError):
            await channel.verify(raw(body, SigningKey(f"forged-{n}").authorization(APP_ID, fake.service_url)))
    assert fake.keys_requests == 1  # within the 5-minute cool-down: forged kids cost Microsoft nothing


# --------------------------------------------------------------------------- outbound


async def test_a_reply_is_posted_under_the_service_url_path_as_markdown(fake: FakeTeams, channel: TeamsChannel) -> None:
    receipt = await channel.perform(SendText(text="**Done**: order 42 <shipped>"), personal(fake), Progress())
    (call,) = fake.sent(PERSONAL)
    assert call.prefix == "/amer/"  # appended under the service URL's path, never at the host's root
    assert call.body["textFormat"] == "markdown" and call.body["text"] == "**Done**: order 42 &lt;shipped&gt;"
    assert call.body["from"] == {"id": BOT_ID}
    assert receipt.platform_ids == (next(iter(fake.messages))[1],)  # the id the Connector answered


async def test_the_bot_token_is_fetched_once_and_renewed_after_a_401(fake: FakeTeams, channel: TeamsChannel) -> None:
    for n in range(3):
        await channel.perform(SendText(text=f"reply {n}"), personal(fake), Progress())
    assert fake.token_requests == 1
    fake._tokens.clear()  # the Connector no longer accepts it (revoked)
    with pytest.raises(DeliveryError) as refused:
        await channel.perform(SendText(text="after revocation"), personal(fake), Progress())
    assert refused.value.retryable
    await channel.perform(SendText(text="after revocation"), personal(fake), Progress())
    assert fake.token_requests == 2 and len(fake.sent(PERSONAL)) == 4


async def test_wrong_credentials_are_a_clear_failure_not_a_retry(fake: FakeTeams) -> None:
    channel = make_channel(fake, app_password="wrong")
    try:
        with pytest.raises(DeliveryError, match="APP_PASSWORD") as refused:
            await channel.perform(SendText(text="hi"), personal(fake), Progress())
        assert not refused.value.retryable and PASSWORD not in str(refused.value)
    finally:
        await channel.aclose()


async def test_a_long_reply_is_split_within_the_limit_and_resumes(fake: FakeTeams, channel: TeamsChannel) -> None:
    text = "\n\n".join(f"Paragraph {n}: " + "ünïcödé 🙂 words " * 60 for n in range(60))
    progress = AttemptProgress()
    fake.fail_next(1, status=502)
    calls_before = len(fake.calls)
    with pytest.raises(DeliveryError) as first:
        await channel.perform(SendText(text=text), personal(fake), progress)
    assert first.value.retryable and progress.parts == []
    progress.next_attempt()
    await channel.perform(SendText(text=text), personal(fake), progress)
    posted = fake.sent(PERSONAL)
    assert len(posted) == len(progress.parts) >= 3 and len(fake.calls) == calls_before + 1 + len(posted)
    assert all(measure(c.body["text"], "utf16") <= MAX_TEXT for c in posted)
    assert " ".join(c.body["text"] for c in posted).split() == text.split()


async def test_a_retry_resumes_after_the_parts_already_sent(fake: FakeTeams, channel: TeamsChannel) -> None:
    text = "\n\n".join("block " * 3000 for _ in range(3))
    parts = render_parts(text)
    progress = AttemptProgress()
    progress.earlier = ["1:already"]
    await channel.perform(SendText(text=text), personal(fake), progress)
    assert len(fake.sent(PERSONAL)) == len(parts) - 1


async def test_rate_limits_and_refusals_are_classified(fake: FakeTeams, channel: TeamsChannel) -> None:
    fake.fail_next(1, status=429, retry_after=7)
    with pytest.raises(RateLimitedError) as limited:
        await channel.perform(SendText(text="hi"), personal(fake), Progress())
    assert limited.value.retry_after == 7
    fake.fail_next(1, status=403, retry_after=None)
    with pytest.raises(DeliveryError) as refused:
        await channel.perform(SendText(text="hi"), personal(fake), Progress())
    assert not refused.value.retryable and not isinstance(refused.value, RateLimitedError)


async def test_edit_typing_and_error(fake: FakeTeams, channel: TeamsChannel) -> None:
    receipt = await channel.perform(SendText(text="draft"), personal(fake), Progress())
    (sent_id,) = receipt.platform_ids
    await channel.perform(EditText(message_id=sent_id, text="final *answer*"), personal(fake), Progress())
    (update,) = fake.updates(PERSONAL)
    assert (
        update.prefix == "/amer/"
        and update.activity_id == sent_id
        and fake.messages[(PERSONAL, sent_id)] == ("final *answer*")
    )
    typing = await channel.perform(SendTyping(), personal(fake), Progress())
    assert typing.parts == 0 and len(fake.sent(PERSONAL, kind="typing")) == 1
    await channel.perform(SendError(code="x", message="failed: *not* <b>markup</b>"), personal(fake), Progress())
    assert fake.sent(PERSONAL)[-1].body["text"] == r"failed: \*not\* &lt;b&gt;markup&lt;/b&gt;"
    assert (await channel.perform(AckChoice(ack_ref="x"), personal(fake), Progress())).parts == 0
    before = len(fake.sent(PERSONAL))
    streamed = await channel.perform(StreamText(text="partial"), personal(fake), Progress())
    assert streamed.detail == {"streaming": "unavailable"} and len(fake.sent(PERSONAL)) == before


async def test_a_choice_is_an_adaptive_card_whose_click_comes_back(fake: FakeTeams, channel: TeamsChannel) -> None:
    options = [Choice(id="approve", label="Approve"), Choice(id="reject", label="Reject the change request now please")]
    receipt = await channel.perform(OfferChoice(question="Deploy **v2**?", options=options), personal(fake), Progress())
    (call,) = fake.sent(PERSONAL)
    (attachment,) = call.body["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["body"][0]["text"] == "Deploy **v2**?"
    clicked = card["actions"][1]
    assert clicked["type"] == "Action.Submit" and len(clicked["title"]) <= 40
    click = payload("card_submit.json", fake.service_url) | {
        "value": clicked["data"],
        "replyToId": receipt.platform_ids[0],
    }
    request = raw(*signed_request(fake, click))
    await channel.verify(request)
    (message,) = (await channel.receive(request)).messages
    assert isinstance(message.event, ChoiceSelected)
    assert message.event.option_id == "reject" and message.event.offer_message_id == receipt.platform_ids[0]


# --------------------------------------------------------------------------- markdown and check


def test_markdown_keeps_what_teams_renders_and_neutralises_the_rest() -> None:
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    rendered = render_teams(f"**bold** <at>Everyone</at> & `x < y`\n\n{table}\n\n```\n<raw>\n```")
    assert rendered.startswith("**bold** &lt;at&gt;Everyone&lt;/at&gt; &amp; `x < y`")
    assert "```\n| a | b |\n|---|---|\n| 1 | 2 |\n```" in rendered  # tables are not rendered in messages
    assert rendered.endswith("```\n<raw>\n```")  # code stays literal


def test_check_says_what_is_missing() -> None:
    from switchboard.channels.teams.settings import TeamsSettings

    found = problems(TeamsSettings(app_id=APP_ID, login_base_url="ftp://x"))
    assert any("SWITCHBOARD_TEAMS__APP_PASSWORD" in p for p in found)
    assert any("SWITCHBOARD_TEAMS__LOGIN_BASE_URL" in p for p in found)
    assert problems(TeamsSettings(app_id=APP_ID, app_password="s")) == []


async def test_the_bot_token_is_renewed_shortly_before_it_expires(fake: FakeTeams) -> None:
    import aiohttp

    from switchboard.channels.teams.api import BotToken

    now = [1000.0]
    async with aiohttp.ClientSession() as http:
        token = BotToken(fake.base_url, "contoso.onmicrosoft.com", APP_ID, PASSWORD, lambda: http, clock=lambda: now[0])
        first = await token.get()
        now[0] += 3599 - 301  # the fake's tokens live 3,599 s: still more than five minutes left
        assert await token.get() == first and fake.token_requests == 1
        now[0] += 2  # now less than five minutes
        assert await token.get() != first and fake.token_requests == 2
    assert token.url == f"{fake.base_url}/contoso.onmicrosoft.com/oauth2/v2.0/token"


async def test_concurrent_first_activities_share_one_key_fetch_on_the_same_loop(fake: FakeTeams) -> None:
    """The fake serves the keys on this very event loop: a blocking fetch would deadlock here, not just be slow."""
    import asyncio

    channel = make_channel(fake)
    try:
        requests = [raw(*signed_request(fake, payload("personal.json", fake.service_url))) for _ in range(20)]
        await asyncio.wait_for(asyncio.gather(*(channel.verify(r) for r in requests)), 10)
        assert (fake.metadata_requests, fake.keys_requests) == (1, 1)
    finally:
        await channel.aclose()
