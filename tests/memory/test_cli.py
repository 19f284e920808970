"""``switchboard memory`` as an operator runs it: a real subprocess, the real store and the suite's real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.queue.keys import GlobalKeys

CONFIG = """
default_agent: support
projects:
  shop: {tenant: acme}
  rival: {tenant: globex}
agents:
  support:
    profile: {name: Support}
    instructions: Help.
    projects: [shop]
  helper:
    profile: {name: Helper}
    instructions: Help.
"""


def sb(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "memory", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
async def env(base_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "memory.yaml"
    config.write_text(CONFIG)
    store = SQLiteMemoryStore(Path(base_env["SWITCHBOARD_DATA_DIR"]) / "memory")
    said = Source(kind="message", ref="m1", quote="ships on Friday")
    for fact_id, project, tenant in (("f_a1", "shop", "acme"), ("f_b1", "rival", "globex")):
        fact = Fact(
            id=fact_id, project=project, tenant=tenant, text="Ann's order ships on Friday", source=said, run_id="r1"
        )
        await store.add(fact, FactChange(fact_id=fact_id, project=project, op="remembered", actor="web:ann"))
    store.close()
    return {**base_env, "SWITCHBOARD_CONFIG": str(config)}


def test_list_show_correct_forget_and_connect(env: dict[str, str], sync_redis: redis.Redis) -> None:
    projects = sb("projects", env=env)
    assert projects.returncode == 0, projects.stderr
    assert projects.stdout.splitlines() == [
        "rival  tenant globex  1 fact(s)  agents: -",
        "shop  tenant acme  1 fact(s)  agents: support",
    ]
    [fact] = [json.loads(line) for line in sb("facts", "--tenant", "acme", "--json", env=env).stdout.splitlines()]
    assert (fact["id"], fact["project"], fact["text"]) == ("f_a1", "shop", "Ann's order ships on Friday")

    corrected = sb("correct", "f_a1", "--tenant", "acme", "--text", "Ann's order ships on Monday",
                   "--reason", "the shop moved it", "--by", "ops:dana", env=env)  # fmt: skip
    assert corrected.returncode == 0 and corrected.stdout.strip() == "corrected f_a1 (by ops:dana)", corrected.stderr
    shown = sb("show", "f_a1", "--tenant", "acme", env=env).stdout
    assert "text: Ann's order ships on Monday" in shown and "corrected  by ops:dana: the shop moved it" in shown
    assert "remembered  by web:ann" in shown

    assert sb("connect", "helper", "shop", "--by", "ops:dana", env=env).returncode == 0
    assert "agents: support, helper  (connected here: helper)" in sb("projects", "--tenant", "acme", env=env).stdout

    forgot = sb("forget", "f_a1", "--tenant", "acme", "--reason", "Ann asked us to", env=env)
    assert forgot.returncode == 0, forgot.stderr
    assert sb("facts", "--tenant", "acme", env=env).stdout.strip() == "no facts in tenant acme"
    assert sb("facts", "--tenant", "globex", env=env).stdout.count("f_b1") == 1  # the other tenant's is kept
    audit = [json.loads(line) for line in sb("audit", "--tenant", "acme", "--json", env=env).stdout.splitlines()]
    assert [(e["op"], e["fact_id"] or e["agent"], e["actor"]) for e in audit] == [
        ("forgotten", "f_a1", audit[0]["actor"]),
        ("connected", "helper", "ops:dana"),
        ("corrected", "f_a1", "ops:dana"),
    ]
    assert audit[0]["actor"].startswith("cli:")  # no --by: the login name


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["correct", "f_a1", "--tenant", "acme", "--reason", "because"], 2, "--text"),
        (["correct", "f_a1", "--tenant", "acme", "--text", "x", "--reason", "no"], 2, "reason"),
        (["correct", "f_a1", "--tenant", "acme", "--text", "x", "--reason", "why", "--confidence", "3"], 2, "0 to 1"),
        (["forget", "f_b1", "--tenant", "acme", "--reason", "because"], 1, "no fact f_b1"),
        (["forget", "--tenant", "acme", "--reason", "because"], 2, "a fact ID"),
        (["facts", "--tenant", "../etc"], 2, "not a tenant name"),
        (["connect", "helper", "rival2"], 1, "no project"),
    ],
)
def test_bad_input_is_refused_and_nothing_changes(
    env: dict[str, str], sync_redis: redis.Redis, args: list[str], code: int, message: str
) -> None:
    ran = sb(*args, env=env)
    assert ran.returncode == code and message in ran.stderr, ran.stderr
    assert "Friday" in sb("show", "f_a1", "--tenant", "acme", env=env).stdout
    assert sync_redis.xlen(GlobalKeys().memory_audit) == 0
