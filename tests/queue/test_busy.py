"""Busy policies ``interrupt`` and ``steer``: a message that lands while a turn runs, with real Redis and a real drain.

The model is the offline model (it echoes the user's text verbatim) or a recorded one that keeps the requests it got;
its first step waits for the test (at most a few seconds, so the old behaviour fails instead of hanging), which is
when the second message arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Receipt, SendContext
from switchboard.core.actions import Action
from switchboard.core.agent.config import AgentLimits
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    CommandIssued,
    ConversationRef,
    InboundEvent,
    Posted,
)
from switchboard.core.model import ModelEvent, ModelRequest
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.providers.offline import OfflineModel
from switchboard.core.tools.builtin import default_registry
from switchboard.core.turn import HistoryEntry, SessionStore, SteeringSink, TurnRequest, TurnResult, TurnSink
from switchboard.errors import FencedWriteError
from switchboard.queue.cancellation import interrupt_record, listen_for_stops
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys, ShardKeys
from switchboard.queue.lease import Lease
from switchboard.queue.ledger import MAX_INTERRUPTS, Attempt, Ledger
from switchboard.settings import QueueSettings, load_file
from switchboard.types import BusyPolicy
from switchboard.worker.busy import INTERRUPTED_CODE, BusyTurn, answered_part
from switchboard.worker.drain import Drainer
from tests.core.turns import answer_step, calls_step
from tests.waiting import wait_until

from .conftest import AGENT, RecordingDeliverer, agent_for, make_drainer, make_message

WAIT_S = 5.0
"""How long a gated model step waits for the test before going on by itself (only reached on a failure)."""


class GatedModel:
    """A real model adapter (offline, or a recording) whose ``gate``-th request waits for :attr:`release`."""

    provider = "offline"

    def __init__(self, inner: OfflineModel | ReplayModel, *, gate: int = 1) -> None:
        self.inner = inner
        self.gate = gate
        self.requests: list[ModelRequest] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        if len(self.requests) == self.gate:
            self.started.set()
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.release.wait(), WAIT_S)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        async for event in self.inner.stream(request):
            yield event

    async def aclose(self) -> None:
        return None


def _runtime(tmp_path: Path, model: GatedModel) -> Runtime:
    factory = ModelFactory(ProviderConfig())
    factory.override("offline", model)
    return Runtime(models=factory, tools=default_registry(), workspace_root=tmp_path / "ws", model_backoff_s=0.0)


def _drainer(
    client: aioredis.Redis, settings: QueueSettings, deliverer: RecordingDeliverer, runtime: Runtime
) -> Drainer:
    return Drainer(client, settings, runner=runtime.run_turn, deliverer=deliverer, agent_for=agent_for, worker_id="w1")


@contextlib.asynccontextmanager
async def _listening(client: aioredis.Redis, on_stop: Callable[[Any, str], bool]) -> AsyncIterator[None]:
    """The worker's stop listener, subscribed before the test goes on."""
    stop = asyncio.Event()
    task = asyncio.create_task(listen_for_stops(client, on_stop, stop))

    async def subscribed() -> bool:
        return dict(await client.pubsub_shardnumsub(ShardKeys(0).cancel)).get(ShardKeys(0).cancel.encode(), 0) > 0

    try:
        await wait_until(subscribed, "the worker subscribed to steering")
        yield
    finally:
        stop.set()
        await task


async def _events(client: aioredis.Redis, session: str) -> list[dict[str, Any]]:
    return await read_events(client, session)  # type: ignore[arg-type]


async def _history(client: aioredis.Redis, session: str) -> list[HistoryEntry]:
    raw = await client.lrange(SessionKeys(session).history, 0, -1)  # type: ignore[arg-type]
    return [HistoryEntry.model_validate_json(item) for item in raw]


# -- interrupt --------------------------------------------------------------------------------------------------


