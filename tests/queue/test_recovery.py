"""A SIGKILLed worker process: its session is picked up by another worker after the lease expires."""

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


async def test_sigkilled_worker_process_session_is_recovered(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    msg = make_message("hang here")
    await ingestor.ingest(msg)
    await ingestor.ingest(make_message("after it"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.queue.worker_process", redis_url], cwd=ROOT, start_new_session=True
    )
    try:

        async def running() -> bool:
            return any(e["kind"] == "run_started" for e in await read_events(client, msg.session_key))

        await wait_until(running, "the run started", timeout=30)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()

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
        return deliverer.texts() == ["echo: hang here", "echo: after it"]

    try:
        await wait_until(answered, "the answer after recovery", timeout=20)
    finally:
        stop.set()
        await task
    events = await read_events(client, msg.session_key)
    starts = [e for e in events if e["kind"] == "run_started" and e["message_id"] == deliverer.sent[-1].action.reply_to]
    first = [e for e in events if e["kind"] == "run_started"][:2]
    assert [e["worker"] for e in first] == ["doomed", "rescuer"]
    assert first[1]["epoch"] > first[0]["epoch"] and first[1]["attempt"] == 2
    assert len(starts) == 1
    assert await client.llen(SessionKeys(msg.session_key).inbox) == 0
