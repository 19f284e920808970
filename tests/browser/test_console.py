"""The operator console in real Chromium against a real ``switchboard run``: sign in, approve, take over, hand back.

A web chat user asks the offline model for a gated tool call (``/tool write_file {...}``; this module's YAML makes
``write_file`` need approval); the approval appears in the console, an operator approves it there, and the chat
shows the resumed run's answer. Then the operator takes the conversation over, writes to the user (the chat shows
it), and hands it back: the agent answers the next message again.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
from playwright.async_api import TimeoutError as PlaywrightTimeoutError
from playwright.async_api import expect

from switchboard.web.console.passwords import hash_password
from tests.browser.conftest import (
    CHROMIUM,
    GUARD_MS,
    OFFLINE_DELAY_MS,
    SKIP_REASON,
    ChatPage,
    ConsolePage,
    Gateway,
    run_gateway,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

OpenChat = Callable[[], Awaitable[ChatPage]]
PASSWORD: Final = "operator password for the browser test"
CONTENT: Final = "hello <img src=x onerror=alert(1)> from the chat"
"""Markup in the arguments: the console shows it as text, never as HTML."""
GATED_CALL: Final = '/tool write_file {"path": "note.txt", "content": "' + CONTENT + '"}'
CONSOLE_CONFIG: Final = """
default_agent: assistant
agents:
  assistant:
    profile: {{name: Assistant}}
    instructions: You are a test assistant.
    tools: [current_time, write_file]
    policy:
      rules:
        - {{name: files-need-ok, tool: write_file, decide: approve, reason: "writing files needs an operator's OK"}}
console:
  operators:
    - name: alice
      password_hash: "{hash}"
      tenants: [default]
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """``python -m switchboard run`` as a user starts it, with an operator and a gated ``write_file``."""
    yield from start_gateway(tmp_path_factory.mktemp("console-gateway"), CONSOLE_CONFIG)


