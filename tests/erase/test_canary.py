"""``switchboard erase``: a canary put in every store for one person is gone from every Redis key and workspace after,
and another person's and another tenant's canaries are untouched; ``--dry-run`` changes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.runtime import Runtime
from switchboard.core.approvals.records import ApprovalRecord, ApprovalRequest, new_approval_id
from switchboard.core.budgets import BudgetRule
from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.providers.offline import OfflineModel
from switchboard.core.schedules import JobTarget, ScheduleSpec
from switchboard.core.tools.builtin import default_registry
from switchboard.core.workspaces.store import LocalWorkspaces
from switchboard.queue.approvals import RedisApprovals
from switchboard.queue.budgets import Budgets
from switchboard.queue.effects import doubt_field
from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import parse_entry
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys
from switchboard.queue.lease import Lease
from switchboard.queue.people import People
from switchboard.queue.schedules import create_job
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey
from switchboard.worker.drain import Drainer
from tests.queue.conftest import RecordingDeliverer, echo_runner

AGENT = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.")


def budgets(client: aioredis.Redis) -> Budgets:
    """A per-user daily budget of 10 credits: a charge of 9 makes a counter and an alert per person."""
    return Budgets(client, [BudgetRule(scope="user", credits=10)])


G = GlobalKeys()

# (tenant, channel, sender id, canary): U has two linked identities; V is another user of the tenant; W is the
# same sender id as U's Telegram one, in another tenant.
U_TG = ("acme", "telegram", "4242", "CANARY-U-TG-7f3a")
U_SLACK = ("acme", "slack", "U4242", "CANARY-U-SL-7f3a")
V = ("acme", "telegram", "7777", "CANARY-V-91c2")
W = ("globex", "telegram", "4242", "CANARY-W-0d5e")
U_CANARIES = ("CANARY-U-TG-7f3a", "CANARY-U-SL-7f3a", "CANARY-U-", "U4242")
GROUP = "CANARY-G-55aa"
OTHERS = ("CANARY-V-91c2", "CANARY-W-0d5e", GROUP)


def message(who: tuple[str, str, str, str], text: str, n: int, conversation: str | None = None) -> InboundMessage:
    tenant, channel, sender, _ = who
    where = conversation or sender
    return InboundMessage(
        dedup_key=f"{tenant}-{channel}-{sender}-{n}",
        conversation=ConversationRef(tenant=tenant, agent="assistant", channel=channel, conversation=where),  # type: ignore[arg-type]
        sender=Sender(id=sender, name="Someone"),
        text=text,
    )


def approval(session: SessionKey, who: tuple[str, str, str, str]) -> ApprovalRecord:
    now = time.time()
    return ApprovalRecord(
        id=new_approval_id(),
        session=session,
        tenant=who[0],
        agent="assistant",
        channel=who[1],
        run_id="run-1",
        requested_by=f"{who[1]}:{who[2]}",
        requested_at=now,
        expires_at=now + 3600,
        request=ApprovalRequest(
            tool="pay",
            arguments={"amount": 250, "memo": who[3]},
            action_sha256="ab" * 32,
            idempotency_key="k1",
            resources=("invoice:7",),
            reason="amount > 100",
            rule="big-payments",
            policy_version="v1",
            risk="high",
            reversible=False,
        ),
        state_sha256="cd" * 32,
        call_id="call-1",
        approvers=("requester", "operators"),
    )


async def everything(redis: aioredis.Redis) -> dict[str, bytes]:
    """Every key's name and whole content (every type), as bytes to search."""
    out: dict[str, bytes] = {}
    async for raw in redis.scan_iter(count=1000):
        key = raw.decode()
        kind = (await redis.type(key)).decode()
        value: Any
        if kind == "string":
            value = [await redis.get(key)]
        elif kind == "hash":
            value = sorted(sum(((k, v) for k, v in (await redis.hgetall(key)).items()), ()))  # type: ignore[misc]
        elif kind == "list":
            value = await redis.lrange(key, 0, -1)  # type: ignore[misc]
        elif kind == "set":
            value = sorted(await redis.smembers(key))  # type: ignore[misc]
        elif kind == "zset":
            value = [m for m, _ in await redis.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            value = [repr(sorted(fields.items())).encode() for _, fields in await redis.xrange(key)]
        else:
            raise AssertionError(f"a key of an unexpected type: {key} ({kind})")
        out[key] = key.encode() + b"\0" + b"\0".join(v for v in value if v is not None)
    return out


async def drain_entries(client: aioredis.Redis) -> list[str]:
    """Every drain entry waiting in any shard's drain queue, shard by shard."""
    async with client.pipeline(transaction=False) as pipe:
        for shard in ShardKeys.every():
            pipe.lrange(shard.drainq, 0, -1)
        return [e.decode() for queue in await pipe.execute() for e in queue]


def holding(dump: dict[str, bytes], canary: str) -> set[str]:
    return {key for key, blob in dump.items() if canary.encode() in blob}


def untouched(before: dict[str, bytes], after: dict[str, bytes], erased: tuple[str, ...]) -> None:
    """Keys that held nothing erased are byte for byte as they were; the others keep every other canary they held."""
    for key, blob in before.items():
        if not any(c.encode() in blob for c in erased):
            assert after.get(key) == blob, key
        for canary in OTHERS:
            if canary not in erased:
                assert after.get(key, b"").count(canary.encode()) == blob.count(canary.encode()), (key, canary)


def files_holding(root: Path, canary: str) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if canary in p.name or (p.is_file() and canary.encode() in p.read_bytes())
    }


