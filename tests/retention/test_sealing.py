"""Encryption at rest: with ``SWITCHBOARD_DATA_KEYS`` set, the words of a conversation and an approval's arguments
never appear in Redis's bytes, yet every reader shows them; rotation re-seals under the new key so the old one can be
dropped; a missing or wrong key is a clear error naming the variable, never a 500 nor a crash."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.control.operations import dead_letter_messages, list_dead_letters
from switchboard.control.reading import pending_approvals
from switchboard.control.scope import OperatorScope
from switchboard.control.transcript import transcript_of
from switchboard.core.approvals.records import ApprovalRecord, ApprovalRequest, new_approval_id
from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.sealing import DATA_KEYS_ENV, Keyring, SealError, new_key
from switchboard.core.turn import HistoryEntry, SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.queue.approvals import RedisApprovals
from switchboard.queue.handoffs import Handoffs
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.queue.store import RedisSessionStore, load_history, stored_history
from switchboard.settings import QueueSettings, load_file
from switchboard.types import SessionKey
from tests.api.conftest import HISTORIAN, Api
from tests.erase.test_canary import everything, sb
from tests.queue.conftest import RecordingDeliverer, make_drainer

CANARY = "CANARY-SEALED-5e1f"
OLD, NEW = new_key("old"), new_key("new")


def message(text: str, conversation: str = "777", n: int = 0) -> InboundMessage:
    return InboundMessage(
        dedup_key=f"{conversation}-{n}",
        conversation=ConversationRef(agent="assistant", channel="telegram", conversation=conversation),  # type: ignore[arg-type]
        sender=Sender(id="u1", name="User"),
        text=text,
    )


def approval(session: SessionKey) -> ApprovalRecord:
    now = time.time()
    return ApprovalRecord(
        id=new_approval_id(),
        session=session,
        tenant="default",
        agent="assistant",
        channel="telegram",
        run_id="run-1",
        requested_by="telegram:u1",
        requested_at=now,
        expires_at=now + 3600,
        request=ApprovalRequest(
            tool="pay",
            arguments={"amount": 250, "memo": CANARY},
            action_sha256="ab" * 32,
            idempotency_key="k1",
            reason="amount > 100",
            rule="big-payments",
            policy_version="v1",
            risk="high",
            reversible=False,
        ),
        state_sha256="cd" * 32,
        approvers=("requester",),
    )


async def seed(
    client: aioredis.Redis,
    ingestor: Ingestor,
    settings: QueueSettings,
    deliverer: RecordingDeliverer,
    n: int = 0,
    *,
    dead: bool = False,
) -> tuple[SessionKey, str]:
    """A turn through the real pipeline (the echo runner repeats the words) and a pending approval naming the canary."""
    m = message(f"my code is {CANARY}", n=n)
    await ingestor.ingest(m)
    await make_drainer(client, settings, deliverer).drain(m.session_key)
    if dead:  # the echo runner fails on "poison": retried, then dead-lettered with the message
        await ingestor.ingest(message(f"poison {CANARY}", n=100 + n))
        for _ in range(settings.max_attempts + 1):
            await make_drainer(client, settings, deliverer).drain(m.session_key)
    lease = await Lease(client, worker_id="w9", lease_ms=60_000).acquire(m.session_key)
    assert lease is not None
    record = approval(m.session_key)
    await RedisApprovals(client, m.session_key, lease.token, lease.epoch).approval_open(record)
    await Lease(client, worker_id="w9", lease_ms=60_000).abandon(lease)
    return m.session_key, record.id


async def remember(store: SQLiteMemoryStore) -> None:
    """One fact naming the canary in the default tenant's memory, sealed with the store's keys."""
    try:
        fact = Fact(
            id="f1",
            project="notes",
            tenant="default",
            text=f"the code is {CANARY}",
            source=Source(kind="message", quote=f"my code is {CANARY}"),
            run_id="run-1",
            actor="telegram:u1",
        )
        await store.add(fact, FactChange(fact_id="f1", project="notes", op="remembered", actor="telegram:u1"))
    finally:
        store.close()


async def raw_bytes(client: aioredis.Redis) -> bytes:
    """Every key's content as read (strings, hashes, lists, streams...) and as ``DUMP`` serialises it."""
    found = b"\n".join((await everything(client)).values())
    async for key in client.scan_iter(count=1000):
        found += b"\n" + (await client.dump(key) or b"")
    return found


