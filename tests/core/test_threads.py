"""Tool threads: each session gets a bounded share, held until its threads really finish."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.builtin.files import TOOLS as FILES
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.tools.threads import ThreadShare, run_blocking
from switchboard.types import SessionKey
from tests.core.turns import Empty, make_tool


def context(tmp_path: Path, session: str) -> ToolContext:
    return ToolContext(
        session_key=SessionKey(f"t/a/web/default/{session}"),
        tenant="t",
        run_id="run",
        actor="u",
        workspace=tmp_path / session,
        idempotency_key="",
    )


async def test_one_sessions_stuck_threads_leave_the_others_theirs(tmp_path: Path) -> None:
    release = threading.Event()
    entered: list[str] = []

    def stuck() -> str:
        entered.append(threading.current_thread().name)
        release.wait(60)
        return "done"

    async def slow(args: Empty, c: ToolContext) -> Any:
        return await run_blocking(c, stuck)

    share = ThreadShare(threads=4, per_session=2)
    tool = make_tool("slow", slow, timeout_s=0.2, retry_on=frozenset())
    gateway = ToolGateway(ToolRegistry([*FILES, tool]), workspace_root=tmp_path, threads=share)
    try:
        hog = context(tmp_path, "hog")
        # Six calls time out and return, as a parser stuck in a thread would; the threads keep running.
        outcomes = await asyncio.gather(*(gateway.call("slow", {}, hog) for _ in range(6)))
        assert all(o.error_class == "transient" for o in outcomes)
        assert share.busy(hog.session_key) == 2 and len(entered) == 2  # the share, not the whole pool

        other = context(tmp_path, "other")
        async with asyncio.timeout(30):  # a liveness guard, not a timing threshold
            listed = await gateway.call("list_files", {}, other)
            written = await gateway.call("write_file", {"path": "a.txt", "content": "x"}, other)
        assert listed.ok and written.ok
        assert not release.is_set() and share.busy(hog.session_key) == 2  # served while the hog still held its share
    finally:
        release.set()
    async with asyncio.timeout(30):
        while share.busy(hog.session_key):
            await asyncio.sleep(0.01)
    assert (await gateway.call("list_files", {}, hog)).ok  # its slots came back when its threads ended
    share.shutdown()


async def test_a_session_waiting_for_a_slot_runs_in_turn() -> None:
    share = ThreadShare(threads=8, per_session=1)
    order: list[int] = []
    gate = threading.Event()

    def work(n: int) -> int:
        if n == 0:
            gate.wait(10)
        order.append(n)
        return n

    first = asyncio.create_task(share.run("s", work, 0))
    second = asyncio.create_task(share.run("s", work, 1))
    await asyncio.sleep(0.05)
    assert order == [] and share.busy("s") == 1
    gate.set()
    assert await asyncio.gather(first, second) == [0, 1]
    assert order == [0, 1] and share.busy("s") == 0
    share.shutdown()
