"""Worker processes writing the same tenant's SQLite memory at once: no "database is locked", no lost write.

Real processes (``multiprocessing`` with ``spawn``, as separate workers are), each with its own store over the same
directory, all starting together on a fresh tenant: they create the file, migrate it, remember, search, correct and
forget while the others do the same.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.store import SQLiteMemoryStore

WORKERS = 4
FACTS = 30
NOW = 1_800_000_000.0


def _fact(worker: int, number: int) -> Fact:
    return Fact(
        id=f"f_{worker:02x}{number:04x}",
        project="shop",
        tenant="acme",
        text=f"Worker {worker} remembers order {number} ships to Paris",
        source=Source(kind="message", quote="ships to Paris"),
        run_id=f"run-{worker}",
        created_at=NOW,
    )


def _change(fact: Fact, op: str) -> FactChange:
    return FactChange.model_validate({"fact_id": fact.id, "project": "shop", "op": op, "actor": "web:ann", "at": NOW})


async def _work(root: Path, worker: int) -> None:
    store = SQLiteMemoryStore(root)
    try:
        for number in range(FACTS):
            fact = _fact(worker, number)
            await store.add(fact, _change(fact, "remembered"))
            await store.search("acme", ["shop"], "order ships paris", 5, NOW + 1)
            if number % 5 == 4:
                source = Source(kind="message", quote="ships to Lyon")
                await store.correct(
                    "acme", fact.id, fact.text.replace("Paris", "Lyon"), source, 0.9, _change(fact, "corrected")
                )
            if number % 10 == 9:
                await store.forget("acme", _fact(worker, number - 1).id, _change(fact, "forgotten"))
    finally:
        store.close()


def _worker(root: str, worker: int, start: Any, errors: Any) -> None:
    try:
        start.wait(timeout=60)
        asyncio.run(_work(Path(root), worker))
    except BaseException as error:  # reported to the test, which fails with it
        errors.put(f"worker {worker}: {type(error).__name__}: {error}")
        errors.close()
        errors.join_thread()
        raise SystemExit(1) from None


async def test_worker_processes_writing_one_tenant_at_once_lose_nothing(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(WORKERS)
    errors = context.Queue()
    processes = [
        context.Process(target=_worker, args=(str(tmp_path), worker, start, errors)) for worker in range(WORKERS)
    ]
    for process in processes:
        process.start()
    for process in processes:
        await asyncio.to_thread(process.join, 240)
    failures = [errors.get(timeout=5) for process in processes if process.exitcode != 0]
    assert failures == [] and [process.exitcode for process in processes] == [0] * WORKERS

    store = SQLiteMemoryStore(tmp_path)
    try:
        facts = await store.facts("acme", ["shop"])
        expected = {
            _fact(worker, number).id
            for worker in range(WORKERS)
            for number in range(FACTS)
            if number % 10 != 8  # each tenth-but-one was forgotten
        }
        assert {fact.id for fact in facts} == expected
        corrected = [fact for fact in facts if fact.text.endswith("Lyon")]
        assert len(corrected) == WORKERS * (FACTS // 5) and all(fact.confidence == 0.9 for fact in corrected)
        changes = await store.changes("acme")
        assert len(changes) == WORKERS * (FACTS + FACTS // 5 + FACTS // 10)
        hits = await store.search("acme", ["shop"], "lyon", 10_000, NOW + 1)
        assert {hit.fact.id for hit in hits} == {fact.id for fact in corrected}
    finally:
        store.close()
