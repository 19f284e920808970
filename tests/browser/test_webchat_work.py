"""The agent's work in the web chat, in real Chromium against a real ``switchboard run``.

Tool cards, file cards, approval cards, the stop notice, the empty state and the icons, each checked on the page as a
user sees it, at a phone's width (390 px) and a desktop's (1280 px), with screenshots saved under the test's tmp dir.

The offline model neither calls a shell nor sends files, so tests publish the stream entries of the web chat
contract (``docs/channels/web-chat.md``) into the session's web stream with the gateway's own publisher, under the
session's lease as a worker does; the gateway serves them to the page like any other entry. The empty state's
starters and the stop button run end to end.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import pytest
from playwright.async_api import Page, expect

from switchboard.cli.sessions import REDIS_URL_FILE
from switchboard.core.actions import Choice, OfferChoice
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

GATEWAY_CONFIG: Final = """
default_agent: assistant
agents:
  assistant:
    profile:
      name: Report helper
      description: Builds reports from your files.
      starters: [{label: Summarise my week, text: "Summarise my week, please"}, "What time is it?"]
    instructions: You are a test assistant.
    tools: [current_time]
"""
"""The gateway of this module: an agent with a description and starters, for the empty state."""

"""Stream entry types of the web chat contract that the publisher of this branch may not list yet."""

PHONE: Final = {"width": 390, "height": 844}
DESKTOP: Final = {"width": 1280, "height": 800}
PNG_1X1: Final = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="

LAYOUT_JS: Final = """() => {
  const width = innerWidth;
  const list = document.querySelector('[data-testid=message-list]').getBoundingClientRect();
  const scroller = document.getElementById('conversation');
  const cards = Array.from(
    document.querySelectorAll('[data-testid=tool-card], [data-testid=msg-file], [data-testid=approval-card]'),
    (node) => { const r = node.getBoundingClientRect(); return {testid: node.dataset.testid, left: r.left,
                                                                right: r.right}; });
  const pills = Array.from(document.querySelectorAll('.choice, .tool-state, .file-meta'), (node) => ({
    text: node.textContent, scroll: node.scrollWidth, client: node.clientWidth}));
  return {
    width,
    page: document.scrollingElement.scrollWidth,
    scroller: [scroller.scrollWidth, scroller.clientWidth],
    list: {left: list.left, right: list.right},
    cards,
    overflowing: pills.filter((p) => p.scroll > p.client + 1),
  };
}"""


async def _session(chat: ChatPage) -> SessionKey:
    return SessionKey(f"default/assistant/web/default/{await chat.session()}")


async def _publish(
    gateway: Gateway, chat: ChatPage, events: list[tuple[str, dict[str, Any]]], offer: OfferChoice | None = None
) -> None:
    """Append ``events`` to the chat's web stream as a worker does: the gateway's publisher, under the lease.

    ``offer`` is also recorded as offered, as the drain does when it sends one, so a click on it is accepted.
    """
    session = await _session(chat)
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
            for kind, data in events:
                await publisher.publish(session, kind, data)
            if offer is not None:
                await record_offer(redis, lease, offer, "offer")
        finally:
            CURRENT_LEASE.reset(reset)
            await leases.abandon(lease)
    finally:
        await redis.aclose()


async def _layout(page: Page, tmp_path: Path, name: str) -> None:
    """At 390 px and at 1280 px: screenshot, then nothing wider than the viewport, pills and cards inside."""
    for size in (PHONE, DESKTOP):
        await page.set_viewport_size(size)  # type: ignore[arg-type]
        await page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        shot = tmp_path / f"{name}-{size['width']}.png"
        await page.screenshot(path=str(shot), full_page=True)
        box: dict[str, Any] = await page.evaluate(LAYOUT_JS)
        where = f"at {size['width']} px (screenshot: {shot}): {json.dumps(box)}"
        assert box["page"] <= box["width"], f"the page scrolls sideways {where}"
        assert box["scroller"][0] <= box["scroller"][1], f"the conversation scrolls sideways {where}"
        assert box["overflowing"] == [], f"a label overflows its pill {where}"
        for card in box["cards"]:
            inside = card["left"] >= box["list"]["left"] - 0.5 and card["right"] <= box["list"]["right"] + 0.5
            assert inside, f"a {card['testid']} sticks out of the message list {where}"


def _tool(call_id: str, state: str, **fields: Any) -> dict[str, Any]:
    return {
        "reply_to": "work-1",
        "call_id": call_id,
        "tool": "shell",
        "title": "shell: ls -la /workspace",
        "arguments": '{"command": "ls -la /workspace"}',
        "state": state,
        "started_at": time.time(),
        "duration_ms": None,
        "exit_status": None,
        "output_head": "",
        "output_tail": "",
        "omitted_lines": 0,
        "files": [],
    } | fields


async def test_a_tool_call_is_one_card_updated_in_place(open_chat: OpenChat, gateway: Gateway, tmp_path: Path) -> None:
    chat = await open_chat()
    page = chat.page
    await _publish(gateway, chat, [("tool", _tool("call-1", "running"))])
    card = page.get_by_test_id("tool-card")
    await expect(card).to_have_count(1, timeout=GUARD_MS)
    await expect(card).to_have_attribute("data-state", "running")
    await expect(card).to_have_attribute("open", "")  # open while it runs
    await expect(card.locator(".icon-spinner")).to_be_visible()
    await expect(card.locator("summary")).to_contain_text("shell: ls -la /workspace")
    await expect(card.locator(".tool-meta")).to_have_text(re.compile(r"^\d+ s$"))  # a running clock, in seconds

    head = "\n".join(f"line {n}" for n in range(1, 21))
    tail = "\n".join(f"line {n}" for n in range(63, 66))
    wide = "x" * 600  # one very long line: it scrolls inside the card, never the page
    done = _tool(
        "call-1",
        "ok",
        duration_ms=1234.5,
        exit_status=0,
        output_head=head,
        output_tail=f"{tail}\n{wide}",
        omitted_lines=42,
        files=[{"name": "report.csv", "path": "report.csv"}],
    )
    failed = _tool("call-2", "failed", title="shell: false", duration_ms=12.0, exit_status=1, output_head="boom")
    await _publish(gateway, chat, [("tool", done), ("tool", failed)])
    await expect(card).to_have_count(2, timeout=GUARD_MS)
    first = card.nth(0)
    await expect(first).to_have_attribute("data-state", "ok")
    await expect(first).not_to_have_attribute("open", "")  # collapsed once finished
    summary = first.locator("summary")
    await expect(summary).to_contain_text("exit 0")
    await expect(summary).to_contain_text("1.2 s")
    await expect(card.nth(1)).to_have_attribute("data-state", "failed")
    await expect(card.nth(1).locator("summary")).to_contain_text("exit 1")

    await summary.focus()
    await page.keyboard.press("Enter")  # keyboard accessible
    await expect(first).to_have_attribute("open", "")
    output = first.get_by_test_id("tool-output")
    await expect(output).to_contain_text("line 20")
    await expect(output).to_contain_text("… 42 lines omitted …")
    await expect(output).to_contain_text("line 65")
    await expect(first.get_by_test_id("tool-arguments")).to_contain_text('"command": "ls -la /workspace"')
    await expect(first.get_by_test_id("tool-files")).to_contain_text("report.csv")
    scrolls = await output.evaluate("(pre) => pre.scrollWidth > pre.clientWidth")
    assert scrolls, "the long output line scrolls inside its card"
    await _layout(page, tmp_path, "tool-cards")


async def test_a_sent_file_is_a_card_in_its_place_with_its_name_once(
    open_chat: OpenChat, gateway: Gateway, tmp_path: Path
) -> None:
    chat = await open_chat()
    page = chat.page
    csv = b"name,count\n" + b"apples,3\n" * 150
    made = _tool("call-9", "ok", duration_ms=80.0, exit_status=0, files=[{"name": "report.csv", "path": "report.csv"}])
    events = [
        ("tool", made),
        (
            "message",
            {
                "text": "",
                "reply_to": "work-1",
                "file": {
                    "name": "report.csv",
                    "mime_type": "text/csv",
                    "size": len(csv),
                    "data": base64.b64encode(csv).decode(),
                },
            },
        ),
        (
            "message",
            {
                "text": "The chart",
                "reply_to": "work-1",
                "file": {"name": "chart.png", "mime_type": "image/png", "size": 70, "data": PNG_1X1},
            },
        ),
        ("message", {"text": "Here are your files.", "reply_to": "work-1"}),
    ]
    await _publish(gateway, chat, events)
    await chat.wait_answered(1)
    files = page.get_by_test_id("msg-file")
    await expect(files).to_have_count(2, timeout=GUARD_MS)
    order: list[str] = await page.evaluate(
        """() => Array.from(document.querySelectorAll(
             '[data-testid=msg-assistant] [data-testid=tool-card], [data-testid=msg-assistant] [data-testid=msg-file],'
             + '[data-testid=msg-assistant] .body'),
           (n) => n.dataset.testid || 'answer')"""
    )
    assert order == ["tool-card", "msg-file", "msg-file", "answer"], order  # in their place: after the call, before
    report = files.nth(0)
    await expect(report).to_contain_text("1.3 KB")
    await expect(report).to_contain_text("text/csv")
    link = report.get_by_test_id("file-download")
    await expect(link).to_have_attribute("download", "report.csv")
    href = await link.get_attribute("href")
    assert (
        href is not None
        and base64.b64decode(href.split(",", 1)[1]) == csv
        and href.startswith("data:application/octet-stream;")
    )
    bubble_text = await page.get_by_test_id("msg-assistant").inner_text()
    assert bubble_text.count("chart.png") == 1, bubble_text  # the name once, on its card
    assert "The chart" in bubble_text
    preview = files.nth(1).get_by_test_id("file-preview")
    await expect(preview).to_be_visible()
    assert await preview.evaluate("(img) => img.complete && img.naturalWidth === 1")
    await expect(report.get_by_test_id("file-preview")).to_have_count(0)  # no preview for a CSV
    await _layout(page, tmp_path, "files")


async def test_an_approval_card_shows_what_and_why_and_settles(
    open_chat: OpenChat, gateway: Gateway, tmp_path: Path
) -> None:
    chat = await open_chat()
    page = chat.page
    long_label = "Approve and remember this for every later call of the same tool in this conversation"
    options = [Choice(id="ap-1:approve", label=long_label), Choice(id="ap-1:deny", label="Deny")]
    offer = OfferChoice(question="Run this command?", options=options, reply_to="work-2")
    message = {
        "text": "Run this command?",
        "reply_to": "work-2",
        "choices": [{"id": o.id, "label": o.label} for o in options],
        "approval": {
            "id": "ap-1",
            "tool": "shell",
            "title": "shell: rm -rf /workspace/build " + "--verbose " * 20,
            "reason": "Deleting files needs a person's approval.",
            "expires_at": time.time() + 600,
        },
    }
    await _publish(gateway, chat, [("message", message)], offer=offer)
    card = page.get_by_test_id("approval-card")
    await expect(card).to_be_visible(timeout=GUARD_MS)
    await expect(card).to_contain_text("shell: rm -rf /workspace/build")
    await expect(card).to_contain_text("Deleting files needs a person's approval.")
    await expect(card).to_contain_text("Expires")
    buttons = page.get_by_test_id("msg-choices").locator("button")
    await expect(buttons).to_have_count(2)
    await expect(buttons.nth(0)).to_be_enabled()
    await _layout(page, tmp_path, "approval-open")

    settled = {"ids": ["ap-1:approve", "ap-1:deny"], "chosen": "ap-1:deny", "label": "Denied", "by": "console:alice"}
    await _publish(gateway, chat, [("choices_settled", settled)])  # decided in the console
    await expect(buttons.nth(0)).to_be_disabled(timeout=GUARD_MS)
    await expect(buttons.nth(1)).to_be_disabled()
    await expect(buttons.nth(1)).to_have_attribute("aria-pressed", "true")
    await expect(buttons.nth(0)).to_have_attribute("aria-pressed", "false")
    await expect(page.get_by_test_id("choice-outcome")).to_have_text("Denied by console:alice")
    await _layout(page, tmp_path, "approval-settled")
    for index in range(2):  # the picked pill's label sits in its middle like the other's (no style of another list)
        offset = await buttons.nth(index).evaluate(
            """b => { const l = b.querySelector('.choice-label') || b, lb = l.getBoundingClientRect(),
                     bb = b.getBoundingClientRect(); return [lb.top + lb.bottom - bb.top - bb.bottom,
                     lb.left + lb.right - bb.left - bb.right]; }"""
        )
        assert all(abs(delta) <= 2 for delta in offset), (index, offset, tmp_path)

    await chat.reload()  # the replayed history shows the decision too
    await expect(page.get_by_test_id("choice-outcome")).to_have_text("Denied by console:alice", timeout=GUARD_MS)
    await expect(page.get_by_test_id("msg-choices").locator("button").nth(0)).to_be_disabled()


async def test_a_click_on_a_choice_marks_it_and_its_label_fits(
    open_chat: OpenChat, gateway: Gateway, tmp_path: Path
) -> None:
    chat = await open_chat()
    page = chat.page
    options = [Choice(id="size-s", label="Small"), Choice(id="size-l", label="Large, with every extra we have " * 3)]
    offer = OfferChoice(question="Which size?", options=options, reply_to="work-3")
    message = {
        "text": "Which size?",
        "reply_to": "work-3",
        "choices": [{"id": o.id, "label": o.label} for o in options],
    }
    await _publish(gateway, chat, [("message", message)], offer=offer)
    buttons = page.get_by_test_id("msg-choices").locator("button")
    await expect(buttons).to_have_count(2, timeout=GUARD_MS)
    await buttons.nth(1).click()
    await expect(buttons.nth(1)).to_have_attribute("aria-pressed", "true")
    await expect(buttons.nth(0)).to_be_disabled()
    await chat.wait_answered(2)  # the offer, then the agent's answer to the click
    await _layout(page, tmp_path, "choice-clicked")


async def test_stop_leaves_one_notice_and_no_bubble_for_the_command(open_chat: OpenChat, tmp_path: Path) -> None:
    chat = await open_chat()
    page = chat.page
    await chat.type_and_send("What time is it?")  # a tool call and an answer: long enough to stop in the middle
    stop = page.get_by_test_id("stop-button")
    await expect(stop).to_be_visible(timeout=GUARD_MS)
    await stop.click()
    notice = page.get_by_test_id("system-line")
    await expect(notice).to_have_text(["You stopped this reply."], timeout=GUARD_MS)
    await expect(page.get_by_test_id("typing-indicator")).to_be_hidden(timeout=GUARD_MS)
    await expect(page.get_by_test_id("msg-error")).to_have_count(0)
    timeline = await chat.timeline()
    shown = {item["text"] for snapshot in timeline for item in snapshot["items"] if item["role"] == "user"}
    assert shown == {"What time is it?"}, f"a bubble for the stop command: {shown}"
    await _layout(page, tmp_path, "stopped")

    await chat.reload()  # the replayed history: still one notice, still no bubble for the command
    await expect(notice).to_have_text(["You stopped this reply."], timeout=GUARD_MS)
    await expect(page.get_by_test_id("msg-user")).to_have_text(["What time is it?"])


async def test_a_notice_message_is_a_system_line(open_chat: OpenChat, gateway: Gateway) -> None:
    chat = await open_chat()
    page = chat.page
    text = "Nothing was running, so there was nothing to stop."
    await _publish(gateway, chat, [("message", {"text": text, "reply_to": "work-4", "notice": True})])
    await expect(page.get_by_test_id("system-line")).to_have_text([text], timeout=GUARD_MS)
    await expect(page.get_by_test_id("msg-assistant")).to_have_count(0)


async def test_the_empty_chat_offers_the_agents_starters(open_chat: OpenChat, tmp_path: Path) -> None:
    chat = await open_chat()
    page = chat.page
    empty = page.get_by_test_id("empty-state")
    await expect(empty).to_be_visible()
    await expect(empty.get_by_role("heading")).to_have_text("Report helper")
    await expect(empty).to_contain_text("Builds reports from your files.")
    starters = empty.get_by_role("button")
    await expect(starters).to_have_text(["Summarise my week", "What time is it?"])
    await _layout(page, tmp_path, "empty")
    await starters.nth(0).click()
    await expect(empty).to_be_hidden()
    await chat.wait_answered(1)
    (user, reply) = await chat.transcript()
    assert user == ("user", "Summarise my week, please") and "Summarise my week" in reply[1], (user, reply)
    await chat.reload()
    await expect(page.get_by_test_id("msg-user")).to_have_count(1, timeout=GUARD_MS)
    await expect(empty).to_be_hidden()


async def test_icons_need_no_emoji_font(open_chat: OpenChat) -> None:
    chat = await open_chat()
    page = chat.page
    for testid in ("attach-button", "send-button", "stop-button"):
        await expect(page.get_by_test_id(testid).locator("svg")).to_have_count(1)
    await page.get_by_test_id("file-input").set_input_files(
        {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hello"}
    )
    chosen = page.get_by_test_id("chosen-file")
    await expect(chosen.locator("svg.icon-file")).to_have_count(1)
    await expect(chosen.get_by_role("button", name="Remove notes.txt").locator("svg")).to_have_count(1)
    pictographs: list[str] = await page.evaluate(
        r"""() => Array.from(document.body.innerText.matchAll(/\p{Extended_Pictographic}/gu), (m) => m[0])"""
    )
    assert pictographs == [], f"text that needs an emoji font: {pictographs}"


async def test_a_call_still_running_when_its_run_ends_says_it_stopped(
    open_chat: OpenChat, gateway: Gateway, tmp_path: Path
) -> None:
    chat = await open_chat()
    page = chat.page
    await _publish(gateway, chat, [("tool", _tool("call-9", "running"))])
    card = page.get_by_test_id("tool-card")
    await expect(card).to_have_attribute("data-state", "running", timeout=GUARD_MS)
    cancelled = {"reply_to": "work-1", "code": "cancelled", "message": "You stopped this reply."}
    await _publish(gateway, chat, [("reply_error", cancelled)])
    await expect(card).to_have_attribute("data-state", "stopped", timeout=GUARD_MS)
    await expect(card.locator("summary")).to_contain_text("Stopped")
    await expect(card.locator(".icon-spinner")).to_have_count(0)
    await _layout(page, tmp_path, "stopped-card")