async def readers_show(
    client: aioredis.Redis, session: SessionKey, approval_id: str, settings: QueueSettings, turns: int = 1
) -> None:
    history = await load_history(client, session, 50)
    assert [e.text for e in history] == [f"my code is {CANARY}", f"echo: my code is {CANARY}"] * turns
    store = RedisSessionStore(client, session, 0, settings)
    assert [hit["text"] for hit in await store.search(CANARY.lower(), 5)][:1] == [f"echo: my code is {CANARY}"]
    transcript = await transcript_of(client, session, history_limit=50, events_limit=50)
    assert any(CANARY in item.text for item in transcript)
    pending = await pending_approvals(client, OperatorScope.everything("test"), 10)
    assert [(r.id, r.request.arguments["memo"] if r.request else None) for r in pending] == [(approval_id, CANARY)]


async def test_nothing_readable_is_stored_and_every_reader_still_shows_it(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DATA_KEYS_ENV, OLD)
    session, approval_id = await seed(client, ingestor, queue_settings, deliverer, dead=True)
    stored = await raw_bytes(client)
    assert CANARY.encode() not in stored
    assert b"sb1:old:" in stored
    await readers_show(client, session, approval_id, queue_settings)
    scope = OperatorScope.everything("test")
    [dead] = await list_dead_letters(client, scope, 10)
    assert dead.preview == f"poison {CANARY}"
    assert [m.text for m in await dead_letter_messages(client, session, dead.id)] == [f"poison {CANARY}"]

    monkeypatch.delenv(DATA_KEYS_ENV)  # the same data without sealing: it is there in the clear (the test can fail)
    await client.flushdb()
    await seed(client, ingestor, queue_settings, deliverer, n=1, dead=True)
    assert CANARY.encode() in await raw_bytes(client)
    [dead] = await list_dead_letters(client, scope, 10)
    assert dead.preview == f"poison {CANARY}"


