"""Hostile strings in every console field a web chat user or the configuration can reach, in real Chromium.

A policy reason, tool arguments and paths, the user's own messages and an operator's ``say`` text all carry markup
and script; the console must show them as text, run none of it on any tab, and log no Content-Security-Policy
violation (the page fixture fails a test on any error in the browser's console).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

import pytest
from playwright.async_api import expect

from switchboard.console.passwords import hash_password
from tests.browser.conftest import (
    CHROMIUM,
    GUARD_MS,
    OFFLINE_DELAY_MS,
    SKIP_REASON,
    Gateway,
    _free_port,
    _stop,
    _wait_ready,
)
from tests.browser.test_console import CONSOLE_CONFIG, PASSWORD, ConsolePage, OpenChat, open_console

__all__ = ["open_console"]

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
    if CHROMIUM is None:
        pytest.skip(SKIP_REASON)
    root = tmp_path_factory.mktemp("console-hostile")
    config = root / "switchboard.yaml"
    config.write_text(HOSTILE_CONFIG.format(hash=hash_password(PASSWORD)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))}
    port = _free_port()
    env.update(
        {
            "SWITCHBOARD_HOST": "127.0.0.1",
            "SWITCHBOARD_PORT": str(port),
            "SWITCHBOARD_DATA_DIR": str(root / "data"),
            "SWITCHBOARD_CONFIG": str(config),
            "SWITCHBOARD_OFFLINE__DELAY_MS": str(OFFLINE_DELAY_MS // 3),
        }
    )
    stdout, stderr = root / "stdout.txt", root / "stderr.txt"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "switchboard", "run"], env=env, cwd=root, stdout=out, stderr=err
        )
    running = Gateway(url=f"http://127.0.0.1:{port}/", process=process, stdout=stdout, stderr=stderr)
    try:
        _wait_ready(running)
        yield running
    finally:
        _stop(running)


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
    await console.page.get_by_test_id("timeline-row").first.wait_for(timeout=GUARD_MS)
    await expect(console.page.get_by_test_id("say-input")).to_have_value("", timeout=GUARD_MS)  # sent
    await _inert(console)
    for tab in ("sessions", "approvals", "dead", "effects", "agents", "usage"):
        await console.page.get_by_test_id(f"tab-{tab}").click()
    await _inert(console)
