"""The web chat page end to end: real ``switchboard run``, real headless Chromium, a user's clicks and keys.

Each test opens the page in a fresh browser context (a new session). States that last only a moment (a partial
reply, a queued label, the typing indicator) are read from the timeline the page records of itself (see
``conftest.RECORDER_JS``), so no assertion depends on how fast a poll happens to be.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from playwright.async_api import expect

from tests.browser.conftest import CHROMIUM, GUARD_MS, SCREENSHOT, SKIP_REASON, ChatPage, Snapshot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

OpenChat = Callable[[], Awaitable[ChatPage]]


def _user(snapshot: Snapshot, text: str) -> dict[str, Any] | None:
    return next((i for i in snapshot["items"] if i["role"] == "user" and i["text"] == text), None)


def _reply(snapshot: Snapshot, reply_to: str) -> dict[str, Any] | None:
    return next((i for i in snapshot["items"] if i["role"] == "assistant" and i["reply_to"] == reply_to), None)


def _first(timeline: list[Snapshot], test: Callable[[Snapshot], bool]) -> int:
    """Index of the first snapshot passing ``test`` (the length of the timeline when none does)."""
    return next((n for n, snapshot in enumerate(timeline) if test(snapshot)), len(timeline))


async def test_reply_streams_into_one_bubble_and_quotes_the_message(open_chat: OpenChat) -> None:
    chat = await open_chat()
    text = "Please stream this sentence back to me"
    await chat.type_and_send(text, click=True)
    await expect(chat.page.locator("[data-testid=msg-user] .body")).to_have_text(text, timeout=GUARD_MS)
    await chat.wait_answered(1)

    transcript = await chat.transcript()
    assert [role for role, _ in transcript] == ["user", "assistant"], transcript
    final = transcript[1][1]
    assert text in final, "the offline model quotes the message verbatim"

    timeline = await chat.timeline()
    assert all(sum(i["role"] == "assistant" for i in s["items"]) <= 1 for s in timeline), "one bubble per reply"
    shown: list[str] = []
    for snapshot in timeline:
        for item in snapshot["items"]:
            if item["role"] == "assistant" and item["text"] and (not shown or shown[-1] != item["text"]):
                shown.append(item["text"])
    assert shown[-1] == final
    partials = shown[:-1]
    assert len(partials) >= 2, (
        f"the reply should stream into its bubble: expected at least two partial texts before the final one, "
        f"the bubble showed {shown!r}"
    )
    for shorter, longer in itertools.pairwise(shown):
        assert longer.startswith(shorter) and longer != shorter, f"streamed text only grows: {shown!r}"


async def test_typing_indicator_shows_while_a_run_is_in_progress(open_chat: OpenChat) -> None:
    chat = await open_chat()
    typing = chat.page.get_by_test_id("typing-indicator")
    await expect(typing).to_be_hidden()
    await chat.type_and_send("are you typing?")
    await chat.wait_answered(1)
    await expect(typing).to_be_hidden()

    timeline = await chat.timeline()
    sent = _first(timeline, lambda s: bool(s["items"]))
    replying = _first(timeline, lambda s: any(i["role"] == "assistant" for i in s["items"]))
    done = _first(timeline, lambda s: any(i["role"] == "assistant" and i["final"] for i in s["items"]))
    assert sent < replying < done < len(timeline), timeline
    assert not any(s["typing"] for s in timeline[:sent]), "hidden before anything was sent"
    assert any(s["typing"] for s in timeline[sent:replying]), "visible while the model works, before any text"
    assert all(s["typing"] for s in timeline[replying:done]), "visible while the reply streams"
    assert not any(s["typing"] for s in timeline[done:]), "hidden once the reply is complete"


async def test_message_sent_during_a_run_shows_queued_and_both_are_answered_in_order(open_chat: OpenChat) -> None:
    chat = await open_chat()
    first = "first message, answer me first"
    second = "second message, sent while the first one runs"
    await chat.type_and_send(first)
    await chat.type_and_send(second)
    await chat.page.screenshot(path=SCREENSHOT)
    await chat.wait_answered(2)

    transcript = await chat.transcript()
    assert [role for role, _ in transcript] == ["user", "assistant", "user", "assistant"], transcript
    assert transcript[0][1] == first and transcript[2][1] == second
    assert first in transcript[1][1] and second not in transcript[1][1]
    assert second in transcript[3][1] and first not in transcript[3][1]

    timeline = await chat.timeline()
    end = timeline[-1]["items"]
    first_id, second_id = end[1]["reply_to"], end[3]["reply_to"]
    assert first_id and second_id and first_id != second_id

    def second_queued_while_first_runs(s: Snapshot) -> bool:
        waiting = _user(s, second)
        answer = _reply(s, first_id)
        return (
            s["typing"]
            and waiting is not None
            and waiting["state"] == "queued"
            and waiting["status"] == "queued"
            and not (answer and answer["final"])
        )

    assert any(second_queued_while_first_runs(s) for s in timeline), "the second message showed as queued"
    first_done = _first(timeline, lambda s: bool((r := _reply(s, first_id)) and r["final"]))
    second_starts = _first(timeline, lambda s: _reply(s, second_id) is not None)
    assert first_done < second_starts < len(timeline), "the second reply starts only after the first is complete"
    assert all(i["status"] == "" for i in end if i["role"] == "user"), "no label is left once both are answered"


async def test_reload_keeps_the_conversation_in_order_without_duplicates(open_chat: OpenChat) -> None:
    chat = await open_chat()
    await chat.type_and_send("remember me across a reload")
    await chat.type_and_send("and me too, in this order")
    await chat.wait_answered(2)
    before = await chat.transcript()
    session = await chat.session()

    await chat.reload()
    await chat.wait_answered(2)
    assert await chat.transcript() == before
    assert await chat.session() == session

    # Anything replayed late would land before this exchange, which the stream delivers after the history.
    third = "a third message after the reload"
    await chat.type_and_send(third)
    await chat.wait_answered(3)
    after = await chat.transcript()
    assert after[:4] == before
    assert len(after) == 6 and after[4] == ("user", third)
    assert after[5][0] == "assistant" and third in after[5][1]


async def test_what_time_is_it_is_answered_with_the_time_from_the_tool(open_chat: OpenChat) -> None:
    chat = await open_chat()
    await chat.type_and_send("what time is it?")
    await chat.wait_answered(1)
    answer = (await chat.transcript())[1][1]

    match = re.search(r"It is (\d{2}:\d{2}:\d{2}) on \w+ (\d{4}-\d{2}-\d{2}) \(UTC\)", answer)
    assert match, f"expected the current_time tool's time in the answer, got {answer!r}"
    told = dt.datetime.fromisoformat(f"{match.group(2)}T{match.group(1)}+00:00")
    assert abs(dt.datetime.now(dt.UTC) - told) < dt.timedelta(minutes=5), f"{answer!r} is not the current time"


async def test_a_second_browser_gets_its_own_empty_conversation(open_chat: OpenChat) -> None:
    alice = await open_chat()
    await alice.type_and_send("alice's private message")
    await alice.wait_answered(1)

    bob = await open_chat()
    await expect(bob.page.get_by_test_id("message-list").locator("li")).to_have_count(0)
    assert await bob.session() != await alice.session()
    await bob.type_and_send("bob's own message")
    await bob.wait_answered(1)
    bob_sees = await bob.transcript()
    assert [role for role, _ in bob_sees] == ["user", "assistant"], bob_sees
    assert bob_sees[0][1] == "bob's own message" and "alice" not in bob_sees[1][1]

    # Bob's events would reach Alice before the reply to this message, which her stream delivers later.
    await alice.type_and_send("alice again")
    await alice.wait_answered(2)
    alice_sees = await alice.transcript()
    assert [text for role, text in alice_sees if role == "user"] == ["alice's private message", "alice again"]
    assert not any("bob" in text for _, text in alice_sees)
