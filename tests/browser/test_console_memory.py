"""The console's Memory tab in real Chromium against a real ``switchboard run``: projects and facts, a correction and
a deletion with their reasons in the history, an agent connected and disconnected; markup in a fact is shown as text;
a viewer sees the facts without write controls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
from playwright.async_api import Dialog, expect

from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.web.console.passwords import hash_password
from tests.browser.conftest import CHROMIUM, GUARD_MS, OFFLINE_DELAY_MS, SKIP_REASON, ConsolePage, Gateway, run_gateway

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

OpenConsole = Callable[[], Awaitable[ConsolePage]]
PASSWORD: Final = "operator password for the memory test"
HOSTILE: Final = "<img src=x onerror=alert(1)><b>bold</b> is a fact"
CONFIG: Final = """
default_agent: assistant
projects:
  shop: {{tenant: default}}
agents:
  assistant:
    profile: {{name: Assistant}}
    instructions: You are a test assistant.
    projects: [shop]
  helper:
    profile: {{name: Helper}}
    instructions: You help.
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
    """``python -m switchboard run`` with a project holding two facts, an operator and a viewer."""
    root = tmp_path_factory.mktemp("console-memory")
    config = root / "switchboard.yaml"
    config.write_text(CONFIG.format(hash=hash_password(PASSWORD)))
    yield from run_gateway(root, config, delay_ms=OFFLINE_DELAY_MS // 3)


async def _seed(gateway: Gateway) -> None:
    root = Path(gateway.stdout).parent
    store = SQLiteMemoryStore(root / "data" / "memory")
    said = Source(kind="message", ref="m1", quote="ships on Friday")
    for fact_id, text in (("f_a1", "Ann's order ships on Friday"), ("f_a2", HOSTILE)):
        fact = Fact(id=fact_id, project="shop", tenant="default", text=text, source=said, run_id="run-1")
        await store.add(fact, FactChange(fact_id=fact_id, project="shop", op="remembered", actor="web:ann"))
    store.close()


async def _signed_in(open_console: OpenConsole, name: str, facts: int) -> ConsolePage:
    console = await open_console()
    await console.page.set_viewport_size({"width": 1280, "height": 800})
    await console.sign_in(name, PASSWORD)
    await console.page.get_by_test_id("tab-memory").click()
    await (
        console.page.locator("[data-testid=memory-project-row][data-project=shop]")
        .get_by_test_id("memory-open")
        .click(timeout=GUARD_MS)
    )
    await expect(console.page.get_by_test_id("memory-fact-row")).to_have_count(facts, timeout=GUARD_MS)
    return console


async def test_an_operator_corrects_deletes_and_connects_in_the_page(
    gateway: Gateway, open_console: OpenConsole
) -> None:
    await _seed(gateway)
    console = await _signed_in(open_console, "alice", 2)
    page = console.page
    hostile = page.locator("[data-testid=memory-fact-row][data-id=f_a2]")
    await expect(hostile).to_contain_text(HOSTILE)  # markup shown as text
    assert await page.locator("main img, main b").count() == 0

    answers = ["Ann's order ships on Monday", "the shop moved it"]

    async def answer(dialog: Dialog) -> None:
        await dialog.accept(answers.pop(0))

    page.on("dialog", answer)
    fact = page.locator("[data-testid=memory-fact-row][data-id=f_a1]")
    await fact.get_by_test_id("memory-correct").click()
    await expect(fact).to_contain_text("Ann's order ships on Monday", timeout=GUARD_MS)
    await fact.get_by_test_id("memory-history-button").click()
    changes = page.get_by_test_id("memory-change")
    await expect(changes).to_have_count(2, timeout=GUARD_MS)
    await expect(changes.nth(1)).to_contain_text("corrected by console:alice: the shop moved it")

    answers.append("markup is not a fact")
    await hostile.get_by_test_id("memory-forget").click()
    await expect(page.get_by_test_id("memory-fact-row")).to_have_count(1, timeout=GUARD_MS)

    form = page.get_by_test_id("memory-connect")
    await form.get_by_test_id("memory-agent").fill("helper")
    await form.get_by_test_id("memory-project").fill("shop")
    await form.get_by_test_id("memory-connect-button").click()
    shop = page.locator("[data-testid=memory-project-row][data-project=shop]")
    await expect(shop.get_by_test_id("memory-disconnect")).to_have_count(1, timeout=GUARD_MS)
    await shop.get_by_test_id("memory-disconnect").click()
    await expect(shop.get_by_test_id("memory-disconnect")).to_have_count(0, timeout=GUARD_MS)
    assert answers == []


async def test_a_viewer_sees_facts_without_write_controls(gateway: Gateway, open_console: OpenConsole) -> None:
    viewer = await _signed_in(open_console, "victor", 1)  # the operator's test deleted one
    page = viewer.page
    await expect(page.get_by_test_id("memory-connect")).to_be_hidden()
    await expect(page.locator("[data-testid=memory-fact-row] em").first).to_have_text("withheld")
    for control in ("memory-correct", "memory-forget", "memory-disconnect"):
        assert await page.get_by_test_id(control).count() == 0, control
    assert await page.get_by_test_id("memory-history-button").count() == 1