def sb(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args], env=env, capture_output=True, text=True, timeout=60
    )


async def seed(
    client: aioredis.Redis, ingestor: Ingestor, settings: QueueSettings, deliverer: RecordingDeliverer, root: Path
) -> None:
    """Put each person's canary in every store, through the real pipeline where there is one."""
    factory = ModelFactory(ProviderConfig())
    factory.override("offline", OfflineModel())
    runtime = Runtime(models=factory, tools=default_registry(), workspace_root=root)
    drain = Drainer(
        client, settings, runner=runtime.run_turn, deliverer=deliverer, agent_for=lambda m: AGENT, worker_id="w1"
    )
    poison = Drainer(
        client, settings, runner=echo_runner, deliverer=deliverer, agent_for=lambda m: AGENT, worker_id="w2"
    )
    store = LocalWorkspaces(root)
    people = People(client)
    await people.link("acme", ["telegram:4242", "slack:U4242"], "alice", by="test")
    await people.link("acme", ["telegram:7777"], "victor", by="test")
    await people.link("globex", ["telegram:4242"], "alice", by="test")
    for n, who in enumerate((U_TG, U_SLACK, V, W)):
        first = message(who, f"hello, my code is {who[3]}", n)
        session = first.session_key
        await ingestor.ingest(first)
        await drain.drain(session)
        # a poison message dead-letters (session list and the global stream)
        bad = message(who, f"poison {who[3]}", 100 + n)
        await ingestor.ingest(bad)
        for _ in range(settings.max_attempts + 1):
            await poison.drain(session)
        lease = await Lease(client, worker_id="w3", lease_ms=60_000).acquire(session)
        assert lease is not None
        await RedisApprovals(client, session, lease.token, lease.epoch).approval_open(approval(session, who))
        await Lease(client, worker_id="w3", lease_ms=60_000).abandon(lease)
        await create_job(
            client,
            ScheduleSpec(
                id=f"job-{who[3]}",
                tenant=who[0],
                target=JobTarget(channel=who[1], conversation=who[2], agent="assistant"),
                action="message",
                text=f"remember {who[3]}",
                cron="0 9 * * *",
            ),
        )
        home = store.path(session)
        home.mkdir(parents=True, exist_ok=True)
        (home / "notes.txt").write_text(f"notes {who[3]}")
        await client.hset(SessionKeys(session).web_upload("up1"), mapping={"name": "a.txt", "data": who[3]})
        # the shapes the web chat, pairing and effect reconciliation write (their flows are tested where they live)
        await client.set(G.web_token(f"{n:064x}"), session)
        await client.set(SessionKeys(session).shard.web_ticket(f"{n + 10:064x}"), session)
        paired = {"role": "user", "at": time.time(), "by": "op", "session": session}
        await client.hset(G.access_paired(who[0]), f"{who[1]}:{who[2]}", json.dumps(paired))
        doubts = SessionKeys(session).shard.effects_in_doubt(who[0])
        await client.hset(doubts, doubt_field(session, "k1"), json.dumps({"memo": who[3]}))
        person = await people.person_of(who[0], f"{who[1]}:{who[2]}")
        assert person is not None
        await budgets(client).charge(budgets(client).counters(who[0], "assistant", person, f"{who[1]}:{who[2]}"), 9.0)
    for n, who in enumerate((U_TG, V)):  # a group both U and V write in: shared, so a person's erasure keeps it
        group = message(who, f"in the group: {GROUP}", 200 + n, conversation="-100group")
        await ingestor.ingest(group)
        await drain.drain(group.session_key)
    await remember(root.parent / "memory")
    for who in (U_TG, V):  # an outbound webhook delivery waiting, and one given up, per session
        session = message(who, "x", 0).session_key
        body = json.dumps({"session": session, "data": {"memo": who[3]}})
        await client.hset(
            G.webhook_deliveries(who[0]), f"0:{who[3]}", json.dumps({"endpoint": 0, "body": json.loads(body)})
        )
        await client.zadd(G.webhook_due(who[0]), {f"0:{who[3]}": time.time()})
        await client.xadd(G.webhook_dead(who[0]), {"delivery": f"1:{who[3]}", "body": body})