def start_gateway(root: Path, config_text: str) -> Iterator[Gateway]:
    """Run the gateway with ``config_text`` (``{hash}``: the operator's password hash) until the caller is done."""
    config = root / "switchboard.yaml"
    config.write_text(config_text.format(hash=hash_password(PASSWORD)))
    yield from run_gateway(root, config, delay_ms=OFFLINE_DELAY_MS // 3)


async def _assistant_says(chat: ChatPage, *texts: str) -> None:
    """Wait until one finished assistant bubble contains each of ``texts``."""
    try:
        await chat.page.wait_for_function(
            """t => Array.from(document.querySelectorAll('[data-testid=msg-assistant]'))
                 .some(li => li.getAttribute('aria-busy') === 'false' && t.every(x => li.textContent.includes(x)))""",
            arg=list(texts),
            timeout=GUARD_MS,
        )
    except PlaywrightTimeoutError:
        pytest.fail(f"no finished assistant bubble says {texts!r}; the chat shows: {await chat.transcript()}")


async def _assistant_texts(chat: ChatPage) -> list[str]:
    return [text for role, text in await chat.transcript() if role == "assistant"]


async def test_a_wrong_password_is_refused_in_the_page(open_console: Callable[[], Awaitable[ConsolePage]]) -> None:
    console = await open_console()
    await console.page.goto(console.url + "console/login")
    await console.page.get_by_test_id("login-name").fill("alice")
    await console.page.get_by_test_id("login-password").fill("not the password")
    await console.page.get_by_test_id("login-submit").click()
    await expect(console.page.get_by_test_id("login-error")).to_have_text(
        "wrong operator name or password", timeout=GUARD_MS
    )
    console.errors.clear()  # the browser logs the 401 of the sign-in request itself


async def test_approve_from_the_console_then_take_over_and_hand_back(
    open_chat: OpenChat, open_console: Callable[[], Awaitable[ConsolePage]]
) -> None:
    chat = await open_chat()
    console = await open_console()
    await console.sign_in("alice", PASSWORD)
    session = f"default/assistant/web/default/{await chat.session()}"

    # the user's request needs approval: the console shows the record's data, the operator approves
    await chat.type_and_send(GATED_CALL)
    await console.page.get_by_test_id("tab-approvals").click()
    card = console.page.get_by_test_id("approvals-list").get_by_test_id("approval-card")
    await expect(card).to_have_count(1, timeout=GUARD_MS)
    await expect(card.locator("[data-field=tool]")).to_have_text("write_file")
    await expect(card.locator("[data-field=reason]")).to_have_text("writing files needs an operator's OK")
    await expect(card.locator("[data-field=resources]")).to_contain_text("note.txt")
    await expect(card.locator("[data-field=session]")).to_have_text(session)
    arguments = json.loads(await card.locator("[data-field=arguments]").inner_text())
    assert arguments["path"] == "note.txt" and arguments["content"] == CONTENT
    assert await card.locator("img").count() == 0
    before = len(await _assistant_texts(chat))
    await card.get_by_test_id("approve-button").click()
    await expect(card).to_have_count(0, timeout=GUARD_MS)  # decided: no longer pending

    # the run resumes with the approved call: the chat shows the model's report of the tool's result
    await _assistant_says(chat, "write_file returned:", "wrote note.txt")
    assert len(await _assistant_texts(chat)) > before

    # take over: the operator's words reach the user; the agent stays quiet
    await console.open_session(session)
    await console.page.get_by_test_id("takeover-button").click()
    await expect(console.page.get_by_test_id("detail-state")).to_contain_text("taken over", timeout=GUARD_MS)
    await console.page.get_by_test_id("say-input").fill("Hello, this is Alice from support.")
    await console.page.get_by_test_id("say-button").click()
    await _assistant_says(chat, "Hello, this is Alice from support.")

    # hand back: the agent answers the next message again
    await console.page.get_by_test_id("handback-button").click()
    await expect(console.page.get_by_test_id("detail-state")).not_to_contain_text("taken over", timeout=GUARD_MS)
    await chat.type_and_send("are you back?")
    await _assistant_says(chat, "You said:", 'are you back?"')  # the offline model's answer: the agent is back
    await console.page.get_by_test_id("raw-toggle").click()  # the raw timeline is a click away
    timeline = console.page.get_by_test_id("timeline-row")
    await expect(timeline.first).to_be_visible(timeout=GUARD_MS)
    traces = [t for t in await console.page.locator("[data-testid=timeline-row] code").all_inner_texts() if t]
    assert traces, "the timeline shows trace ids"


async def _kinds(console: ConsolePage) -> list[str]:
    kinds: list[str] = await console.page.evaluate(
        "() => Array.from(document.querySelectorAll('[data-testid=transcript-line]'), (li) => li.dataset.kind)"
    )
    return kinds


async def test_the_console_shows_the_conversation_as_a_live_transcript(
    open_chat: OpenChat, open_console: Callable[[], Awaitable[ConsolePage]]
) -> None:
    chat = await open_chat()
    console = await open_console()
    await console.sign_in("alice", PASSWORD)
    await expect(console.page.get_by_test_id("live-status")).to_have_text("live", timeout=GUARD_MS)
    session = f"default/assistant/web/default/{await chat.session()}"

    # a real conversation: a tool call and its answer, then words with markup in them
    await chat.type_and_send('/tool current_time {"timezone": "Europe/Paris"}')
    await _assistant_says(chat, "It is", "(Europe/Paris)")
    await chat.type_and_send(CONTENT)
    await _assistant_says(chat, "You said:", "onerror")
    await console.open_session(session)  # the row arrived over the stream
    lines = console.page.get_by_test_id("transcript")
    await expect(lines.get_by_test_id("transcript-line")).to_have_count(5, timeout=GUARD_MS)
    assert await _kinds(console) == ["user", "tool_call", "agent", "user", "agent"]
    call = lines.locator("[data-kind=tool_call]")
    arguments = json.loads(await call.get_by_test_id("tool-arguments").inner_text())
    assert arguments == {"timezone": "Europe/Paris"}
    await expect(call.get_by_test_id("tool-result")).to_contain_text("Europe/Paris")
    await expect(lines.locator("[data-kind=user]").nth(1)).to_contain_text(CONTENT)  # markup shown as text
    assert await lines.locator("img").count() == 0
    # each line opens to its events
    first = lines.get_by_test_id("transcript-line").first
    await first.get_by_test_id("line-events").locator("summary").click()
    await expect(first.get_by_test_id("line-events")).to_contain_text("message_received")

    # live: the next message appears without a reload or a click
    await chat.type_and_send("one more thing")
    await expect(lines.locator("[data-kind=user]").filter(has_text="one more thing")).to_have_count(1, timeout=GUARD_MS)
    await _assistant_says(chat, "one more thing")
    await expect(lines.get_by_test_id("transcript-line")).to_have_count(7, timeout=GUARD_MS)
    await expect(console.page.get_by_test_id("live-status")).to_have_text("live")
