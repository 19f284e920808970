"""A real worker process for the mid-steer kill test: ``python -m tests.queue.steer_process REDIS_URL``.

Runs :func:`switchboard.worker.worker.run_worker` with a runner that, for a message saying "hang", asks its sink for
steered messages (as the runtime does before each model call) until one arrives, then hangs: the test SIGKILLs it
there, with the steered message taken by the turn but not acked.
"""

from __future__ import annotations

import asyncio
import sys

from switchboard.core.turn import SessionStore, SteeringSink, TurnRequest, TurnResult, TurnSink
from switchboard.settings import QueueSettings, Settings
from switchboard.worker.worker import run_worker

from .conftest import RecordingDeliverer, agent_for, echo_runner


async def steer_then_hang(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
    if any("hang" in m.text for m in request.messages):
        assert isinstance(sink, SteeringSink)
        while not await sink.steered():
            await asyncio.sleep(0.05)
        await asyncio.sleep(3600)
    return await echo_runner(request, sink, store)


async def main(url: str) -> None:
    queue = QueueSettings(name="sbtest", lease_ms=2000, reaper_interval_s=0.2, retry_backoff_s=0)
    settings = Settings(redis_url=url, queue=queue)
    await run_worker(settings, steer_then_hang, RecordingDeliverer(), agent_for, asyncio.Event(), worker_id="doomed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
