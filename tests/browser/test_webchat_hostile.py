"""Hostile tool cards and files in the web chat, in real Chromium against a real ``switchboard run``.

What a tool printed, its title, arguments and file names, and the files an agent sends come from programs and
outside text: the page shows them as text and runs nothing, and a sent file never becomes a document of the chat's
origin (only raster images are previewed; every other type is offered as a download, served as opaque bytes).
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Final

import pytest
from playwright.async_api import expect

from tests.browser.conftest import CHROMIUM, GUARD_MS, SKIP_REASON, ChatPage, Gateway
from tests.browser.test_webchat_work import PNG_1X1, _publish, _tool

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

OpenChat = Callable[[], Awaitable[ChatPage]]

XSS: Final = '"><img src=x onerror="window.__xss=1"><script>window.__xss=2</script><svg onload="window.__xss=3">'
GATEWAY_CONFIG: Final = r"""
default_agent: assistant
agents:
  assistant:
    profile:
      name: '<img src=x onerror="window.__xss=11">Name'
      description: '</script><script>window.__xss=12</script> desc'
      starters:
        - {label: '<b onmouseover="window.__xss=13">bold</b>', text: '<svg onload="window.__xss=14">'}
        - "javascript:window.__xss=15"
        - {label: "‮evil​", text: "x"}
    instructions: You are a test assistant.
    tools: [current_time]
"""
"""Markup in the agent's name, description and starters, as a configuration could carry it."""

HTML_DOC: Final = (
    "<!doctype html><title>pwned</title><script>window.opener && (window.opener.__xss = 4);"
    "document.title = 'ran:' + (localStorage.length >= 0)</script><p>hi</p>"
)


async def test_an_html_file_is_never_served_as_a_document_of_the_chat(open_chat: OpenChat, gateway: Gateway) -> None:
    chat = await open_chat()
    page = chat.page
    small = HTML_DOC.encode()
    big = HTML_DOC.encode() + b"<!--" + b"x" * 1_200_000 + b"-->"  # over the data: URL cap: a blob: URL
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" onload="window.__xss=5"><script>window.__xss=6</script></svg>'
    files = [
        ("page.html", "text/html", small),
        ("big.html", "text/html", big),
        ("pic.svg", "image/svg+xml", svg),
        ("x.xhtml", "application/xhtml+xml", small),
    ]
    events = [
        (
            "message",
            {
                "text": "",
                "reply_to": "f-1",
                "file": {"name": n, "mime_type": t, "size": len(b), "data": base64.b64encode(b).decode()},
            },
        )
        for n, t, b in files
    ] + [("message", {"text": "Files.", "reply_to": "f-1"})]
    await _publish(gateway, chat, events)
    cards = page.get_by_test_id("msg-file")
    await expect(cards).to_have_count(4, timeout=GUARD_MS)
    await expect(page.get_by_test_id("file-preview")).to_have_count(0)  # nothing but a raster image is previewed
    links = page.get_by_test_id("file-download")
    for i, (name, declared, _) in enumerate(files):
        await expect(cards.nth(i)).to_contain_text(declared)  # the declared type is shown, as text
        await expect(links.nth(i)).to_have_attribute("download", name)
        href = await links.nth(i).get_attribute("href")
        assert href is not None
        assert href.startswith(("data:application/octet-stream;", "blob:")), (name, href[:60])
        opened = await page.context.new_page()  # a user opens the link in a new tab
        try:
            await opened.goto(href)
            title = await opened.title()
        except Exception as err:  # a download instead of a page: what an opaque file should be
            title = f"download: {type(err).__name__}"
        finally:
            await opened.close()
        assert not title.startswith("ran:"), f"{name} ran script in the chat's origin: {title}"
    assert await page.evaluate("window.__xss") is None


