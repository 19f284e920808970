"""The quickstart as a newcomer follows it: `make run`'s shipped configuration, the empty chat's five starters, in
real Chromium at a phone's width.

Within those five messages the page must show a tool card for a shell run, a file sent as a card, and an approval
asked as a card whose buttons reflect the decision; nothing may overflow 390 px. The screenshots are kept in the
test's temporary directory (their paths are in any failure message).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import pytest
from playwright.async_api import Page, expect

from switchboard.cli.sandbox import startup_choice
from switchboard.settings import load_settings
from tests.browser.conftest import GUARD_MS, ChatPage

OpenChat = Callable[[], Awaitable[ChatPage]]

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

GATEWAY_CONFIG_PATH: Final = Path(__file__).resolve().parents[2] / "config" / "switchboard.yaml"
"""The file `make run` reads."""
OFFLINE_DELAY_MS: Final = 0
"""The starters' answers need not stream slowly here."""
PHONE: Final = {"width": 390, "height": 844}
STARTERS: Final = [
    "Send me a file",
    "Run shell commands",
    "Run a short program",
    "Query the shop database",
    "Publish an announcement (asks for approval)",
]


async def _fits(page: Page, shot: Path) -> None:
    """Nothing wider than the viewport, and every card inside the message list."""
    await page.screenshot(path=str(shot), full_page=True)
    overflow = await page.evaluate(
        """() => {
          const width = window.innerWidth;
          const list = document.querySelector('[data-testid=message-list]').getBoundingClientRect();
          const wide = [document.scrollingElement.scrollWidth > width ? 'page' : null];
          for (const card of document.querySelectorAll(
            '[data-testid=tool-card], [data-testid=msg-file], [data-testid=approval-card]')) {
            const box = card.getBoundingClientRect();
            if (box.left < list.left - 1 || box.right > list.right + 1) wide.push(card.dataset.testid);
          }
          return wide.filter(Boolean);
        }"""
    )
    assert overflow == [], f"wider than the phone: {overflow}; screenshot {shot}"


async def _answered(chat: ChatPage, count: int) -> None:
    await chat.page.wait_for_function(
        "n => document.querySelectorAll('[data-testid=msg-assistant][aria-busy=false]').length >= n",
        arg=count,
        timeout=GUARD_MS,
    )


async def test_the_five_starters_show_a_tool_card_a_file_and_an_approval(open_chat: OpenChat, tmp_path: Path) -> None:
    chat = await open_chat()
    page = chat.page
    await page.set_viewport_size(PHONE)
    empty = page.get_by_test_id("empty-state")
    await expect(empty.get_by_role("button")).to_have_text(STARTERS)
    await _fits(page, tmp_path / "empty.png")

    await empty.get_by_role("button", name=STARTERS[0]).click()
    await _answered(chat, 1)
    for number in range(2, 5):  # the empty state is gone after the first message: type the starters' texts
        await chat.type_and_send(await _starter_text(chat, number - 1))
        await _answered(chat, number)

    files = page.get_by_test_id("msg-file")
    await expect(files).to_have_count(1)
    await expect(files).to_contain_text("hello.md")
    await expect(page.get_by_test_id("file-download")).to_have_attribute("download", "hello.md")

    cards = page.get_by_test_id("tool-card")
    shell = cards.filter(has_text="shell")
    if startup_choice(load_settings({"SWITCHBOARD_CONFIG": str(GATEWAY_CONFIG_PATH)})).sandbox is not None:
        await expect(shell).to_have_count(1)
        await expect(shell).to_have_attribute("data-state", "failed")  # its third command lists a missing file
        await shell.locator("summary").click()
        await expect(shell.get_by_test_id("tool-output")).to_contain_text("hello from the sandbox")
        await expect(shell.get_by_test_id("tool-output")).to_contain_text("42")
    programs = cards.filter(has_text="squares")
    await expect(programs).to_have_count(1)
    await expect(programs).to_have_attribute("data-state", "ok")
    await expect(cards.filter(has_text="sql")).to_have_attribute("data-state", "ok")
    await expect(page.get_by_test_id("msg-assistant").last).to_contain_text("region")  # the rows, as a table

    await chat.type_and_send(await _starter_text(chat, 4))
    approval = page.get_by_test_id("approval-card")
    await expect(approval).to_have_count(1, timeout=GUARD_MS)
    await expect(approval).to_contain_text("write_file")
    await expect(approval).to_contain_text("outbox/announcement.md")
    await _fits(page, tmp_path / "approval.png")

    buttons = page.get_by_test_id("msg-choices").last.get_by_role("button")
    await buttons.filter(has_text="Approve").first.click()
    await expect(page.get_by_test_id("choice-outcome").last).to_contain_text("Approved", timeout=GUARD_MS)
    for index in range(await buttons.count()):
        await expect(buttons.nth(index)).to_be_disabled()
    written = cards.filter(has_text="write_file").last
    await expect(written).to_have_attribute("data-state", "ok", timeout=GUARD_MS)
    await _fits(page, tmp_path / "approved.png")


async def _starter_text(chat: ChatPage, index: int) -> str:
    """The text of the session's ``index``-th starter, as the page received it with the session."""
    text = await chat.page.evaluate(
        """i => {
          for (const key of Object.keys(localStorage)) {
            try {
              const value = JSON.parse(localStorage.getItem(key));
              if (value && value.agent && Array.isArray(value.agent.starters)) return value.agent.starters[i].text;
            } catch (e) {}
          }
          return null;
        }""",
        index,
    )
    assert isinstance(text, str), "the page keeps its session's agent (with its starters) in localStorage"
    return text
