"""A slow recall must stall nothing else: 16 common words over a large store are scored in Python, which takes
seconds. It held the store's single lock (every other tenant's memory call in that worker waited), and it read under
SQLite's write lock (another worker writing the same tenant failed with "database is locked" after 5 seconds).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.memory import store as store_module
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


async def test_a_slow_search_does_not_lock_out_another_workers_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stores over one directory are two worker processes to SQLite: a search must not hold the write lock."""
    searching = SQLiteMemoryStore(tmp_path)
    writing = SQLiteMemoryStore(tmp_path)
    await _add(searching, _fact("f_01", "Ann keeps quokkas at home"))
    busy, release = threading.Event(), threading.Event()
    scored = store_module._bm25

    def slow_bm25(*args: Any) -> float:  # a search scoring many passages
        busy.set()
        release.wait(30)
        return scored(*args)

    monkeypatch.setattr(store_module, "_bm25", slow_bm25)
    search = asyncio.create_task(searching.search("acme", ["shop"], "quokkas", 5, NOW))
    try:
        assert await asyncio.to_thread(busy.wait, 10)
        await asyncio.wait_for(_add(writing, _fact("f_02", "Bob keeps quokkas too", actor="web:bob")), 3)
    finally:
        release.set()
        hits = await search
    assert [hit.fact.id for hit in hits] == ["f_01"]  # the search saw the memory as it was when it began
    assert len(await writing.facts("acme", ["shop"])) == 2
    searching.close()
    writing.close()