KNOWLEDGE = "CANARY-K-acme-3b9d"


async def remember(memory_root: Path) -> None:
    """Each person's canary in the memory store as a fact remembered for them, and a knowledge document in acme."""
    store = SQLiteMemoryStore(memory_root)
    try:
        for n, who in enumerate((U_TG, U_SLACK, V, W)):
            actor = f"{who[1]}:{who[2]}"
            fact = Fact(
                id=f"f{n}",
                project="notes",
                tenant=who[0],
                text=f"the code of this customer is {who[3]}",
                source=Source(kind="message", quote=f"my code is {who[3]}"),
                run_id="run-1",
                actor=actor,
            )
            await store.add(fact, FactChange(fact_id=fact.id, project="notes", op="remembered", actor=actor))
        document = Fact(
            id="k1",
            project="knowledge.assistant",
            tenant="acme",
            kind="document",
            text=f"The return policy. Reference {KNOWLEDGE}.",
            source=Source(kind="url", ref="https://example.com/returns", quote="The return policy"),
            run_id="index",
        )
        await store.add(document, FactChange(fact_id="k1", project=document.project, op="remembered", actor="indexer"))
    finally:
        store.close()


async def test_erasing_a_person_leaves_none_of_their_canaries_and_touches_no_one_else(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    base_env: dict[str, str],
) -> None:
    root = Path(base_env["SWITCHBOARD_DATA_DIR"]) / "workspaces"
    await seed(client, ingestor, queue_settings, deliverer, root)
    before = await everything(client)
    queued = await drain_entries(client)
    assert holding(before, GROUP)
    for canary in (*U_CANARIES, *OTHERS[:2]):
        found = holding(before, canary)
        kinds = {(await client.type(k)).decode() for k in found}
        assert {"list", "hash", "stream"} <= kinds, (canary, kinds)
        assert len(found) >= 5, (canary, found)
    assert files_holding(root, "CANARY-U-")
    assert len(files_holding(root.parent / "memory", "CANARY-U-")) == 1  # in acme's file, in the clear

    dry = await asyncio.to_thread(sb, "erase", "--tenant", "acme", "--user", "alice", "--dry-run", env=base_env)
    assert dry.returncode == 0, dry.stderr
    assert "would remove" in dry.stdout and "2 session(s)" in dry.stdout
    assert await everything(client) == before, "--dry-run changed something"
    assert files_holding(root, "CANARY-U-")
    assert "memory: not counted in a dry run" in dry.stdout
    assert files_holding(root.parent / "memory", "CANARY-U-")

    done = await asyncio.to_thread(sb, "erase", "--tenant", "acme", "--user", "telegram:4242", env=base_env)
    assert done.returncode == 0, done.stderr
    assert "removed" in done.stdout and "2 session(s)" in done.stdout
    assert "kept: 1 session(s) shared with other senders" in done.stdout
    for canary in U_CANARIES:
        assert canary not in done.stdout + done.stderr

    after = await everything(client)
    for canary in U_CANARIES:
        assert holding(after, canary) == set(), canary
    assert files_holding(root, "CANARY-U-") == set()
    memory = root.parent / "memory"  # the memory store's files: bytes of the database, its journal and WAL
    assert files_holding(memory, "CANARY-U-") == set()
    assert len(files_holding(memory, "CANARY-V-")) == 1 and len(files_holding(memory, "CANARY-W-")) == 1
    assert files_holding(memory, KNOWLEDGE)
    assert "memory facts: 2" in done.stdout and "webhook deliveries: 2" in done.stdout
    assert await People(client).person_of("acme", "slack:U4242") is None
    u_sessions = tuple(message(who, "x", 0).session_key for who in (U_TG, U_SLACK))
    for session in u_sessions:  # nor a reference to their sessions (indexes, registries, tokens)
        assert holding(after, session) == set(), session
    # the tenant's people links and their log held U's and V's links: V's must remain (checked below)
    # the shards' drain queues: the entries left are exactly those of the sessions kept
    u_budgets = tuple(c.key for c in budgets(client).counters("acme", "assistant", "alice", "telegram:4242"))
    links = {G.people("acme"), G.people_log("acme"), G.budget_alerts("acme")}
    untouched({k: v for k, v in before.items() if k not in links}, after, (*U_CANARIES, *u_sessions, *u_budgets))
    assert u_budgets and not any(k in after for k in u_budgets)
    alerts = [f[b"subject"] for _, f in await client.xrange(G.budget_alerts("acme"))]
    assert alerts == [b"victor"]
    assert await client.hkeys(G.access_paired("acme")) == [b"telegram:7777"]  # type: ignore[misc]
    left = await drain_entries(client)
    assert left == [e for e in queued if parse_entry(e)[0] not in u_sessions] and len(left) < len(queued)
    assert await People(client).person_of("acme", "telegram:7777") == "victor"
    assert len(files_holding(root, "CANARY-V-")) == 1 and len(files_holding(root, "CANARY-W-")) == 1
    assert await People(client).person_of("globex", "telegram:4242") == "alice"

    audit = await client.xrange(G.erasures)
    assert len(audit) == 1
    fact = {k.decode(): v.decode() for k, v in audit[0][1].items()}
    assert fact["scope"] == "user" and fact["tenant"] == "acme" and fact["by"].startswith("cli:")
    assert "4242" not in repr(fact)


