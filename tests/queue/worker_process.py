"""A real worker process for the kill test: ``python -m tests.queue.worker_process REDIS_URL``.

Runs :func:`switchboard.worker.worker.run_worker` with a runner that hangs on "hang" and a deliverer that
sends nothing, the way ``switchboard worker`` runs it with the real runtime and channels.
"""

from __future__ import annotations

import asyncio
import sys

from switchboard.settings import QueueSettings, Settings
from switchboard.worker.worker import run_worker

from .conftest import RecordingDeliverer, agent_for, echo_runner


async def hang_runner(request, sink, store):  # type: ignore[no-untyped-def]
    if any("hang" in m.text for m in request.messages):
        await asyncio.sleep(3600)
    return await echo_runner(request, sink, store)


async def main(url: str) -> None:
    queue = QueueSettings(name="sbtest", lease_ms=2000, reaper_interval_s=0.2, retry_backoff_s=0)
    settings = Settings(redis_url=url, queue=queue)
    await run_worker(settings, hang_runner, RecordingDeliverer(), agent_for, asyncio.Event(), worker_id="doomed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
