from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aioredis

from switchboard.core.events import StepRecorded, UsageMetered
from switchboard.core.turn import HistoryEntry, SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.errors import FencedWriteError
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import entry
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import CURRENT_LEASE, Lease, LeaseToken, fenced_xadd
from switchboard.queue.ledger import Ledger
from switchboard.queue.stats import fenced_total, read_stats
from switchboard.queue.store import RedisSessionStore
from switchboard.settings import QueueSettings
from switchboard.worker import drain as drain_module
from switchboard.worker.drainturn import DrainOutcome
from tests.shardindexes import entries_of

from .conftest import RecordingDeliverer, echo_runner, make_drainer, make_message


async def test_drain_answers_in_fifo_order_and_releases(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    ids = [(await ingestor.ingest(make_message(f"m{i}"))).message_id for i in range(5)]
    session = make_message("x").session_key
    outcome = await make_drainer(client, queue_settings, deliverer).drain_session(session)
    assert outcome is DrainOutcome.RELEASED
    assert deliverer.texts() == [f"echo: m{i}" for i in range(5)]
    replies = [s.action.reply_to for s in deliverer.sent if s.action.kind == "text"]
    assert replies == ids
    keys = SessionKeys(session)
    assert await client.llen(keys.inbox) == 0
    assert await client.hlen(keys.messages) == 0
    assert await client.exists(keys.lease, keys.drain, keys.attempts, keys.outbox) == 0
    assert await client.zscore(SessionKeys(session).shard.runnable, session) is None
    history = [HistoryEntry.model_validate_json(h) for h in await client.lrange(keys.history, 0, -1)]
    assert [(h.role, h.text) for h in history[:2]] == [("user", "m0"), ("assistant", "echo: m0")]
    kinds = [e["kind"] for e in await read_events(client, session)]
    assert kinds.count("run_started") == 5 and kinds.count("run_completed") == 5 and kinds.count("reply_sent") == 5
    statuses = [s.action.status for s in deliverer.sent if s.action.kind == "status"]  # type: ignore[union-attr]
    assert statuses[0] == "running" and statuses[-1] == "idle"
    stats = await read_stats(client)
    assert stats.runs_completed == 5 and stats.queue_wait.count == 5 and stats.run_duration.count == 5
    assert stats.queue_wait.buckets[-1][1] == 5


async def _calls(client: aioredis.Redis, command: str) -> int:
    return int((await client.info("commandstats")).get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_deltas_only_reach_streaming_channels(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    await ingestor.ingest(make_message("a"))
    quiet = RecordingDeliverer(streaming=False)
    await make_drainer(client, queue_settings, quiet).drain(make_message("x").session_key)
    assert not [s for s in quiet.sent if s.action.kind == "delta"]
    await ingestor.ingest(make_message("b"))
    loud = RecordingDeliverer(streaming=True)
    await make_drainer(client, queue_settings, loud).drain(make_message("x").session_key)
    assert [s.action.text for s in loud.sent if s.action.kind == "delta"] == ["echo"]  # type: ignore[union-attr]


async def test_collect_policy_folds_waiting_messages_into_one_turn(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    for text in ("one", "two", "three"):
        await ingestor.ingest(make_message(text), busy_policy="collect")
    await make_drainer(client, queue_settings, deliverer).drain(make_message("x").session_key)
    assert deliverer.texts() == ["echo: one | two | three"]
    assert await client.llen(SessionKeys(make_message("x").session_key).inbox) == 0


async def test_message_arriving_during_a_run_is_handled_by_the_same_drain(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    arrived: list[str] = []

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        if request.messages[0].text == "first":
            result = await ingestor.ingest(make_message("second"))
            arrived.append(result.message_id)
            assert not result.drain_enqueued  # the running drain's flag is still set
        return await echo_runner(request, sink, store)

    await ingestor.ingest(make_message("first"))
    outcome = await make_drainer(client, queue_settings, deliverer, runner).drain_session(make_message("x").session_key)
    assert outcome is DrainOutcome.RELEASED and arrived
    assert deliverer.texts() == ["echo: first", "echo: second"]


async def test_release_strands_nothing_when_a_message_lands_right_after(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    session = make_message("x").session_key
    await ingestor.ingest(make_message("a"))
    assert await make_drainer(client, queue_settings, deliverer).drain_session(session) is DrainOutcome.RELEASED
    # the drain released: the next message must find no flag and enqueue a fresh drain job
    later = await ingestor.ingest(make_message("b"))
    assert later.drain_enqueued


async def test_poison_message_is_dead_lettered_and_next_message_still_answered(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    calls: list[str] = []

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        calls.append(request.messages[0].text)
        return await echo_runner(request, sink, store)

    poison = await ingestor.ingest(make_message("poison pill"))
    await ingestor.ingest(make_message("fine"))
    session = make_message("x").session_key
    await make_drainer(client, queue_settings, deliverer, runner).drain(session)
    assert calls == ["poison pill"] * queue_settings.max_attempts + ["fine"]
    assert deliverer.texts("error") == ["dead_lettered"]
    assert deliverer.texts() == ["echo: fine"]
    keys = SessionKeys(session)
    dead = [json.loads(d) for d in await client.lrange(keys.dead, 0, -1)]
    assert dead[0]["message_ids"] == [poison.message_id]
    assert dead[0]["attempts"] == queue_settings.max_attempts and "poisoned" in dead[0]["reason"]
    assert len(await entries_of(client)) == 1
    kinds = [e["kind"] for e in await read_events(client, session)]
    assert kinds.count("run_failed") == 3 and kinds.count("run_dead_lettered") == 1
    assert (await read_stats(client)).dead_letters == 1


async def test_stale_epoch_writes_are_refused_and_counted(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    """A worker whose lease was taken over cannot write history, events, outbox or the web stream."""
    session = make_message("x").session_key
    keys = SessionKeys(session)
    stolen: list[LeaseToken] = []

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        # another worker takes the session over while this turn runs (our lease expired meanwhile)
        await client.delete(keys.lease)
        thief = await Lease(client, worker_id="w2", lease_ms=60_000).acquire(session)
        assert thief is not None
        stolen.append(thief)
        try:
            await sink.event(StepRecorded(step=1, decision="answer"))
        except FencedWriteError:
            pass
        else:
            raise AssertionError("a stale event write was accepted")
        return TurnResult(text="stale reply", steps=1)

    await ingestor.ingest(make_message("hello"))
    outcome = await make_drainer(client, queue_settings, deliverer, runner).drain_session(session)
    assert outcome is DrainOutcome.FENCED
    assert deliverer.texts() == []  # the reply's outbox claim was refused before any send
    assert await client.llen(keys.inbox) == 1  # not acked by the zombie
    assert await fenced_total(client) >= 2
    assert (await client.get(keys.lease)).decode() == stolen[0].token

    old = LeaseToken(session=session, epoch=stolen[0].epoch - 1, token=f"{stolen[0].epoch - 1}:w1")
    store = RedisSessionStore(client, session, old.epoch, queue_settings)
    for write in (
        store.append_history([HistoryEntry(role="user", text="x")]),
        store.save_slot("plan", {"goal": "x"}),
        fenced_xadd(client, old, keys.web, {"type": "status", "data": "{}"}, 100),
    ):
        try:
            await write
        except FencedWriteError as err:
            assert err.session_key == session
        else:
            raise AssertionError("stale write accepted")
    assert await client.llen(keys.history) == 0 and await client.exists(keys.slots, keys.web) == 0
    # the current holder's writes go through
    fresh = RedisSessionStore(client, session, stolen[0].epoch, queue_settings)
    await fresh.save_slot("plan", {"goal": "y"})
    assert await fresh.load_slots() == {"plan": {"goal": "y"}}
    assert await fenced_xadd(client, stolen[0], keys.web, {"type": "status", "data": "{}"}, 100)


async def test_current_lease_is_set_during_runs_and_deliveries(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    seen: list[LeaseToken | None] = []

    class Watching(RecordingDeliverer):
        async def perform(self, action, conversation, send):  # type: ignore[no-untyped-def]
            seen.append(CURRENT_LEASE.get())
            return await super().perform(action, conversation, send)

    session = make_message("x").session_key
    await ingestor.ingest(make_message("a"))
    await make_drainer(client, queue_settings, Watching()).drain(session)
    assert seen and all(t is not None and t.session == session for t in seen)
    assert CURRENT_LEASE.get() is None


async def test_second_drain_exits_while_another_holds_the_lease(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    gate = asyncio.Event()
    inside = asyncio.Event()

    async def slow(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        inside.set()
        await gate.wait()
        return await echo_runner(request, sink, store)

    session = make_message("x").session_key
    await ingestor.ingest(make_message("a"))
    first = asyncio.create_task(make_drainer(client, queue_settings, deliverer, slow).drain_session(session))
    await inside.wait()
    second = await make_drainer(client, queue_settings, deliverer, slow, worker_id="w2").drain_session(session)
    assert second is DrainOutcome.BUSY
    gate.set()
    assert await first is DrainOutcome.RELEASED
    assert deliverer.texts() == ["echo: a"]


async def test_a_quick_run_sends_no_typing_action(
    ingestor: Ingestor,
    client: aioredis.Redis,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(drain_module, "TYPING_DELAY_S", 3600.0)
    for text in ("a", "b"):
        await ingestor.ingest(make_message(text))
    await make_drainer(client, queue_settings, deliverer).drain(make_message("x").session_key)
    assert deliverer.texts() == ["echo: a", "echo: b"]
    assert [s.action.kind for s in deliverer.sent if s.action.kind == "typing"] == []
    statuses = [s.action.status for s in deliverer.sent if s.action.kind == "status"]  # type: ignore[union-attr]
    assert statuses == ["running", "running", "idle"]  # the running status is still immediate


async def test_a_run_still_going_after_the_delay_shows_typing_before_its_reply(
    ingestor: Ingestor,
    client: aioredis.Redis,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(drain_module, "TYPING_DELAY_S", 0.0)
    deliverer.typing_refresh_s = 3600.0

    async def slow_runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        while not any(s.action.kind == "typing" for s in deliverer.sent):  # the run lasts until typing shows
            await asyncio.sleep(0)
        return await echo_runner(request, sink, store)

    await ingestor.ingest(make_message("slow"))
    drainer = make_drainer(client, queue_settings, deliverer, slow_runner)
    await asyncio.wait_for(drainer.drain(make_message("x").session_key), 30)
    kinds = [s.action.kind for s in deliverer.sent]
    assert kinds == ["status", "typing", "text", "status"]


def _usage(message_id: str, tokens: int) -> UsageMetered:
    return UsageMetered(
        message_id=message_id,
        model="offline",
        steps=1,
        tool_calls=0,
        input_tokens=tokens,
        output_tokens=2 * tokens,
        credits=0.25,
    )


async def test_the_answer_step_and_usage_are_logged_before_the_reply_and_counted(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        mid = request.messages[0].id
        await sink.event(StepRecorded(message_id=mid, step=1, decision="tool_calls"))
        await sink.event(StepRecorded(message_id=mid, step=2, decision="answer"))
        await sink.event(_usage(mid, 10))
        return TurnResult(text="done", steps=2)

    for text in ("a", "b"):
        await ingestor.ingest(make_message(text))
    session = make_message("x").session_key
    await make_drainer(client, queue_settings, deliverer, runner).drain(session)
    assert deliverer.texts() == ["done", "done"]
    turn = ["run_started", "step", "step", "usage_metered", "reply_sent", "run_completed"]
    kinds = [
        e["kind"] for e in await read_events(client, session) if e["kind"] not in ("message_received", "run_queued")
    ]
    assert kinds == turn * 2
    steps = [e["decision"] for e in await read_events(client, session) if e["kind"] == "step"]
    assert steps == ["tool_calls", "answer"] * 2
    stats = await read_stats(client)
    assert (stats.input_tokens, stats.output_tokens, stats.credits) == (20, 40, 0.5)


async def test_held_facts_are_written_when_the_run_fails_after_them(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        await sink.event(StepRecorded(message_id=request.messages[0].id, step=1, decision="answer"))
        await sink.event(_usage(request.messages[0].id, 3))
        raise RuntimeError("broke after answering")

    await ingestor.ingest(make_message("a"))
    session = make_message("x").session_key
    await make_drainer(client, queue_settings, deliverer, runner).drain(session)
    kinds = [e["kind"] for e in await read_events(client, session)]
    first = kinds.index("run_started")
    assert kinds[first : first + 4] == ["run_started", "step", "usage_metered", "run_failed"]
    assert (await read_stats(client)).input_tokens == 3 * queue_settings.max_attempts


async def test_a_turn_reads_the_history_and_slots_its_session_has(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    seen: list[tuple[list[str], dict[str, object], list[str]]] = []

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        history = [h.text for h in await store.load_history(3)]
        slots = await store.load_slots()
        longer = [h.text for h in await store.load_history(queue_settings.history_maxlen + 5)]
        seen.append((history, slots, longer))
        await store.save_slot("state", {"n": len(seen)})
        return await echo_runner(request, sink, store)

    for text in ("a", "b", "c"):
        await ingestor.ingest(make_message(text))
    await make_drainer(client, queue_settings, deliverer, runner).drain(make_message("x").session_key)
    assert seen == [
        ([], {}, []),
        (["a", "echo: a"], {"state": {"n": 1}}, ["a", "echo: a"]),
        (["echo: a", "b", "echo: b"], {"state": {"n": 2}}, ["a", "echo: a", "b", "echo: b"]),
    ]


async def test_the_queue_store_going_away_mid_run_never_spends_the_messages_attempts(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    """A Redis outage or restart mid-run (a connection error, a timeout) is no fault of the message: more of them than
    ``max_attempts`` hand the attempt back each time (the reaper repairs the session) and never dead-letter it."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    outages: list[Exception] = [
        RedisConnectionError("Connection closed by server."),
        RedisTimeoutError("Timeout reading from socket"),
    ] * queue_settings.max_attempts

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        if outages:
            raise outages.pop(0)
        return await echo_runner(request, sink, store)

    await ingestor.ingest(make_message("hello"))
    session = make_message("x").session_key
    drainer = make_drainer(client, queue_settings, deliverer, runner)
    for _ in range(2 * queue_settings.max_attempts):  # what the reaper's repairs would run
        try:
            await drainer.drain(session)
        except (RedisConnectionError, RedisTimeoutError):
            assert await client.exists(SessionKeys(session).lease) == 0  # handed back, not left to lapse
            continue
        break
    assert not outages
    assert deliverer.texts() == ["echo: hello"] and deliverer.texts("error") == []
    assert await client.llen(SessionKeys(session).dead) == 0


async def test_a_message_landing_right_after_the_releasing_completion_gets_a_drain_job_of_its_own(
    ingestor: Ingestor,
    client: aioredis.Redis,
    queue_settings: QueueSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last completion ends the drain in its own step: a message behind it finds no drain and enqueues one."""
    await ingestor.ingest(make_message("m0"))
    session = make_message("x").session_key
    keys = SessionKeys(session)
    first = await client.get(keys.drain)
    complete = Ledger.complete
    landed: list[bytes | None] = []

    async def then_a_message(self: Ledger, *args: object, **kwargs: object) -> int:
        left = await complete(self, *args, **kwargs)  # type: ignore[arg-type]
        assert self.released  # the drain ended here, before the worker is back at its queue
        assert (await ingestor.ingest(make_message("m1"))).drain_enqueued
        landed.append(await client.get(keys.drain))
        return left

    monkeypatch.setattr(Ledger, "complete", then_a_message)
    deliverer = RecordingDeliverer(statuses=False)
    assert await make_drainer(client, queue_settings, deliverer).drain_session(session) is DrainOutcome.RELEASED
    monkeypatch.setattr(Ledger, "complete", complete)
    assert deliverer.texts() == ["echo: m0"]
    assert landed and landed[0] is not None and landed[0] != first  # a new drain job for m1
    assert await client.get(keys.drain) == landed[0]
    queued = [entry(session, first.decode()), entry(session, landed[0].decode())]  # type: ignore[union-attr]
    assert [
        e.decode() for e in await client.lrange(keys.shard.drainq, 0, -1)
    ] == queued  # (the test ran the first job's drain itself)
    assert await make_drainer(client, queue_settings, deliverer).drain_session(session) is DrainOutcome.RELEASED
    assert deliverer.texts() == ["echo: m0", "echo: m1"]
    assert await client.exists(keys.drain, keys.lease) == 0 and await client.llen(keys.inbox) == 0
