"""An offered choice in real Chromium against a real ``switchboard run``: buttons, a click, the agent's answer.

The offline model never offers a choice, so the test publishes the offer into the session's web stream and records
it the way a worker does (under the session's lease, through the web channel adapter); the click then goes through the
page, the public API, the queue and a real worker like any message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from playwright.async_api import expect

from switchboard.channels.web.adapter import WebChannel, split_session_key
from switchboard.cli.sessions import REDIS_URL_FILE
from switchboard.core.actions import Choice, OfferChoice
from switchboard.outbound.outbox import Ephemeral
from switchboard.outbound.webstream import WebStreamPublisher
from switchboard.queue.connection import async_client
from switchboard.queue.lease import CURRENT_LEASE, Lease
from switchboard.queue.offers import record_offer
from switchboard.types import SessionKey
from tests.browser.conftest import CHROMIUM, GUARD_MS, SKIP_REASON, ChatPage, Gateway

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

OpenChat = Callable[[], Awaitable[ChatPage]]


async def _offer(gateway: Gateway, session: SessionKey, offer: OfferChoice) -> None:
    """Publish ``offer`` as the worker would, once the session's lease is free (its reply is done)."""
    url = (gateway.stdout.parent / "data" / REDIS_URL_FILE).read_text().strip()
    redis = async_client(url)
    try:
        leases = Lease(redis, worker_id="browser-test", lease_ms=10_000)
        async with asyncio.timeout(GUARD_MS / 1000):  # a guard against hanging, not a timing assertion
            while (lease := await leases.acquire(session)) is None:
                await asyncio.sleep(0.05)
        reset = CURRENT_LEASE.set(lease)
        try:
            publisher = WebStreamPublisher(redis)
            await WebChannel(publisher.publish).perform(offer, split_session_key(session), Ephemeral("offer"))
            await record_offer(redis, lease, offer, "offer")  # as the drain does: a click is checked against it
        finally:
            CURRENT_LEASE.reset(reset)
            await leases.abandon(lease)
    finally:
        await redis.aclose()


async def test_an_offered_choice_shows_buttons_and_a_click_is_answered(open_chat: OpenChat, gateway: Gateway) -> None:
    chat = await open_chat()
    await chat.type_and_send("hello")
    await chat.wait_answered(1)
    session = SessionKey(f"default/assistant/web/default/{await chat.session()}")
    options = [Choice(id="plan-basic", label="Basic plan"), Choice(id="plan-pro", label="Pro plan")]
    await _offer(gateway, session, OfferChoice(question="Which plan?", options=options, reply_to="offer-1"))
    buttons = chat.page.get_by_test_id("msg-choices").locator("button")
    await expect(buttons).to_have_text(["Basic plan", "Pro plan"], timeout=GUARD_MS)
    await buttons.nth(1).click()
    await expect(buttons.nth(0)).to_be_disabled()
    await chat.wait_answered(3)  # the hello, the offer, and the answer to the click
    transcript = await chat.transcript()
    assert ("user", "Pro plan") in transcript
    # the offline model echoes what it read: a verified pick, not an unverified click
    assert "chose option plan-pro (Pro plan)" in transcript[-1][1] and transcript[-1][0] == "assistant"
