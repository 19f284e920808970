"""Files in real Chromium against a real ``switchboard run``: attach, see the names, send, the agent reads the file.

The offline model repeats what it was given, so its reply shows that the worker fetched the upload into the session
workspace and told the model its path. A file over the gateway's cap is refused with a clear message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from playwright.async_api import expect

from tests.browser.conftest import CHROMIUM, GUARD_MS, MAX_FILE_BYTES, SKIP_REASON, ChatPage

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

OpenChat = Callable[[], Awaitable[ChatPage]]


async def test_an_attached_file_is_listed_sent_and_read_by_the_agent(open_chat: OpenChat) -> None:
    chat = await open_chat()
    page = chat.page
    files = [
        {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"meeting at noon"},
        {"name": "figures.csv", "mimeType": "text/csv", "buffer": b"a,b\n1,2\n"},
    ]
    await page.get_by_test_id("file-input").set_input_files(files)  # type: ignore[arg-type]
    chosen = page.get_by_test_id("chosen-file")
    await expect(chosen).to_have_count(2)
    await expect(chosen.nth(0)).to_contain_text("notes.txt")
    await page.get_by_role("button", name="Remove figures.csv").click()  # changed my mind about one
    await expect(chosen).to_have_count(1)

    await chat.type_and_send("what does my note say?")
    await expect(chosen).to_have_count(0)  # the composer is cleared
    await expect(page.locator("[data-testid=msg-user] [data-testid=msg-files]")).to_contain_text("notes.txt")
    await chat.wait_answered(1)
    (user, reply) = await chat.transcript()
    assert user == ("user", "what does my note say?")
    assert "inbox/" in reply[1] and "notes.txt" in reply[1], reply  # the worker stored it and gave the model its path
    assert "figures.csv" not in reply[1]

    await chat.reload()  # the replayed history shows the file names too
    await expect(page.locator("[data-testid=msg-user] [data-testid=msg-files]")).to_contain_text("notes.txt")


async def test_a_file_alone_is_sent_and_one_over_the_cap_is_refused_clearly(open_chat: OpenChat) -> None:
    chat = await open_chat()
    page = chat.page
    big = {"name": "huge.bin", "mimeType": "application/octet-stream", "buffer": b"x" * (MAX_FILE_BYTES * 32)}
    await page.get_by_test_id("file-input").set_input_files(big)  # type: ignore[arg-type]
    await page.get_by_test_id("send-button").click()
    error = page.locator("[data-testid=msg-user] [data-testid=msg-error]")
    await expect(error).to_contain_text("huge.bin is too large", timeout=GUARD_MS)
    await expect(error).to_have_attribute("role", "alert")
    refused = [e for e in chat.errors if "status of 413" in e]
    assert len(refused) == 1  # Chromium logs the refused upload itself; the page shows it, as asserted above
    chat.errors.remove(refused[0])

    small = {"name": "a.txt", "mimeType": "text/plain", "buffer": b"hello file"}
    await page.get_by_test_id("file-input").set_input_files(small)  # type: ignore[arg-type]
    await page.get_by_test_id("send-button").click()  # no text: the file alone is the message
    await chat.wait_answered(1)
    reply = (await chat.transcript())[-1]
    assert reply[0] == "assistant" and "a.txt" in reply[1], reply
