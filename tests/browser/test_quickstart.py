"""The quickstart as a newcomer follows it: `make run`'s shipped configuration, the empty chat's five starters, in
real Chromium at a phone's width, then the operator console showing that conversation.

Within those five messages the page must show a tool card for a shell run, a file sent as a card, and an approval
asked as a card whose buttons reflect the decision; nothing may overflow 390 px. The shipped files are copied as
they are, plus one console operator (the shipped file lists none). The screenshots are kept in the test's temporary
directory (their paths are in any failure message).
"""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
from playwright.async_api import Page, ViewportSize, expect

from switchboard.cli.sandbox import startup_choice
from switchboard.settings import load_settings
from switchboard.web.console.passwords import hash_password
from tests.browser.conftest import GUARD_MS, ChatPage, ConsolePage, Gateway, run_gateway

OpenChat = Callable[[], Awaitable[ChatPage]]

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

SHIPPED: Final = Path(__file__).resolve().parents[2] / "config"
"""The folder of the file `make run` reads."""
PASSWORD: Final = "the quickstart operator's password"
OPERATOR: Final = """
console:
  operators:
    - {{name: alice, password_hash: "{hash}", tenants: [default]}}
"""
PHONE: Final[ViewportSize] = {"width": 390, "height": 844}
STARTERS: Final = [
    "Send me a file",
    "Run shell commands",
    "Run a short program",
    "Query the shop database",
    "Publish an announcement (asks for approval)",
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """`make run`'s configuration (its folder copied, paths in it stay relative to it) and one operator."""
    root = tmp_path_factory.mktemp("quickstart")
    shutil.copytree(SHIPPED, root / "config")
    config = root / "config" / "switchboard.yaml"
    config.write_text(config.read_text() + OPERATOR.format(hash=hash_password(PASSWORD)))
    yield from run_gateway(root, config, delay_ms=0)


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


async def test_the_five_starters_show_a_tool_card_a_file_and_an_approval_and_the_console_the_transcript(
    open_chat: OpenChat, open_console: Callable[[], Awaitable[ConsolePage]], tmp_path: Path
) -> None:
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
    sandboxed = startup_choice(load_settings({"SWITCHBOARD_CONFIG": str(SHIPPED / "switchboard.yaml")})).sandbox
    if sandboxed is not None:
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

    console = await open_console()
    await console.sign_in("alice", PASSWORD)
    await console.open_session(f"default/demo/web/default/{await chat.session()}")
    lines = console.page.get_by_test_id("transcript").get_by_test_id("transcript-line")
    await expect(lines.filter(has_text="hello from the sandbox" if sandboxed else "squares")).not_to_have_count(0)
    kinds: list[str] = await console.page.evaluate(
        "() => Array.from(document.querySelectorAll('[data-testid=transcript-line]'), (li) => li.dataset.kind)"
    )
    assert kinds.count("user") >= 5 and "tool_call" in kinds and "approval" in kinds and "agent" in kinds, kinds
    await expect(lines.filter(has_text="outbox/announcement.md").first).to_be_visible()
    await console.page.screenshot(path=str(tmp_path / "console.png"))


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
