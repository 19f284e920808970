"""Hostile strings in every console field a web chat user or the configuration can reach, in real Chromium.

A policy reason, tool arguments and paths, the user's own messages and an operator's ``say`` text all carry markup
and script; the console must show them as text, run none of it on any tab, and log no Content-Security-Policy
violation (the page fixture fails a test on any error in the browser's console).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

import pytest
from playwright.async_api import expect

from tests.browser.conftest import (
    CHROMIUM,
    GUARD_MS,
    SKIP_REASON,
    ConsolePage,
    Gateway,
)
from tests.browser.test_console import CONSOLE_CONFIG, PASSWORD, OpenChat, start_gateway

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

XSS: Final = '"><img src=x onerror="window.__xss=1"><script>window.__xss=2</script><svg onload="window.__xss=3">'
HOSTILE_CONFIG: Final = CONSOLE_CONFIG.replace("writing files needs an operator's OK", XSS.replace('"', '\\"'))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """``python -m switchboard run`` with a gated ``write_file`` whose policy reason is markup."""
    yield from start_gateway(tmp_path_factory.mktemp("console-hostile"), HOSTILE_CONFIG)


async def _inert(console: ConsolePage) -> None:
    page = console.page
    assert await page.evaluate("window.__xss") is None
    assert await page.locator("img, svg, script:not([src]), [onerror], [onload]").count() == 0


async def test_markup_in_every_field_is_shown_as_text_and_never_runs(
    open_chat: OpenChat, open_console: Callable[[], Awaitable[ConsolePage]]
) -> None:
    chat = await open_chat()
    console = await open_console()
    await console.sign_in("alice", PASSWORD)
    session = f"default/assistant/web/default/{await chat.session()}"
    await chat.type_and_send(XSS)
    await chat.type_and_send('/tool write_file {"path": ' + json.dumps(XSS) + ', "content": ' + json.dumps(XSS) + "}")

    await console.page.get_by_test_id("tab-approvals").click()
    card = console.page.get_by_test_id("approvals-list").get_by_test_id("approval-card")
    await card.first.wait_for(timeout=GUARD_MS)
    assert await card.locator("[data-field=reason]").inner_text() == XSS
    arguments = json.loads(await card.locator("[data-field=arguments]").inner_text())
    assert arguments["path"] == XSS and arguments["content"] == XSS
    await _inert(console)

    await console.open_session(session)
    await console.page.get_by_test_id("takeover-button").click()
    await console.page.get_by_test_id("say-input").fill(XSS)
    await console.page.get_by_test_id("say-button").click()
    await expect(console.page.get_by_test_id("say-input")).to_have_value("", timeout=GUARD_MS)  # sent
    transcript = console.page.get_by_test_id("transcript")
    await expect(transcript.locator("[data-kind=user]").first).to_contain_text(XSS, timeout=GUARD_MS)
    await expect(transcript.locator("[data-kind=operator]").filter(has_text=XSS)).to_have_count(1, timeout=GUARD_MS)
    await console.page.get_by_test_id("raw-toggle").click()
    await console.page.get_by_test_id("timeline-row").first.wait_for(timeout=GUARD_MS)
    await _inert(console)
    for tab in ("sessions", "approvals", "dead", "effects", "agents", "usage"):
        await console.page.get_by_test_id(f"tab-{tab}").click()
    await _inert(console)
