"""A worker SIGKILLed while its turn holds a steered message: nothing is lost, one reply answers both."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import redis.asyncio as aioredis

from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings
from switchboard.worker.worker import SessionWorker
from tests.waiting import wait_until

from .conftest import RecordingDeliverer, make_drainer, make_message

ROOT = Path(__file__).resolve().parents[2]


async def test_a_worker_killed_mid_steer_loses_nothing(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    first = make_message("hang here")
    session = first.session_key
    keys = SessionKeys(session)
    head = (await ingestor.ingest(first, busy_policy="steer")).message_id
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.queue.steer_process", redis_url], cwd=ROOT, start_new_session=True
    )
    try:

        async def running() -> bool:
            return any(e["kind"] == "run_started" for e in await read_events(client, session))

        await wait_until(running, "the run started", timeout=30)
        steered = await ingestor.ingest(make_message("and this too"), busy_policy="steer")

        async def taken() -> bool:  # the doomed worker's turn read it from Redis (two inbox entries now its own)
            return await client.hget(keys.attempts, f"{head}:took") == b"2"

        await wait_until(taken, "the session taken over", timeout=30)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert await client.lrange(keys.inbox, 0, -1) == [head.encode(), steered.message_id.encode()]  # nothing acked

    deliverer = RecordingDeliverer()
    stop = asyncio.Event()
    worker = SessionWorker(
        redis_url,
        queue_settings,
        drainer_factory=lambda r, wid: make_drainer(r, queue_settings, deliverer, worker_id=wid),
        worker_id="rescuer",
    )
    task = asyncio.create_task(worker.run(stop))

    async def answered() -> bool:
        return bool(deliverer.texts()) and await client.llen(keys.inbox) == 0

    try:
        await wait_until(answered, "the answer", timeout=30)
    finally:
        stop.set()
        await task
    assert deliverer.texts() == ["echo: hang here | and this too"]  # one reply answers both, once
    replies = [s.action.reply_to for s in deliverer.sent if s.action.kind == "text"]
    assert replies == [steered.message_id]  # the re-run folds both, like collect, and replies to the last
    starts = [e for e in await read_events(client, session) if e["kind"] == "run_started"]
    assert [e["worker"] for e in starts] == ["doomed", "rescuer"] and starts[1]["attempt"] == 2
    assert await client.hlen(keys.messages) == 0 and await client.exists(keys.attempts) == 0