async def test_a_large_image_is_previewed_from_its_blob_url(open_chat: OpenChat, gateway: Gateway) -> None:
    chat = await open_chat()
    page = chat.page
    png = base64.b64decode(PNG_1X1) + b"\0" * 1_200_000  # bytes after IEND: still the 1x1 image, over the data: cap
    file = {"name": "big.png", "mime_type": "image/png", "size": len(png), "data": base64.b64encode(png).decode()}
    await _publish(gateway, chat, [("message", {"text": "", "reply_to": "f-2", "file": file})])
    preview = page.get_by_test_id("file-preview")
    await expect(preview).to_have_count(1, timeout=GUARD_MS)
    assert (await preview.get_attribute("src") or "").startswith("blob:")
    await expect(preview).to_have_js_property("complete", True)
    assert await preview.evaluate("(img) => img.naturalWidth") == 1


ODD: Final = "a\u202eexe.txt\u200b\u200d\x07\x1b[31m"
"""A right-to-left override, zero-width characters, a bell and a terminal escape."""


async def test_hostile_tool_cards_and_file_names_are_text(open_chat: OpenChat, gateway: Gateway) -> None:
    chat = await open_chat()
    page = chat.page
    huge = "y" * 200_000
    card = _tool(
        "call-x",
        "ok",
        title=f"shell: {XSS}</script>{ODD}",
        arguments='{"command": "' + XSS.replace('"', '\\"') + '</script>"}',
        output_head=f"{XSS}\n</script><script>window.__xss=7</script>\n{ODD}\n{huge}",
        output_tail="javascript:window.__xss=8",
        omitted_lines=3,
        duration_ms=5.0,
        exit_status=0,
        files=[{"name": XSS, "path": f"javascript:alert(1)/{XSS}"}],
    )
    data = base64.b64encode(b"hello").decode()
    hostile_file = {"name": f"{XSS}{ODD}", "mime_type": 'text/html"><img src=x onerror=window.__xss=9>', "data": data}
    events = [
        ("tool", card),
        ("message", {"text": f"[click](javascript:window.__xss=10) {XSS}", "reply_to": "work-1", "file": hostile_file}),
    ]
    await _publish(gateway, chat, events)
    cards = page.get_by_test_id("tool-card")
    await expect(cards).to_have_count(1, timeout=GUARD_MS)
    await expect(page.get_by_test_id("msg-file")).to_have_count(1, timeout=GUARD_MS)
    await cards.first.locator("summary").click()
    await expect(cards.first.get_by_test_id("tool-output")).to_contain_text("</script><script>window.__xss=7")
    await expect(cards.first.locator("summary")).to_contain_text("<img src=x")
    await expect(cards.first.get_by_test_id("tool-files")).to_contain_text("onerror")
    await expect(page.get_by_test_id("msg-file")).to_contain_text("application/octet-stream")  # a malformed type
    assert await page.evaluate("window.__xss") is None
    messages = page.get_by_test_id("message-list")
    assert (
        await messages.locator(
            "img:not([data-testid=file-preview]), svg:not(.icon), script, [onerror], [onload]"
        ).count()
        == 0
    )
    hrefs = await messages.locator("a[href]").evaluate_all("(links) => links.map((a) => a.href)")
    assert not [h for h in hrefs if h.lower().startswith("javascript:")], hrefs
    wide = await page.evaluate("() => document.scrollingElement.scrollWidth <= innerWidth")
    assert wide, "a huge line made the page scroll sideways"


async def test_markup_in_the_agents_name_description_and_starters_is_text(open_chat: OpenChat) -> None:
    chat = await open_chat()
    page = chat.page
    starters = page.locator("#starters button")
    await expect(starters).to_have_count(3, timeout=GUARD_MS)
    await expect(starters.nth(0)).to_have_text('<b onmouseover="window.__xss=13">bold</b>')
    await expect(starters.nth(1)).to_have_text("javascript:window.__xss=15")
    await expect(page.locator("body")).to_contain_text('<img src=x onerror="window.__xss=11">Name')
    await expect(page.locator("body")).to_contain_text("</script><script>window.__xss=12</script> desc")
    await starters.nth(0).hover()
    await starters.nth(0).click()  # the starter's text is sent as text, and echoed as text
    await chat.wait_answered(1)
    await expect(starters.first).to_be_hidden(timeout=GUARD_MS)
    assert await page.evaluate("window.__xss") is None
    assert await page.locator("img, script:not([src]), [onerror], [onload], [onmouseover], b").count() == 0
    (user, _) = await chat.transcript()
    assert user == ("user", '<svg onload="window.__xss=14">')
