"""The chat page's event stream and rendering, in real Chromium against a real ``switchboard run``.

- A failed or stopped reply must not leave the page saying "Reconnecting…" (an SSE event named ``error`` used to
  fire the browser's connection-error handler), neither live nor after a reload that replays it.
- The page opens its stream with a single-use ticket: the bearer token never appears in a URL.
- Replies render headings, tables, block quotes and nested lists, without ever parsing text as HTML, and every
  bubble takes its direction from its own text (``dir="auto"``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from playwright.async_api import expect

from tests.browser.conftest import CHROMIUM, GUARD_MS, SKIP_REASON, ChatPage

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

OpenChat = Callable[[], Awaitable[ChatPage]]

MARKDOWN = """Formatting check

# Big heading
### Small heading

> quoted line one
> quoted **bold**

| Name | Count |
|:-----|------:|
| apples | 3 |
| <img src=x onerror=alert(1)> | 4 |

- outer one
  - inner one
  - inner two
    1. deep first
- outer two

The end"""


async def test_a_stopped_reply_leaves_the_page_connected_live_and_after_reload(open_chat: OpenChat) -> None:
    chat = await open_chat()
    state = chat.page.get_by_test_id("connection-state")
    await chat.type_and_send("What time is it?")  # a tool call and an answer: long enough to stop in the middle
    await expect(chat.page.get_by_test_id("typing-indicator")).to_be_visible(timeout=GUARD_MS)
    await chat.page.get_by_test_id("stop-button").click()
    notice = chat.page.get_by_test_id("system-line")  # the reply_error "cancelled", as one system line
    await expect(notice).to_have_count(1, timeout=GUARD_MS)
    await expect(notice).to_have_attribute("title", "cancelled")
    await expect(state).to_have_text("Connected", timeout=GUARD_MS)
    await expect(chat.page.get_by_test_id("typing-indicator")).to_be_hidden(timeout=GUARD_MS)

    await chat.reload()  # the replayed reply_error must not look like a broken connection either
    await expect(notice).to_have_count(1, timeout=GUARD_MS)
    await expect(state).to_have_text("Connected")
    # Still connected: a new message is answered over the same stream.
    await chat.type_and_send("after the stop")
    last = chat.page.locator("[data-testid=message-list] > li").last
    await expect(last).to_have_attribute("aria-busy", "false", timeout=GUARD_MS)
    await expect(last).to_contain_text("after the stop")
    assert "Reconnecting" not in (await state.text_content() or "")


async def test_the_stream_is_opened_with_a_ticket_never_the_token(open_chat: OpenChat) -> None:
    chat = await open_chat()
    opened: list[str] = []
    chat.page.on("request", lambda request: opened.append(request.url) if "/api/chat/stream" in request.url else None)
    await chat.reload()
    token: str = await chat.page.evaluate("() => JSON.parse(localStorage.getItem('switchboard.webchat')).token")
    streams = [url for url in opened if "/api/chat/stream?" in url]
    assert streams, opened
    assert all("ticket=" in url and token not in url for url in streams), streams
    assert any(url.endswith("/api/chat/stream-ticket") for url in opened), opened


async def test_replies_render_headings_tables_quotes_and_nested_lists(open_chat: OpenChat) -> None:
    chat = await open_chat()
    await chat.type_and_send(MARKDOWN)
    await chat.wait_answered(1)
    body = chat.page.locator("[data-testid=msg-assistant] .body")
    shape: dict[str, Any] = await body.evaluate(
        """(body) => ({
          h1: Array.from(body.querySelectorAll('h1'), (h) => h.textContent),
          h3: Array.from(body.querySelectorAll('h3'), (h) => h.textContent),
          quote: Array.from(body.querySelectorAll('blockquote'), (q) => q.textContent),
          quoteBold: Array.from(body.querySelectorAll('blockquote strong'), (b) => b.textContent),
          head: Array.from(body.querySelectorAll('table thead th'), (c) => c.textContent),
          rows: Array.from(body.querySelectorAll('table tbody tr'),
                           (r) => Array.from(r.children, (c) => c.textContent)),
          align: Array.from(body.querySelectorAll('table thead th'), (c) => c.style.textAlign),
          images: body.querySelectorAll('img').length,
          outer: Array.from(body.querySelectorAll(':scope > ul > li'), (li) => li.firstChild.textContent),
          inner: Array.from(body.querySelectorAll(':scope > ul > li > ul > li'), (li) => li.firstChild.textContent),
          deep: Array.from(body.querySelectorAll('ul ul ol > li'), (li) => li.textContent),
          blocksAuto: Array.from(body.querySelectorAll('p, h1, h3, li, blockquote, td'), (n) => n.dir)
                        .every((d) => d === 'auto'),
        })"""
    )
    assert shape["h1"] == ["Big heading"] and shape["h3"] == ["Small heading"]
    assert len(shape["quote"]) == 1 and "quoted line one" in shape["quote"][0] and shape["quoteBold"] == ["bold"]
    assert shape["head"] == ["Name", "Count"]
    assert shape["rows"] == [["apples", "3"], ["<img src=x onerror=alert(1)>", "4"]]
    assert shape["align"] == ["left", "right"]
    assert shape["images"] == 0, "text is never parsed as HTML"
    assert shape["outer"] == ["outer one", "outer two"]
    assert shape["inner"] == ["inner one", "inner two"]
    assert shape["deep"] == ["deep first"]
    assert shape["blocksAuto"]


async def test_bubbles_take_their_direction_from_their_text(open_chat: OpenChat) -> None:
    chat = await open_chat()
    await chat.type_and_send("مرحبا بالعالم، كيف حالك؟")
    await chat.wait_answered(1)
    user = chat.page.locator("[data-testid=msg-user]")
    assistant = chat.page.locator("[data-testid=msg-assistant]")
    await expect(user).to_have_attribute("dir", "auto")
    await expect(assistant).to_have_attribute("dir", "auto")
    assert await user.evaluate("(li) => li.matches(':dir(rtl)')")
    await chat.type_and_send("plain English")
    await chat.wait_answered(2)
    assert await chat.page.locator("[data-testid=msg-user]").nth(1).evaluate("(li) => li.matches(':dir(ltr)')")