async def test_interrupt_cancels_the_running_turn_and_one_reply_answers_both(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, tmp_path: Path
) -> None:
    model = GatedModel(OfflineModel())
    deliverer = RecordingDeliverer(streaming=True)
    drainer = _drainer(client, queue_settings, deliverer, _runtime(tmp_path, model))
    first = make_message("first question about ravens")
    session = first.session_key
    async with _listening(client, drainer.cancel):
        head = await ingestor.ingest(first, busy_policy="interrupt")
        drain = asyncio.create_task(drainer.drain(session))
        await asyncio.wait_for(model.started.wait(), 10)
        second = await ingestor.ingest(make_message("second question about crows"), busy_policy="interrupt")
        await asyncio.wait_for(drain, 20)

    assert model.cancelled == 1  # the first turn's model request was cancelled, not left to finish
    replies = [s.action for s in deliverer.sent if s.action.kind == "text"]
    assert len(replies) == 1
    assert "first question about ravens" in replies[0].text and "second question about crows" in replies[0].text  # type: ignore[union-attr]
    assert replies[0].reply_to == second.message_id
    assert deliverer.texts("error") == [INTERRUPTED_CODE]  # the streamed partial reply was closed, not left open
    events = await _events(client, session)
    kinds = [e["kind"] for e in events]
    assert kinds.count("run_cancelled") == 1 and kinds.count("run_completed") == 1 and kinds.count("reply_sent") == 1
    assert "run_failed" not in kinds and "run_dead_lettered" not in kinds
    cancelled = next(e for e in events if e["kind"] == "run_cancelled")
    assert cancelled["message_id"] == head.message_id
    assert cancelled["reason"] == f"interrupted by a newer message {second.message_id}"
    keys = SessionKeys(session)
    assert await client.llen(keys.inbox) == 0 and await client.hlen(keys.messages) == 0
    assert await client.exists(keys.attempts) == 0  # the attempt handed back, the interrupt count gone with the ack
    history = await _history(client, session)
    assert [h.text for h in history if h.role == "user"] == [
        "first question about ravens",
        "second question about crows",
    ]
    assert [h.role for h in history].count("assistant") == 1


async def test_a_flood_of_interrupts_cannot_starve_the_session(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    runs: list[list[str]] = []
    started = asyncio.Event()
    release = asyncio.Event()

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        texts = [m.text for m in request.messages]
        runs.append(texts)
        started.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), WAIT_S)
        return TurnResult(text="echo: " + " | ".join(texts), steps=1)

    drainer = make_drainer(client, queue_settings, deliverer, runner=runner)
    verdicts: list[bool] = []

    def on_stop(session: Any, reason: str) -> bool:
        verdicts.append(drainer.cancel(session, reason))
        return verdicts[-1]

    session = make_message("x").session_key
    async with _listening(client, on_stop):
        await ingestor.ingest(make_message("m1"), busy_policy="interrupt")
        drain = asyncio.create_task(drainer.drain(session))
        for n in range(2, MAX_INTERRUPTS + 3):  # m2 … m5: three interrupts, then one the fourth run ignores
            await wait_until(lambda n=n: _true(len(runs) == n - 1), "the earlier runs started")
            await ingestor.ingest(make_message(f"m{n}"), busy_policy="interrupt")
        await wait_until(lambda: _true(len(verdicts) == MAX_INTERRUPTS + 1), "every interrupt given a verdict")
        release.set()
        await asyncio.wait_for(drain, 20)

    assert verdicts == [True] * MAX_INTERRUPTS + [False]
    assert runs == [["m1"], ["m1", "m2"], ["m1", "m2", "m3"], ["m1", "m2", "m3", "m4"], ["m5"]]
    assert deliverer.texts() == ["echo: m1 | m2 | m3 | m4", "echo: m5"]  # every message answered once, the last too
    kinds = [e["kind"] for e in await _events(client, session)]
    assert kinds.count("run_cancelled") == MAX_INTERRUPTS and kinds.count("run_completed") == 2
    assert await client.llen(SessionKeys(session).inbox) == 0


async def _true(value: bool) -> bool:
    return value


