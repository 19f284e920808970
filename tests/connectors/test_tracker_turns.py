"""The tracker pack end to end: the offline model's ``/tool`` calls against the fake GitHub Issues API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard.fakes.issues_api import IssuesApi
from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings
from tests.connectors.conftest import Conversation, connector_settings, serve_https

TOKEN = "ghp_REAL-tracker-token-9a8b7c6d5e4f"
HOST = "api.github.test"
YAML = """
default_agent: support
connectors:
  tracker: {{base_url: "https://{host}:{port}", repo: acme/shop, token: TRACKER_TOKEN}}
agents:
  support:
    profile: {{name: Support}}
    instructions: Help with issues.
    connectors: [tracker]
    egress:
      secrets:
        TRACKER_TOKEN: {{env: TRACKER_TOKEN_ENV, domains: [{host}]}}
"""


@pytest.fixture
async def tracker(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, tmp_path: Path
) -> AsyncIterator[tuple[Conversation, IssuesApi]]:
    api = IssuesApi(token=TOKEN)
    api.add_issue("acme/shop", "Refund button does nothing", "Clicking refund shows a spinner forever.")
    api.add_issue("acme/shop", "Dark mode", "Please add it.", labels=("idea",))
    api.add_comment("acme/shop", 1, "Seen on Safari too.", by="alice")
    api.add_issue("acme/other", "Refund elsewhere")
    async with serve_https(api.app(), HOST, tmp_path) as (port, ca):
        settings = connector_settings(
            tmp_path, YAML.format(host=HOST, port=port), port, ca, {"TRACKER_TOKEN_ENV": TOKEN}
        )
        yield Conversation(client, queue_settings, ingestor, settings, HOST, "support"), api


async def test_reads_return_the_tracker_s_data_with_the_token_sent_by_egress_only(
    tracker: tuple[Conversation, IssuesApi],
) -> None:
    chat, api = tracker
    await chat.tool("tracker_search_issues", {"q": "repo:acme/shop refund"})
    assert "Refund button does nothing" in chat.reply()
    assert "Dark mode" not in chat.reply() and "Refund elsewhere" not in chat.reply()
    await chat.tool("tracker_get_issue", {"number": 1})
    assert "spinner forever" in chat.reply()
    await chat.tool("tracker_list_comments", {"number": 1})
    assert "Seen on Safari too." in chat.reply()
    assert [hit["path"] for hit in api.hits] == [
        "/search/issues?q=repo:acme/shop+refund",
        "/repos/acme/shop/issues/1",
        "/repos/acme/shop/issues/1/comments",
    ]
    assert {hit["headers"]["Authorization"] for hit in api.hits} == {f"Bearer {TOKEN}"}
    called = await chat.events("tool_called")
    assert [(e["tool"], e["ok"]) for e in called] == [
        ("tracker_search_issues", True),
        ("tracker_get_issue", True),
        ("tracker_list_comments", True),
    ]
    assert TOKEN not in await chat.everything_stored()
    assert TOKEN not in json.dumps(chat.deliverer.texts())


async def test_a_search_outside_the_repository_is_refused_before_anything_is_sent(
    tracker: tuple[Conversation, IssuesApi],
) -> None:
    chat, api = tracker
    await chat.tool("tracker_search_issues", {"q": "repo:acme/shop repo:acme/other refund"})
    await chat.tool("tracker_search_issues", {"q": "repo:acme/other refund"})
    assert api.hits == []
    called = await chat.events("tool_called")
    assert [(e["tool"], e["ok"]) for e in called] == [("tracker_search_issues", False)] * 2


async def test_a_comment_waits_for_approval_and_is_posted_once_after_it(
    tracker: tuple[Conversation, IssuesApi],
) -> None:
    chat, api = tracker
    await chat.tool("tracker_comment", {"number": 1, "body": "A fix ships on Monday."})
    [asked] = await chat.events("approval_requested")
    assert (asked["tool"], asked["rule"]) == ("tracker_comment", "connector:tracker_comment")
    assert api.hits == []  # nothing was sent while it waits
    await chat.approve(asked["approval_id"])
    posts = [hit for hit in api.hits if hit["method"] == "POST"]
    assert len(posts) == 1
    assert posts[0]["path"] == "/repos/acme/shop/issues/1/comments"
    assert json.loads(posts[0]["body"]) == {"body": "A fix ships on Monday."}
    assert posts[0]["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert [c["body"] for c in api.comments[("acme/shop", 1)]][-1] == "A fix ships on Monday."
    await chat.send(chat.message("thanks"))  # a later turn does not repeat it
    await chat.approve(asked["approval_id"])  # nor does a second click
    assert len([hit for hit in api.hits if hit["method"] == "POST"]) == 1
    assert TOKEN not in await chat.everything_stored()


async def test_relaxed_writes_run_without_asking(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, tmp_path: Path
) -> None:
    api = IssuesApi(token=TOKEN)
    api.add_issue("acme/shop", "Refund button does nothing")
    async with serve_https(api.app(), HOST, tmp_path) as (port, ca):
        relaxed = YAML.replace("token: TRACKER_TOKEN}}", "token: TRACKER_TOKEN, approve_writes: false}}")
        settings = connector_settings(
            tmp_path, relaxed.format(host=HOST, port=port), port, ca, {"TRACKER_TOKEN_ENV": TOKEN}
        )
        chat = Conversation(client, queue_settings, ingestor, settings, HOST, "support")
        await chat.tool("tracker_comment", {"number": 1, "body": "On it."})
    assert await chat.events("approval_requested") == []
    assert [c["body"] for c in api.comments[("acme/shop", 1)]] == ["On it."]


async def test_opening_an_issue_waits_for_approval_too(tracker: tuple[Conversation, IssuesApi]) -> None:
    chat, api = tracker
    await chat.tool("tracker_open_issue", {"title": "Export as CSV", "labels": ["idea"]})
    [asked] = await chat.events("approval_requested")
    assert (asked["tool"], asked["rule"]) == ("tracker_open_issue", "connector:tracker_open_issue")
    assert api.hits == []
    assert len(api.repos["acme/shop"]) == 2
    await chat.approve(asked["approval_id"])
    assert api.repos["acme/shop"][3]["title"] == "Export as CSV"
    assert "#3" in chat.reply() or "issues/3" in chat.reply()
