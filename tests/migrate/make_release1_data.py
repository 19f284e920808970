"""Write ``tests/migrate/data/appendonlydir``: data of the release before the sharded layout, by that release's code.

Run it with a checkout of that release (commit 61df873) first on the path, never this tree's code::

    git archive 61df873 | tar -x -C /tmp/rel1
    PYTHONPATH=/tmp/rel1 /tmp/rel1/.venv/bin/python tests/migrate/make_release1_data.py   # or any venv with its deps

It starts the release's embedded server in a temporary directory and uses the release's own code paths (ingest,
lease, ledger, approvals, history) to write: four sessions with three waiting messages each, a session whose turn
was running (lease taken, attempt started) with two messages, a deferred session, a dead letter, a pending approval,
a session history and a fenced write (``sb:stats:fenced`` > 0). Then the AOF is rewritten into one base snapshot
and the server's ``appendonlydir`` (what a ``switchboard run`` data directory holds under ``redis/``) is copied here:
the embedded server runs with AOF on, so it loads that directory, never a ``dump.rdb``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis

from switchboard.core.approvals.records import ApprovalRecord
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.turn import HistoryEntry
from switchboard.errors import FencedWriteError
from switchboard.queue.approvals import RedisApprovals
from switchboard.queue.embedded import EmbeddedRedis
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease, LeaseToken, fenced_xadd
from switchboard.queue.ledger import Ledger, Taken
from switchboard.queue.store import RedisSessionStore
from switchboard.settings import QueueSettings

OUT = Path(__file__).resolve().parent / "data" / "appendonlydir"


def message(conversation: str, n: int) -> InboundMessage:
    return InboundMessage(
        dedup_key=f"{conversation}-{n}",
        conversation=ConversationRef(agent="assistant", channel="web", conversation=conversation),
        sender=Sender(id="u1", name="User"),
        text=f"{conversation} message {n}",
    )


async def fill(url: str) -> None:
    redis = aioredis.Redis.from_url(url)
    settings = QueueSettings()
    ingestor = Ingestor(redis, settings)
    lease = Lease(redis, worker_id="old-worker", lease_ms=settings.lease_ms)

    for conversation in ("c1", "c2", "c3", "c4"):  # waiting messages, in order
        for n in (1, 2, 3):
            await ingestor.ingest(message(conversation, n))

    history = message("c1", 1).session_key  # a history written by an earlier turn
    token = await lease.acquire(history)
    assert token is not None
    await RedisSessionStore(redis, history, token.epoch, settings, token=token.token).append_history(
        [HistoryEntry(role="user", text="earlier"), HistoryEntry(role="assistant", text="earlier answer")]
    )
    await lease.abandon(token)

    for n in (1, 2):  # a running turn: lease held, attempt at the head started, then the worker died
        await ingestor.ingest(message("running", n))
    taken = await Ledger.take(redis, message("running", 1).session_key, settings, worker_id="old-worker")
    assert isinstance(taken, Taken)
    # a write by a stale epoch: refused and counted in sb:stats:fenced
    stale = LeaseToken(session=taken.ledger.lease.session, epoch=0, token="0:ghost")
    with contextlib.suppress(FencedWriteError):
        await fenced_xadd(redis, stale, SessionKeys(stale.session).events, {"kind": "ghost"}, 100)

    for n in (1, 2):  # a deferred session: the provider asked to wait a second
        await ingestor.ingest(message("deferred", n))
    deferred = await Ledger.take(redis, message("deferred", 1).session_key, settings, worker_id="old-worker")
    assert isinstance(deferred, Taken)
    await deferred.ledger.defer(deferred.attempt, until=time.time() + 1, reason="rate limited", max_deferrals=5)

    await ingestor.ingest(message("poison", 1))  # a dead letter
    dead = await Ledger.take(redis, message("poison", 1).session_key, settings, worker_id="old-worker")
    assert isinstance(dead, Taken)
    await dead.ledger.dead_letter(dead.attempt, reason="tool crashed", attempts=3, outbox_keys=[])

    await ingestor.ingest(message("approval", 1))  # answered earlier in real life; here it waits too
    session = message("approval", 1).session_key
    token = await lease.acquire(session)
    assert token is not None
    now = time.time()
    record = ApprovalRecord(
        id="a1b2c3d4e5f6",
        session=session,
        tenant="default",
        agent="assistant",
        channel="web",
        run_id="run-1",
        requested_by="u1",
        requested_at=now,
        expires_at=now + 30 * 24 * 3600,
        state_sha256="0" * 64,
    )
    await RedisApprovals(redis, session, token.token, token.epoch).approval_open(record)
    await lease.abandon(token)

    fenced = await redis.get("sb:stats:fenced")
    assert fenced is not None and int(fenced) > 0, "no fenced write was counted"
    await redis.bgrewriteaof()  # the AOF as one compact base snapshot, as a long-running server's would be
    while True:
        info = await redis.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            break
        await asyncio.sleep(0.05)
    await redis.aclose()


def main() -> None:
    import switchboard

    print(f"writing with the switchboard package at {Path(switchboard.__file__).parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        url = server.start()
        try:
            asyncio.run(fill(url))
        finally:
            server.stop()
        shutil.rmtree(OUT, ignore_errors=True)
        shutil.copytree(Path(tmp) / "redis" / "appendonlydir", OUT)
    sizes = ", ".join(f"{f.name} {f.stat().st_size} bytes" for f in sorted(OUT.iterdir()))
    print(f"wrote {OUT}: {sizes}", file=sys.stderr)


if __name__ == "__main__":
    main()