async def test_stop_under_interrupt_stops_instead_of_restarting(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    started = asyncio.Event()

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        started.set()
        await asyncio.sleep(WAIT_S)
        return TurnResult(text="echo: " + " | ".join(m.text for m in request.messages), steps=1)

    drainer = make_drainer(client, queue_settings, deliverer, runner=runner)
    first = make_message("slow question")
    async with _listening(client, drainer.cancel):
        await ingestor.ingest(first, busy_policy="interrupt")
        drain = asyncio.create_task(drainer.drain(first.session_key))
        await asyncio.wait_for(started.wait(), 10)
        await ingestor.ingest(make_message("/stop"), busy_policy="interrupt")
        await asyncio.wait_for(drain, 20)
    assert deliverer.texts() == ["Stopped."]
    cancelled = [e for e in await _events(client, first.session_key) if e["kind"] == "run_cancelled"]
    assert [e["reason"] for e in cancelled] == ["/stop from u1"]


def test_an_interrupt_for_a_message_the_turn_holds_is_ignored() -> None:
    busy = BusyTurn()
    busy.start(Attempt(1, False, "", ["a", "b"], ["", ""], policy="interrupt"))
    reason: Callable[[str], str] = lambda message_id: json.loads(interrupt_record(message_id, 0.0))["reason"]  # noqa: E731
    assert busy.interrupt(reason("b")) is False and not busy.interrupted  # raced the end of the turn before
    assert busy.interrupt("/stop from u1") is None  # a real stop is not an interrupt
    assert busy.interrupt(reason("c")) is True and busy.interrupted
    busy.start(Attempt(1, False, "", ["a"], [""], policy="interrupt", interrupts=MAX_INTERRUPTS))
    assert busy.interrupt(reason("d")) is False


# -- steer ------------------------------------------------------------------------------------------------------


async def test_steered_message_reaches_the_running_turns_next_model_request(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = GatedModel(ReplayModel([calls_step(("current_time", {})), answer_step("done with both", step=2)]))
    drainer = _drainer(client, queue_settings, deliverer, _runtime(tmp_path, model))
    first = make_message("what time is it")
    session = first.session_key
    head = await ingestor.ingest(first, busy_policy="steer")
    drain = asyncio.create_task(drainer.drain(session))
    await asyncio.wait_for(model.started.wait(), 10)
    second = await ingestor.ingest(make_message("and in Tokyo please"), busy_policy="steer")
    model.release.set()
    await asyncio.wait_for(drain, 20)

    def users(request: ModelRequest) -> list[str]:
        return [m.content for m in request.messages if m.role == "user" and m.trust is None]

    assert len(model.requests) == 2
    assert not any("Tokyo" in text for text in users(model.requests[0]))
    assert users(model.requests[1])[-1] == "and in Tokyo please"  # after the tool call and its result
    assert [m.role for m in model.requests[1].messages][-3:] == ["assistant", "tool", "user"]
    assert deliverer.texts() == ["done with both"]  # one reply, for both messages
    keys = SessionKeys(session)
    assert await client.llen(keys.inbox) == 0 and await client.hlen(keys.messages) == 0
    assert await client.exists(keys.attempts) == 0
    history = await _history(client, session)
    assert [h.message_id for h in history if h.role == "user"] == [head.message_id, second.message_id]
    kinds = [e["kind"] for e in await _events(client, session)]
    assert kinds.count("run_started") == 1 and kinds.count("run_completed") == 1


async def test_a_steered_message_stays_the_users_words_in_a_turns_last_answer(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = GatedModel(ReplayModel([calls_step(("current_time", {})), answer_step("all I could do", step=2)]))
    one_step = AGENT.model_copy(update={"limits": AgentLimits(max_steps=1)})
    drainer = Drainer(
        client,
        queue_settings,
        runner=_runtime(tmp_path, model).run_turn,
        deliverer=deliverer,
        agent_for=lambda message: one_step,
        worker_id="w1",
    )
    first = make_message("what time is it")
    await ingestor.ingest(first, busy_policy="steer")
    drain = asyncio.create_task(drainer.drain(first.session_key))
    await asyncio.wait_for(model.started.wait(), 10)
    await ingestor.ingest(make_message("and in Tokyo please"), busy_policy="steer")
    model.release.set()
    await asyncio.wait_for(drain, 20)
    final = model.requests[-1]
    assert final.tools == [] and final.metadata.get("final") == "steps"  # the step budget ran out: the last answer
    users = [m.content for m in final.messages if m.role == "user" and m.trust is None]
    assert users[-1] == "and in Tokyo please"  # among the user's words, not folded into the work log
    assert deliverer.texts() == ["all I could do"]
    assert await client.llen(SessionKeys(first.session_key).inbox) == 0


async def test_a_message_after_the_last_step_is_answered_by_the_next_turn(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = GatedModel(ReplayModel([answer_step("one"), answer_step("two")]))
    drainer = _drainer(client, queue_settings, deliverer, _runtime(tmp_path, model))
    first = make_message("first")
    head = await ingestor.ingest(first, busy_policy="steer")
    drain = asyncio.create_task(drainer.drain(first.session_key))
    await asyncio.wait_for(model.started.wait(), 10)
    second = await ingestor.ingest(make_message("second"), busy_policy="steer")
    model.release.set()
    await asyncio.wait_for(drain, 20)
    assert deliverer.texts() == ["one", "two"]
    replies = [s.action.reply_to for s in deliverer.sent if s.action.kind == "text"]
    assert replies == [head.message_id, second.message_id]
    assert "second" not in [m.content for m in model.requests[0].messages]
    assert await client.llen(SessionKeys(first.session_key).inbox) == 0


async def test_only_the_lease_holder_takes_steered_messages(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    first = make_message("first")
    session = first.session_key
    head = (await ingestor.ingest(first, busy_policy="steer")).message_id
    lease = await Lease(client, worker_id="w1", lease_ms=2000).acquire(session)
    assert lease is not None
    ledger = Ledger(client, lease, queue_settings, worker_id="w1")
    attempt = await ledger.begin()
    assert attempt is not None and attempt.policy == "steer" and attempt.ids == [head]
    late = await ingestor.ingest(make_message("late"), busy_policy="steer")
    await client.delete(SessionKeys(session).lease)  # the lease expired; another worker took the session
    other = await Lease(client, worker_id="w2", lease_ms=2000).acquire(session)
    assert other is not None
    with pytest.raises(FencedWriteError):
        await ledger.steer(head, 1)
    ids, bodies = await Ledger(client, other, queue_settings, worker_id="w2").steer(head, 1)
    assert ids == [late.message_id] and json.loads(bodies[0])["text"] == "late"
    assert await client.hget(SessionKeys(session).attempts, f"{head}:took") == b"2"
    assert await client.llen(SessionKeys(session).inbox) == 2  # nothing acked by steering


@pytest.mark.parametrize(
    "event",
    [
        None,  # a typed /stop
        CommandIssued(name="reset"),
        ChoiceSelected(option_id="basic"),
        Posted(attachments=(Attachment(kind="image", ref="file-1"),)),
    ],
)
async def test_only_plain_messages_are_steered(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, event: InboundEvent | None
) -> None:
    first = make_message("first")
    session = first.session_key
    head = (await ingestor.ingest(first, busy_policy="steer")).message_id
    lease = await Lease(client, worker_id="w1", lease_ms=2000).acquire(session)
    assert lease is not None
    ledger = Ledger(client, lease, queue_settings, worker_id="w1")
    assert await ledger.begin() is not None
    plain = await ingestor.ingest(make_message("plain"), busy_policy="steer")
    other = make_message("/stop") if event is None else make_message("other").model_copy(update={"event": event})
    await ingestor.ingest(other, busy_policy="steer")
    await ingestor.ingest(make_message("behind it"), busy_policy="steer")
    ids, _ = await ledger.steer(head, 1)
    assert ids == [plain.message_id]  # the rest waits for the next turn, in order
    assert await ledger.steer(head, 2) == ([], [])
    assert await client.hget(SessionKeys(session).attempts, f"{head}:took") == b"2"


@pytest.mark.parametrize("typed", ["/approve abc123XYZ", "  /DENY abc123XYZ ", "/approve", "/approve@my_bot abc123XYZ"])
async def test_a_typed_approval_decision_is_not_steered_into_the_running_turn(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, typed: str
) -> None:
    """``/approve ID`` typed on a channel without commands is a decision for a turn of its own, not the user's words."""
    first = make_message("first")
    head = (await ingestor.ingest(first, busy_policy="steer")).message_id
    lease = await Lease(client, worker_id="w1", lease_ms=2000).acquire(first.session_key)
    assert lease is not None
    ledger = Ledger(client, lease, queue_settings, worker_id="w1")
    assert await ledger.begin() is not None
    await ingestor.ingest(make_message(typed), busy_policy="steer")
    await ingestor.ingest(make_message("behind it"), busy_policy="steer")
    assert await ledger.steer(head, 1) == ([], [])  # it and everything behind it wait for the next turn


def test_a_resumed_reply_acks_only_what_its_run_answered() -> None:
    ids = ["a", "b", "c", "d"]
    attempt = Attempt(2, False, "", ids, ["", "", "", ""], policy="collect")
    part, _ = answered_part(attempt, [], "b")  # the reply answered a and b; c and d landed after it was written
    assert part.ids == ["a", "b"]
    steered = Attempt(2, False, "", ids, ["", "", "", ""], policy="steer", took=3)
    part, _ = answered_part(steered, [], "a")  # its run steered b and c in
    assert part.ids == ["a", "b", "c"]
    assert answered_part(attempt, [], "d")[0].ids == ids


@pytest.mark.parametrize("policy", ["sequential", "collect", "interrupt", "steer"])
def test_every_busy_policy_validates_for_agents_and_channels(tmp_path: Path, policy: str) -> None:
    path = tmp_path / "switchboard.yaml"
    path.write_text(
        f"agents:\n  assistant:\n    profile: {{name: A}}\n    instructions: Answer.\n    busy_policy: {policy}\n"
        f"channels:\n  telegram:\n    busy_policy: {policy}\n"
    )
    config = load_file(path, required=True)
    assert config.agents["assistant"].busy_policy == policy
    assert config.channels["telegram"].busy_policy == policy


def test_an_unknown_busy_policy_is_refused(tmp_path: Path) -> None:
    from switchboard.errors import ConfigError

    path = tmp_path / "switchboard.yaml"
    path.write_text("channels:\n  telegram:\n    busy_policy: queue\n")
    with pytest.raises(ConfigError, match="busy_policy"):
        load_file(path, required=True)


# -- a reply resumed after a crash ------------------------------------------------------------------------------


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs."""


class DiesAfterSending(RecordingDeliverer):
    """Delivers the reply, then the worker dies before the turn is completed (acked)."""

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        receipt = await super().perform(action, conversation, send)
        if action.kind == "text":
            raise Crash
        return receipt


@pytest.mark.parametrize("policy", ["collect", "steer"])
async def test_a_resumed_reply_leaves_later_messages_to_be_answered(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, policy: BusyPolicy
) -> None:
    runs: list[list[str]] = []

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        texts = [m.text for m in request.messages]
        if policy == "steer" and texts == ["m1"]:
            await ingestor.ingest(make_message("m2"), busy_policy=policy)
            assert isinstance(sink, SteeringSink)
            texts += [m.text for m in await sink.steered()]
        runs.append(texts)
        return TurnResult(text="answer: " + " | ".join(texts), steps=1)

    session = make_message("x").session_key
    await ingestor.ingest(make_message("m1"), busy_policy=policy)
    if policy == "collect":
        await ingestor.ingest(make_message("m2"), busy_policy=policy)
    first = DiesAfterSending()
    with pytest.raises(Crash):
        await make_drainer(client, queue_settings, first, runner=runner).drain_session(session)
    await ingestor.ingest(make_message("m3"), busy_policy=policy)  # lands after the reply was sent
    await client.delete(SessionKeys(session).lease)
    second = RecordingDeliverer()
    await make_drainer(client, queue_settings, second, runner=runner, worker_id="w2").drain_session(session)
    assert first.texts() == ["answer: m1 | m2"]
    assert second.texts() == ["answer: m1 | m2", "answer: m3"]  # the resumed reply, then m3's own (not lost)
    assert runs == [["m1", "m2"], ["m3"]]
    assert await client.llen(SessionKeys(session).inbox) == 0
