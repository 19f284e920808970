"""The retention sweep: each kind with a rule loses what is older than it, and nothing else changes; no rule, no change.

Data is written through the real pipeline (ingest, drain, dead letter, approvals) into the suite's Redis; the sweep is
run with a clock moved forward, so "older than the rule" splits what was written before a mark from what came after.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import redis.asyncio as aioredis

from switchboard.core.approvals.records import ApprovalRecord, new_approval_id
from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.retention import RetentionConfig
from switchboard.core.workspaces.store import LocalWorkspaces
from switchboard.queue.approvals import RedisApprovals
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.lease import Lease
from switchboard.queue.retention import RetentionPlan, RetentionSweep, sweep_if_due
from switchboard.queue.store import load_history
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey
from switchboard.worker.worker import SessionWorker
from tests.erase.test_canary import everything, sb
from tests.queue.conftest import RecordingDeliverer, make_drainer
from tests.shardindexes import entries_of
from tests.waiting import wait_until

G = GlobalKeys()
DAY = 86400.0


def message(tenant: str, text: str, conversation: str = "c1") -> InboundMessage:
    return InboundMessage(
        dedup_key=f"{tenant}-{conversation}-{text}",
        conversation=ConversationRef(tenant=tenant, agent="assistant", channel="telegram", conversation=conversation),  # type: ignore[arg-type]
        sender=Sender(id="u1", name="User"),
        text=text,
    )


async def talk(
    client: aioredis.Redis,
    ingestor: Ingestor,
    settings: QueueSettings,
    deliverer: RecordingDeliverer,
    m: InboundMessage,
) -> SessionKey:
    drain = make_drainer(client, settings, deliverer)
    await ingestor.ingest(m)
    for _ in range(settings.max_attempts + 1):  # a poison message is retried, then dead-lettered
        await drain.drain(m.session_key)
    return m.session_key


def record(session: SessionKey, tenant: str) -> ApprovalRecord:
    now = time.time()
    return ApprovalRecord(
        id=new_approval_id(),
        kind="reply",
        session=session,
        tenant=tenant,
        agent="assistant",
        channel="telegram",
        run_id="run-1",
        requested_by="telegram:u1",
        requested_at=now,
        expires_at=now + 3600,
        draft="the held reply",
        state_sha256="cd" * 32,
    )


async def approvals(client: aioredis.Redis, session: SessionKey, tenant: str) -> tuple[str, str]:
    """One approval decided now and one left pending; their ids."""
    lease = await Lease(client, worker_id="w9", lease_ms=60_000).acquire(session)
    assert lease is not None
    store = RedisApprovals(client, session, lease.token, lease.epoch)
    decided, pending = record(session, tenant), record(session, tenant)
    await store.approval_open(decided)
    await store.approval_open(pending)
    outcome = await store.approval_decide(decided.id, "deny", "telegram:u1", "button", action_prefix=None)
    assert outcome.result == "applied"
    await Lease(client, worker_id="w9", lease_ms=60_000).abandon(lease)
    return decided.id, pending.id


RULES = {"history": "1d", "events": "1d", "dead_letters": "1d", "approvals": "1d", "workspaces": "1d"}


async def test_each_kind_loses_what_is_older_than_its_rule_and_other_tenants_keep_everything(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    spaces = LocalWorkspaces(tmp_path / "workspaces")
    args = (client, ingestor, queue_settings, deliverer)
    old = await talk(*args, message("acme", "first words"))
    await talk(*args, message("acme", "poison one"))
    decided, pending = await approvals(client, old, "acme")
    other = await talk(*args, message("globex", "their words"))
    await talk(*args, message("globex", "poison theirs"))
    await approvals(client, other, "globex")
    for session in (old, other):
        home = spaces.path(session)
        (home / "sub").mkdir(parents=True)
        (home / "sub" / "old.txt").write_text("old")
        os.utime(home / "sub" / "old.txt", (time.time() - 3 * DAY, time.time() - 3 * DAY))
    await asyncio.sleep(0.01)
    mark = time.time()
    await asyncio.sleep(0.01)
    (spaces.path(old) / "fresh.txt").write_text("fresh")
    await talk(*args, message("acme", "later words"))
    globex_before = {k: v for k, v in (await everything(client)).items() if "globex" in k}
    keys = SessionKeys(old)
    events_before = await client.xlen(keys.events)
    later_events = len(await client.xrange(keys.events, min=f"{int(mark * 1000)}-0"))
    assert 0 < later_events < events_before
    assert len(await load_history(client, old, 100)) == 4
    assert await client.llen(keys.dead) == 1 and len(await entries_of(client)) == 2

    config = RetentionConfig.model_validate({"tenants": {"acme": RULES}})
    before = await everything(client)
    dry = await RetentionSweep(client, config, workspaces=spaces, dry_run=True).run(now=mark + DAY)
    assert await everything(client) == before, "a dry run changed something"
    assert (spaces.path(old) / "sub" / "old.txt").exists()
    done = await RetentionSweep(client, config, workspaces=spaces).run(now=mark + DAY)
    assert done.counts == dry.counts
    assert dict(done.counts) == {
        ("acme", "events"): events_before - later_events,
        ("acme", "history"): 2,
        ("acme", "dead_letters"): 2,  # the session's list and the operators' stream
        ("acme", "approvals"): 1,
        ("acme", "workspaces"): 1,
    }
    assert await client.xlen(keys.events) == later_events
    assert [e.text for e in await load_history(client, old, 100)] == ["later words", "echo: later words"]
    assert await client.llen(keys.dead) == 0
    left = [json.loads(f[b"record"])["session"] for _, f in await entries_of(client)]
    assert left == [other]
    assert not await client.exists(keys.approval(decided))
    assert await client.hget(keys.approval(pending), "status") == b"pending"
    assert not (spaces.path(old) / "sub").exists() and (spaces.path(old) / "fresh.txt").exists()
    assert (spaces.path(other) / "sub" / "old.txt").exists()
    assert {k: v for k, v in (await everything(client)).items() if "globex" in k} == globex_before
    assert "tenant acme: removed" in done.lines() and "  approvals: 1" in done.lines()


async def test_no_rule_changes_nothing_and_keep_overrides_a_default(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
) -> None:
    await talk(client, ingestor, queue_settings, deliverer, message("acme", "words"))
    await talk(client, ingestor, queue_settings, deliverer, message("globex", "words"))
    before = await everything(client)
    nothing = await RetentionSweep(client, RetentionConfig()).run(now=time.time() + 100 * DAY)
    assert nothing.total == 0 and nothing.lines() == ["no retention rule applies: nothing removed"]
    config = RetentionConfig.model_validate({"defaults": {"events": "1d"}, "tenants": {"acme": {"events": "keep"}}})
    done = await RetentionSweep(client, config).run(now=time.time() + 2 * DAY)
    assert set(done.counts) == {("globex", "events")} and done.total > 0
    after = await everything(client)
    assert {k: v for k, v in after.items() if "acme" in k} == {k: v for k, v in before.items() if "acme" in k}


async def test_one_worker_sweeps_per_interval(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    await talk(client, ingestor, queue_settings, deliverer, message("acme", "words"))
    plan = RetentionPlan(RetentionConfig.model_validate({"every": "1h", "defaults": {"events": "1s"}}))
    await asyncio.sleep(1.1)
    first = await sweep_if_due(client, plan, "w1")
    assert first is not None and first.counts[("acme", "events")] > 0
    assert await sweep_if_due(client, plan, "w2") is None
    assert 3_500_000 < await client.pttl(G.retention_lock) <= 3_600_000


async def test_the_command_prints_counts_per_tenant_and_kind(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    base_env: dict[str, str],
) -> None:
    await talk(client, ingestor, queue_settings, deliverer, message("acme", "words"))
    config = Path(base_env["SWITCHBOARD_CONFIG"])
    none = await asyncio.to_thread(sb, "retention", "run", env=base_env)
    assert none.returncode == 0 and "no retention rule is set" in none.stdout
    config.write_text(config.read_text() + "retention:\n  defaults: {events: 1s, history: 1s}\n")
    await asyncio.sleep(1.1)
    before = await everything(client)
    dry = await asyncio.to_thread(sb, "retention", "run", "--dry-run", env=base_env)
    assert dry.returncode == 0, dry.stderr
    assert "tenant acme: would remove" in dry.stdout and "  history: 2" in dry.stdout
    assert await everything(client) == before
    done = await asyncio.to_thread(sb, "retention", "run", env=base_env)
    assert done.returncode == 0, done.stderr
    assert "tenant acme: removed" in done.stdout and "  history: 2" in done.stdout
    assert await client.llen(SessionKeys(message("acme", "x").session_key).history) == 0


async def test_memory_and_knowledge_lose_what_was_created_before_their_rules(
    client: aioredis.Redis, tmp_path: Path
) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory")
    now = time.time()
    rows = [  # (tenant, id, kind, age in days)
        ("acme", "old-fact", "fact", 40),
        ("acme", "new-fact", "fact", 1),
        ("acme", "old-doc", "document", 400),
        ("acme", "new-doc", "document", 40),
        ("globex", "their-fact", "fact", 40),
    ]
    try:
        for tenant, fact_id, kind, age in rows:
            fact = Fact(
                id=fact_id,
                project="knowledge.assistant" if kind == "document" else "notes",
                tenant=tenant,
                kind=kind,  # type: ignore[arg-type]
                text=f"text of {fact_id}",
                source=Source(kind="url", ref="https://example.com/a", quote="text of"),
                run_id="run-1",
                created_at=now - age * DAY,
            )
            await store.add(fact, FactChange(fact_id=fact_id, project=fact.project, op="remembered", actor="t"))
        config = RetentionConfig.model_validate({"tenants": {"acme": {"memory": "30d", "knowledge": "1w"}}})
        plan = RetentionPlan(config, memory=store, tenants=("acme", "globex"))
        dry = await plan.sweep(client, dry_run=True).run(now=now)
        assert dry.not_counted == {("acme", "memory"), ("acme", "knowledge")}
        assert "  memory: not counted in a dry run" in dry.lines()
        done = await plan.sweep(client).run(now=now)
        assert dict(done.counts) == {("acme", "memory"): 1, ("acme", "knowledge"): 2}
        left = await store.facts("acme", ["notes", "knowledge.assistant"])
        assert [f.id for f in left] == ["new-fact"]
        assert [f.id for f in await store.facts("globex", ["notes"])] == ["their-fact"]
    finally:
        store.close()


async def test_a_running_worker_sweeps_on_its_own_and_stops_cleanly(
    redis_url: str,
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
) -> None:
    m = message("acme", "words")
    await talk(client, ingestor, queue_settings, deliverer, m)
    assert await client.xlen(SessionKeys(m.session_key).events) > 0
    await asyncio.sleep(1.1)
    plan = RetentionPlan(RetentionConfig.model_validate({"every": "1h", "defaults": {"events": "1s"}}))
    stop = asyncio.Event()
    worker = SessionWorker(
        redis_url,
        queue_settings,
        drainer_factory=lambda redis, wid: make_drainer(redis, queue_settings, deliverer, worker_id=wid),
        worker_id="w-retention",
        retention=plan,
    )
    task = asyncio.create_task(worker.run(stop))

    async def swept() -> bool:
        return await client.xlen(SessionKeys(m.session_key).events) == 0

    await wait_until(swept, "the worker's sweep trimmed the event log", timeout=20)
    assert await client.get(G.retention_lock) == b"w-retention"
    stop.set()
    await asyncio.wait_for(task, timeout=20)


async def test_a_worker_without_rules_runs_no_sweep(
    redis_url: str, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    stop = asyncio.Event()
    worker = SessionWorker(
        redis_url,
        queue_settings,
        drainer_factory=lambda redis, wid: make_drainer(redis, queue_settings, deliverer, worker_id=wid),
        retention=RetentionPlan(RetentionConfig()),
    )
    task = asyncio.create_task(worker.run(stop))

    async def beating() -> bool:
        return await client.zcard(G.workers) == 1

    await wait_until(beating, "the worker started", timeout=20)
    await asyncio.sleep(0.3)
    assert not await client.exists(G.retention_lock)
    stop.set()
    await asyncio.wait_for(task, timeout=20)