async def test_erasing_a_tenant_leaves_none_of_it_and_touches_no_other_tenant(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    base_env: dict[str, str],
) -> None:
    root = Path(base_env["SWITCHBOARD_DATA_DIR"]) / "workspaces"
    await seed(client, ingestor, queue_settings, deliverer, root)
    before = await everything(client)
    done = await asyncio.to_thread(sb, "erase", "--tenant", "acme", env=base_env)
    assert done.returncode == 0, done.stderr
    after = await everything(client)
    for canary in (*U_CANARIES, "CANARY-V-91c2", GROUP):
        assert holding(after, canary) == set(), canary
    leftovers = {k for k in after if "acme" in k and k != G.erasures}
    assert leftovers == set()
    assert files_holding(root, "CANARY-U-") == set() and files_holding(root, "CANARY-V-") == set()
    untouched(before, after, (*U_CANARIES, "CANARY-V-91c2", GROUP, "acme"))
    assert len(files_holding(root, "CANARY-W-")) == 1
    memory = root.parent / "memory"
    for canary in (*U_CANARIES, "CANARY-V-91c2", KNOWLEDGE):
        assert files_holding(memory, canary) == set(), canary
    assert not any("acme" in p.name for p in memory.iterdir())
    assert len(files_holding(memory, "CANARY-W-")) == 1
    assert "memory facts: 4" in done.stdout


async def test_erasing_one_session_leaves_the_persons_other_sessions(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    base_env: dict[str, str],
) -> None:
    root = Path(base_env["SWITCHBOARD_DATA_DIR"]) / "workspaces"
    await seed(client, ingestor, queue_settings, deliverer, root)
    session = message(U_TG, "x", 0).session_key
    done = await asyncio.to_thread(sb, "erase", "--tenant", "acme", "--session", session, env=base_env)
    assert done.returncode == 0, done.stderr
    after = await everything(client)
    assert holding(after, "CANARY-U-TG-7f3a") == set()
    assert holding(after, "CANARY-U-SL-7f3a")
    assert files_holding(root, "CANARY-U-SL-7f3a") and not files_holding(root, "CANARY-U-TG-7f3a")


async def test_bad_input_is_a_clear_error_and_changes_nothing(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    base_env: dict[str, str],
) -> None:
    root = Path(base_env["SWITCHBOARD_DATA_DIR"]) / "workspaces"
    await seed(client, ingestor, queue_settings, deliverer, root)
    before = await everything(client)
    other_tenants = message(W, "x", 0).session_key
    for args in (
        ("--tenant", "acme", "--user", "nobody"),
        ("--tenant", "acme", "--user", "Not A Person"),
        ("--tenant", "acme", "--user", "telegram:"),
        ("--tenant", "acme", "--session", other_tenants),
        ("--tenant", "acme", "--user", "alice", "--session", other_tenants),
        ("--tenant", "a/b"),
    ):
        result = await asyncio.to_thread(sb, "erase", *args, env=base_env)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "switchboard" in result.stderr
    assert await everything(client) == before
