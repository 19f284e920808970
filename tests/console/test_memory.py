"""The console's memory view on the real app: projects and facts of the operator's tenants, correction and deletion
with who and why, connections; another tenant's facts out of reach; bad input a clear 400, nothing changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from switchboard.control.memory import memory_store
from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.queue.keys import GlobalKeys

from .conftest import HASH, Console, MakeConsole

CONFIG = f"""
default_agent: assistant
projects:
  shop: {{tenant: default}}
  rival: {{tenant: other}}
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
      password_hash: "{HASH}"
      tenants: [default]
    - name: bob
      password_hash: "{HASH}"
      tenants: [other]
    - name: carol
      password_hash: "{HASH}"
      tenants: [default]
      role: viewer
"""

SAID = Source(kind="message", ref="m1", quote="ships on Friday")


@pytest.fixture
async def console(base_env: dict[str, str], tmp_path: Path, make_console: MakeConsole) -> Console:
    config = tmp_path / "memory.yaml"
    config.write_text(CONFIG)
    made = await make_console({**base_env, "SWITCHBOARD_CONFIG": str(config)})
    store = memory_store(made.settings)
    for fact_id, project, tenant, text in (
        ("f_a1", "shop", "default", "Ann's order ships on Friday"),
        ("f_b1", "rival", "other", "Other's secret plan"),
    ):
        fact = Fact(id=fact_id, project=project, tenant=tenant, text=text, source=SAID, run_id="run-1")
        await store.add(fact, FactChange(fact_id=fact_id, project=project, op="remembered", actor="web:ann"))
    store.close()
    return made


async def _get(console: Console, path: str) -> tuple[int, Any]:
    answer = await console.client.get(f"/console/api/memory/{path}")
    return answer.status, await answer.json()


async def test_an_operator_lists_corrects_and_deletes_facts_of_their_tenant(console: Console) -> None:
    await console.login()
    status, body = await _get(console, "projects")
    assert status == 200 and [(p["name"], p["agents"], p["facts"]) for p in body["projects"]] == [
        ("shop", ["assistant"], 1)
    ]
    status, body = await _get(console, "facts?project=shop")
    (fact,) = body["facts"]
    assert (fact["id"], fact["text"], fact["source"]["kind"], fact["confidence"]) == (
        "f_a1",
        "Ann's order ships on Friday",
        "message",
        1.0,
    )
    assert fact["created_at"] > 0 and fact["links"] == []

    corrected = await console.write(
        "memory/correct", {"id": "f_a1", "text": "Ann's order ships on Monday", "reason": "the shop moved it"}
    )
    assert corrected.status == 200, await corrected.text()
    result = (await corrected.json())["result"]
    assert result["fact"]["text"] == "Ann's order ships on Monday" and result["fact"]["source"]["quote"] == SAID.quote
    status, body = await _get(console, "fact?id=f_a1&tenant=default")
    assert [(c["op"], c["actor"], c["reason"]) for c in body["changes"]] == [
        ("remembered", "web:ann", ""),
        ("corrected", "console:alice", "the shop moved it"),
    ]

    forgotten = await console.write("memory/forget", {"id": "f_a1", "reason": "Ann asked us to"})
    assert forgotten.status == 200 and (await forgotten.json())["result"]["actor"] == "console:alice"
    assert (await _get(console, "fact?id=f_a1"))[0] == 404
    assert (await _get(console, "facts"))[1] == {"facts": []}
    status, body = await _get(console, "audit")
    assert [(e["op"], e["actor"], e["fact_id"]) for e in body["audit"]] == [
        ("forgotten", "console:alice", "f_a1"),
        ("corrected", "console:alice", "f_a1"),
    ]


async def test_another_tenants_facts_are_out_of_reach(console: Console, sync_redis: redis.Redis) -> None:
    await console.login()  # alice: tenant default
    assert (await _get(console, "facts?tenant=other"))[0] == 403
    assert (await _get(console, "fact?tenant=default&id=f_b1"))[0] == 404
    assert (await _get(console, "fact?tenant=other&id=f_b1"))[0] == 403
    assert "rival" not in str((await _get(console, "projects"))[1])
    for path, body in (
        ("memory/correct", {"tenant": "other", "id": "f_b1", "text": "mine now", "reason": "because"}),
        ("memory/forget", {"tenant": "other", "id": "f_b1", "reason": "because"}),
        ("memory/correct", {"id": "f_b1", "text": "mine now", "reason": "because"}),
        ("memory/connect", {"agent": "helper", "project": "rival"}),
    ):
        assert (await console.write(path, body)).status in (403, 404)
    await console.client.post("/console/api/logout", headers={"X-CSRF-Token": console.csrf})
    await console.login("bob")
    status, body = await _get(console, "facts")
    assert status == 200 and [(f["id"], f["text"]) for f in body["facts"]] == [("f_b1", "Other's secret plan")]
    assert sync_redis.xlen(GlobalKeys().memory_audit) == 0


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("memory/correct", {"id": "f_a1", "text": "", "reason": "because"}, 400, "non-empty"),
        ("memory/correct", {"id": "f_a1", "text": "x" * 2001, "reason": "because"}, 400, "at most 2000"),
        ("memory/correct", {"id": "f_a1", "text": "fine"}, 400, "reason"),
        ("memory/correct", {"id": "f_a1", "text": "fine", "reason": "because", "confidence": 2}, 400, "confidence"),
        ("memory/correct", {"id": "f_*", "text": "fine", "reason": "because"}, 400, "not a fact id"),
        ("memory/correct", {"id": "f_ffff", "text": "fine", "reason": "because"}, 404, "no fact"),
        ("memory/correct", {"text": "fine", "reason": "because"}, 400, '"id"'),
        ("memory/forget", {"id": "f_a1", "reason": "no"}, 400, "reason"),
        ("memory/forget", {"id": "f_a1", "reason": "because", "tenant": 5}, 400, "tenant"),
        ("memory/forget", [1], 400, "JSON object"),
        ("memory/connect", {"agent": "nobody", "project": "shop"}, 404, "no agent"),
        ("memory/connect", {"agent": "assistant", "project": "shop"}, 400, "YAML"),
        ("memory/disconnect", {"agent": "helper", "project": "shop"}, 404, "not connected"),
    ],
)
async def test_bad_input_is_a_clear_error_and_changes_nothing(
    console: Console, sync_redis: redis.Redis, path: str, body: Any, status: int, message: str
) -> None:
    await console.login()
    answer = await console.write(path, body)
    assert answer.status == status and message in (await answer.json())["error"]["message"]
    (fact,) = (await _get(console, "facts"))[1]["facts"]
    assert fact["text"] == "Ann's order ships on Friday" and fact["updated_at"] is None
    assert sync_redis.xlen(GlobalKeys().memory_audit) == 0


async def test_an_operator_connects_and_disconnects_an_agent(console: Console) -> None:
    await console.login()
    connected = await console.write("memory/connect", {"agent": "helper", "project": "shop"})
    assert connected.status == 200 and (await connected.json())["result"]["connected"] == ["helper"]
    assert (await console.write("memory/connect", {"agent": "helper", "project": "shop"})).status == 400
    disconnected = await console.write("memory/disconnect", {"agent": "helper", "project": "shop"})
    assert disconnected.status == 200 and (await disconnected.json())["result"]["connected"] == []
    ops = [(e["op"], e["agent"], e["actor"]) for e in (await _get(console, "audit"))[1]["audit"]]
    assert ops == [("disconnected", "helper", "console:alice"), ("connected", "helper", "console:alice")]


async def test_writes_need_the_token_and_the_operator_role_and_a_viewer_sees_no_text(console: Console) -> None:
    assert (await _get(console, "projects"))[0] == 401
    await console.login()
    body = {"id": "f_a1", "text": "changed", "reason": "because"}
    assert (await console.write("memory/correct", body, csrf=False)).status == 403
    await console.client.post("/console/api/logout", headers={"X-CSRF-Token": console.csrf})
    await console.login("carol")  # a viewer
    assert (await console.write("memory/correct", body)).status == 403
    assert (await console.write("memory/forget", {"id": "f_a1", "reason": "because"})).status == 403
    (fact,) = (await _get(console, "facts"))[1]["facts"]
    assert fact["redacted"] and fact["text"] == "" and fact["source"]["quote"] == ""
