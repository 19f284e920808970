"""One tenant's memory work must not stall another's: a hostile tenant's slow recall (16 common words over a large
store are scored in Python) held the store's single lock, so every other tenant's memory call in that worker waited.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from switchboard.core.memory.store import SQLiteMemoryStore
from tests.memory.test_sealing import NOW, _add, _fact


async def test_a_slow_call_of_one_tenant_does_not_block_another_tenant(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path)
    await _add(store, _fact("f_01", "Ann keeps quokkas at home"))
    await store.facts("globex", ["shop"])  # both files exist and are open
    busy, release = threading.Event(), threading.Event()

    def slow(db: object) -> None:  # stands for a long search of acme's memory
        busy.set()
        release.wait(30)

    blocked = asyncio.create_task(store._run("acme", slow))
    try:
        assert await asyncio.to_thread(busy.wait, 10)
        assert await asyncio.wait_for(store.facts("globex", ["shop"]), 5) == []
        assert await asyncio.wait_for(store.search("globex", ["shop"], "quokkas", 5, NOW), 5) == []
    finally:
        release.set()
        await blocked
    assert [hit.fact.id for hit in await store.search("acme", ["shop"], "quokkas", 5, NOW)] == ["f_01"]
    store.close()
