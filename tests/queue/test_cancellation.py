"""``/stop`` and the console stop the running turn (model request and tools with it); nothing else is lost."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.queue.cancellation import listen_for_stops, request_stop
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings
from tests.queue.conftest import RecordingDeliverer, make_drainer, make_message
from tests.waiting import wait_until


class SlowRunner:
    """Runs until cancelled for texts starting with 'slow', echoes otherwise; records what happened."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled: list[str] = []

    async def __call__(self, request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        text = request.messages[-1].text
        if text.startswith("slow"):
            self.started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled.append(text)
                raise
        return TurnResult(text=f"echo: {text}", steps=1)


async def _kinds(client: aioredis.Redis, session: str) -> list[str]:
    return [f[b"kind"].decode() for _, f in await client.xrange(SessionKeys(session).events)]  # type: ignore[arg-type]


async def test_stop_cancels_only_the_running_turn_and_is_answered_in_order(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    runner = SlowRunner()
    drainer = make_drainer(client, queue_settings, deliverer, runner=runner)
    stop_listening = asyncio.Event()
    listener = asyncio.create_task(listen_for_stops(client, drainer.cancel, stop_listening))
    slow = make_message("slow question")
    session = slow.session_key
    await ingestor.ingest(slow)
    drain = asyncio.create_task(drainer.drain(session))
    await asyncio.wait_for(runner.started.wait(), 10)
    await ingestor.ingest(make_message("queued before the stop"))
    await ingestor.ingest(make_message("/stop"))
    await asyncio.wait_for(drain, 10)
    stop_listening.set()
    await listener

    assert runner.cancelled == ["slow question"]
    assert deliverer.texts() == ["echo: queued before the stop", "Stopped."]
    kinds = await _kinds(client, session)
    assert kinds.count("run_cancelled") == 1 and "run_failed" not in kinds and "run_dead_lettered" not in kinds
    assert await client.llen(SessionKeys(session).inbox) == 0


async def test_stop_with_nothing_running_says_so(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    message = make_message("/stop")
    await ingestor.ingest(message)
    await make_drainer(client, queue_settings, deliverer).drain(message.session_key)
    assert deliverer.texts() == ["Nothing was running, so there was nothing to stop."]


async def test_console_stop_reaches_the_model_request_of_the_real_runtime(
    client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings, tmp_path: object
) -> None:
    from pathlib import Path

    from switchboard.core.agent.runtime import Runtime
    from switchboard.core.providers import ModelFactory, ProviderConfig
    from switchboard.core.tools.builtin import default_registry
    from switchboard.worker.drain import Drainer
    from tests.queue.conftest import agent_for

    deliverer = RecordingDeliverer(streaming=True)
    models = ModelFactory(ProviderConfig(offline_delay_ms=30_000))  # a model that would take 30 s
    runtime = Runtime(models=models, tools=default_registry(), workspace_root=Path(str(tmp_path)))
    drainer = Drainer(
        client, queue_settings, runner=runtime.run_turn, deliverer=deliverer, agent_for=agent_for, worker_id="w1"
    )
    stop_listening = asyncio.Event()
    listener = asyncio.create_task(listen_for_stops(client, drainer.cancel, stop_listening))
    message = make_message("tell me a long story")
    await ingestor.ingest(message)
    drain = asyncio.create_task(drainer.drain(message.session_key))

    async def running() -> bool:
        return "run_started" in await _kinds(client, message.session_key)

    await wait_until(running, "the run started")
    await asyncio.sleep(0.05)  # let the listener's subscription settle before publishing
    assert await request_stop(client, message.session_key, reason="operator stop") >= 1
    await asyncio.wait_for(drain, 10)  # far sooner than the 30 s model: the request was cancelled
    stop_listening.set()
    await listener
    await models.aclose()

    events = [json.loads(f[b"data"]) for _, f in await client.xrange(SessionKeys(message.session_key).events)]
    cancelled = [e for e in events if e["kind"] == "run_cancelled"]
    assert cancelled and cancelled[0]["reason"] == "operator stop"
    errors = [s.action for s in deliverer.sent if s.action.kind == "error"]
    assert errors and errors[0].code == "cancelled"  # type: ignore[union-attr]
    assert deliverer.texts() == []
