"""The console's Review tab in real Chromium against a real ``switchboard run`` sampling every finished run.

A web chat conversation runs; its run shows in the Review tab; the operator opens it, reads the transcript (markup
shown as text), saves a verdict with a note, and downloads the replay case; a viewer sees the run without its words
and without the verdict form or the case link.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
from playwright.async_api import expect

from switchboard.evals.scenario import load_scenarios
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
OpenConsole = Callable[[], Awaitable[ConsolePage]]
PASSWORD: Final = "operator password for the review test"
HOSTILE: Final = "is <b>this</b> <img src=x onerror=alert(1)> right?"
CONFIG: Final = """
default_agent: assistant
agents:
  assistant:
    profile: {{name: Assistant}}
    instructions: You are a test assistant.
    tools: [current_time]
console:
  operators:
    - name: alice
      password_hash: "{hash}"
      tenants: [default]
    - name: victor
      password_hash: "{hash}"
      tenants: [default]
      role: viewer
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """``python -m switchboard run`` sampling every finished run for review."""
    root = tmp_path_factory.mktemp("console-review")
    config = root / "switchboard.yaml"
    config.write_text(CONFIG.format(hash=hash_password(PASSWORD)))
    env = {"SWITCHBOARD_EVALS__SAMPLE_RATE": "1"}
    yield from run_gateway(root, config, delay_ms=OFFLINE_DELAY_MS // 3, extra_env=env)


async def _signed_in(open_console: OpenConsole, name: str) -> ConsolePage:
    console = await open_console()
    await console.sign_in(name, PASSWORD)
    await console.page.get_by_test_id("tab-review").click()
    return console


async def test_an_operator_reviews_a_sampled_run_and_downloads_its_replay_case(
    open_chat: OpenChat, open_console: OpenConsole, tmp_path: Path
) -> None:
    chat = await open_chat()
    await chat.type_and_send(HOSTILE)
    await chat.wait_answered(1)

    console = await _signed_in(open_console, "alice")
    page = console.page
    rows = page.get_by_test_id("review-row")
    await expect(rows).to_have_count(1, timeout=GUARD_MS)
    await expect(rows.first).to_contain_text("assistant")
    await expect(rows.first).to_contain_text("to review")
    await rows.first.get_by_test_id("review-open").click()
    transcript = page.get_by_test_id("review-transcript")
    await expect(transcript).to_contain_text(HOSTILE, timeout=GUARD_MS)  # as text, never as markup
    assert await page.locator("main img, main b").count() == 0
    await page.set_viewport_size({"width": 1280, "height": 800})
    widths = await page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1] == 1280, f"the review tab is {widths[0]} px wide"

    await page.get_by_test_id("review-verdict").select_option("fail")
    await page.get_by_test_id("review-note").fill("should have asked which day")
    await page.get_by_test_id("review-save").click()
    await expect(rows.first).to_contain_text("fail: should have asked which day", timeout=GUARD_MS)

    async with page.expect_download() as download_info:
        await page.get_by_test_id("review-case").click()
    download = await download_info.value
    saved = tmp_path / download.suggested_filename
    await download.save_as(saved)
    [case] = load_scenarios(saved)
    assert case.messages == [HOSTILE] and case.channel == "web" and case.agent.configured == "assistant"

    viewer = await _signed_in(open_console, "victor")
    await expect(viewer.page.get_by_test_id("review-row")).to_have_count(1, timeout=GUARD_MS)
    await viewer.page.get_by_test_id("review-open").click()
    lines = viewer.page.get_by_test_id("review-transcript").get_by_test_id("transcript-line")
    await expect(lines.first).to_be_visible(timeout=GUARD_MS)
    assert "onerror" not in await viewer.page.get_by_test_id("review-transcript").inner_text()
    await expect(viewer.page.get_by_test_id("review-form")).to_be_hidden()
