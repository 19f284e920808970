"""The console's action on draft agents proposed through ``mcp serve``: listed per tenant, accepted or rejected by
an operator of that tenant only, accepted into ``agents.d/<tenant>/`` where the next load reads it.
"""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.queue.drafts import DraftStore
from switchboard.settings import load_settings
from tests.console.conftest import Console, MakeConsole


def proposal(name: str) -> Agent:
    return Agent(name=name, profile=AgentProfile(name=name.title()), instructions=f"You are {name}.", tools=[])


async def test_an_operator_accepts_or_rejects_only_their_tenants_drafts(
    console_env: dict[str, str], make_console: MakeConsole, async_redis: aioredis.Redis
) -> None:
    store = DraftStore(async_redis)
    await store.propose("default", proposal("scout"), "mcp:desk")
    await store.propose("default", proposal("assistant"), "mcp:desk")  # the name of an agent of the file
    await store.propose("default", proposal("spammer"), "mcp:desk")
    await store.propose("other", proposal("rival"), "mcp:intruder")
    console: Console = await make_console(console_env)
    assert (await console.login("alice")).status == 200
    listed = await (await console.client.get("/console/api/drafts")).json()
    assert sorted((d["tenant"], d["name"], d["proposed_by"]) for d in listed["drafts"]) == [
        ("default", "assistant", "mcp:desk"),
        ("default", "scout", "mcp:desk"),
        ("default", "spammer", "mcp:desk"),
    ]
    assert (await console.write("drafts/accept", {"tenant": "other", "name": "rival"})).status == 403
    assert (await console.write("drafts/accept", {"tenant": "default", "name": "scout"}, csrf=False)).status == 403
    assert (await console.write("drafts/accept", {"tenant": "default"})).status == 400
    assert (await console.write("drafts/accept", {"tenant": "default", "name": "assistant"})).status == 409
    assert await store.get("default", "assistant") is not None  # refused: kept, nothing written

    accepted = await console.write("drafts/accept", {"tenant": "default", "name": "scout"})
    assert accepted.status == 200, await accepted.text()
    path = Path((await accepted.json())["result"]["path"])
    assert path == Path(console_env["SWITCHBOARD_CONFIG"]).parent / "agents.d" / "default" / "scout.yaml"
    assert (await console.write("drafts/accept", {"tenant": "default", "name": "scout"})).status == 404
    assert (await console.write("drafts/reject", {"tenant": "default", "name": "spammer"})).status == 200
    assert [d.agent.name for d in await store.all("default")] == ["assistant"]
    assert [d.agent.name for d in await store.all("other")] == ["rival"]
    config = load_settings(console_env).file
    assert config.agents["scout"].instructions == "You are scout." and config.agent_tenant("scout") == "default"
    assert "spammer" not in config.agents and "rival" not in config.agents