async def test_rotation_reseals_so_the_old_key_can_be_dropped(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    base_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = await seed(client, ingestor, queue_settings, deliverer, n=0)  # written before sealing was switched on
    monkeypatch.setenv(DATA_KEYS_ENV, OLD)
    await client.delete(SessionKeys(plain[0]).approval(plain[1]))  # one pending approval per session below
    await client.delete(SessionKeys(plain[0]).approvals)
    session, approval_id = await seed(client, ingestor, queue_settings, deliverer, n=1)
    assert CANARY.encode() in await raw_bytes(client)  # the entries written in the clear
    memory = Path(base_env["SWITCHBOARD_DATA_DIR"]) / "memory"
    await remember(SQLiteMemoryStore(memory, Keyring.parse(OLD)))

    env = {**base_env, DATA_KEYS_ENV: f"{NEW},{OLD}"}
    dry = await asyncio.to_thread(sb, "keys", "rotate", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "would re-seal under key new:",
        "  history: 4",
        "  approvals: 1",
        "  memory: not counted in a dry run",
    ]
    done = await asyncio.to_thread(sb, "keys", "rotate", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["re-sealed under key new:", "  history: 4", "  approvals: 1", "  memory: 1"]
    again = await asyncio.to_thread(sb, "keys", "rotate", env=env)
    assert again.stdout.splitlines()[1:] == ["  history: 0", "  approvals: 0", "  memory: 0"]
    store = SQLiteMemoryStore(memory, Keyring.parse(NEW))  # the old key dropped
    try:
        assert [f.text for f in await store.facts("default", ["notes"])] == [f"the code is {CANARY}"]
    finally:
        store.close()

    stored = await raw_bytes(client)
    assert CANARY.encode() not in stored and b"sb1:old:" not in stored and b"sb1:new:" in stored
    monkeypatch.setenv(DATA_KEYS_ENV, NEW)  # the old key dropped
    await readers_show(client, session, approval_id, queue_settings, turns=2)


async def test_a_missing_or_wrong_key_is_a_clear_error_never_a_500(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    api: Api,
    api_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DATA_KEYS_ENV, OLD)
    session, _ = await seed(client, ingestor, queue_settings, deliverer)
    for keys, says in [(None, "is not set"), (NEW, "no longer lists")]:
        if keys is None:
            monkeypatch.delenv(DATA_KEYS_ENV)
        else:
            monkeypatch.setenv(DATA_KEYS_ENV, keys)
        with pytest.raises(SealError, match=DATA_KEYS_ENV) as caught:
            await load_history(client, session, 50)
        assert says in str(caught.value)
        status, answer = await api.call("GET", "/conversations/telegram/default/777", HISTORIAN)
        assert status == 503, answer
        assert answer["error"]["code"] == "sealed" and DATA_KEYS_ENV in answer["error"]["message"]
        env = {**api_env, DATA_KEYS_ENV: keys} if keys else {**api_env}
        shown = await asyncio.to_thread(sb, "sessions", "show", session, env=env)
        assert shown.returncode == 2 and DATA_KEYS_ENV in shown.stderr and "Traceback" not in shown.stderr

    # the worker: a turn that reads the history fails (retried, then dead-lettered); the drain itself never raises
    async def reading_runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        await store.load_history(50)  # what the agent runtime does first
        return TurnResult(text="read", steps=1)

    m = message("a later message", n=5)
    await ingestor.ingest(m)
    drain = make_drainer(client, queue_settings, deliverer, runner=reading_runner)
    for _ in range(queue_settings.max_attempts + 1):
        await drain.drain(session)
    dead: Any = await client.lrange(SessionKeys(session).dead, 0, -1)
    assert len(dead) == 1 and b"SealError" in dead[0], dead
    monkeypatch.setenv(DATA_KEYS_ENV, OLD)  # that dead letter was sealed under NEW: listed, not shown
    [listed] = await list_dead_letters(client, OperatorScope.everything("test"), 10)
    assert listed.preview == f"(sealed with a key {DATA_KEYS_ENV} does not list)"


def test_a_malformed_key_stops_the_command_saying_what_to_fix(base_env: dict[str, str]) -> None:
    bad = sb("keys", "rotate", env={**base_env, DATA_KEYS_ENV: "k1:not-base64!"})
    assert bad.returncode == 2 and DATA_KEYS_ENV in bad.stderr and "Traceback" not in bad.stderr
    fresh = sb("keys", "new", "--id", "k2", env=base_env)
    assert fresh.returncode == 0 and fresh.stdout.startswith("k2:") and len(fresh.stdout.strip()) == 3 + 44


HANDOFF_CONFIG = """
default_agent: sales
agents:
  sales:
    profile: {name: Sales}
    instructions: You sell.
    tools: [handoff]
    handoff: {to: [billing], history: full}
  billing:
    profile: {name: Billing}
    instructions: You answer billing questions.
"""


async def test_a_handoff_carries_sealed_history_sealed_again_for_the_receiving_session(
    client: aioredis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATA_KEYS_ENV, OLD)
    path = tmp_path / "switchboard.yaml"
    path.write_text(HANDOFF_CONFIG)
    handoffs = Handoffs.build(client, load_file(path))
    assert handoffs is not None
    said = InboundMessage(
        dedup_key="h1",
        conversation=ConversationRef(agent="sales", channel="telegram", conversation="9"),  # type: ignore[arg-type]
        sender=Sender(id="u1"),
        text=f"refund {CANARY} please",
    )
    origin = said.session_key
    earlier = [HistoryEntry(role="user", text=f"my code is {CANARY}", at=1.0)]
    await client.rpush(SessionKeys(origin).history, *stored_history(earlier, origin))
    done = await handoffs.hand_off(said.conversation, [said], "sales", "billing", "billing", "a refund")
    assert done.carried == 3
    receiving = SessionKey(origin.replace("/sales/", "/billing/"))
    assert CANARY.encode() not in b"".join(await client.lrange(SessionKeys(receiving).history, 0, -1))
    texts = [entry.text for entry in await load_history(client, receiving, 10)]
    assert texts[:2] == [f"my code is {CANARY}", f"refund {CANARY} please"] and "a refund" in texts[2]
