"""``switchboard erase --tenant`` runs in its own process while workers keep their databases open.

Erasing a tenant removed its files, but a worker's open connection went on reading the unlinked file: the erased
facts were still recalled by that worker, and what it remembered next went into a file no one else could see.
Two stores over one directory are two processes to SQLite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.core.memory.store import SQLiteMemoryStore
from tests.memory.test_sealing import NOW, _add, _fact


async def test_a_tenant_erased_by_another_process_is_gone_for_a_worker_with_it_open(tmp_path: Path) -> None:
    worker = SQLiteMemoryStore(tmp_path)
    cli = SQLiteMemoryStore(tmp_path)
    try:
        await _add(worker, _fact("f_01", "Ann keeps quokkas at home"))
        assert len(await worker.search("acme", ["shop"], "quokkas", 5, NOW)) == 1  # its connection is open
        assert await cli.erase("acme") == 1
        assert not (tmp_path / "acme.sqlite").exists()
        assert await worker.search("acme", ["shop"], "quokkas", 5, NOW) == []
        assert await worker.facts("acme", ["shop"]) == []
        assert await worker.get("acme", "f_01", ["shop"]) is None
        await _add(worker, _fact("f_02", "Bob keeps quokkas too", actor="web:bob"))  # after the erasure: kept
        assert [fact.id for fact in await cli.facts("acme", ["shop"])] == ["f_02"]
    finally:
        worker.close()
        cli.close()


async def test_erasing_a_tenant_spares_another_whose_name_differs_only_in_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a case-insensitive file system (macOS, Windows) tenants ``Acme`` and ``acme`` share ``acme.sqlite``.

    Reads stay apart (every query names the tenant), but erasing one removed the file and with it the other's memory.
    The file system is stood for by a store whose file name folds case, as such a file system does.
    """
    folded = SQLiteMemoryStore.path
    monkeypatch.setattr(SQLiteMemoryStore, "path", lambda self, tenant: folded(self, tenant.lower()))
    store = SQLiteMemoryStore(tmp_path)
    try:
        await _add(store, _fact("f_01", "Ann keeps quokkas at home"))
        upper = _fact("f_02", "Acme Corp keeps quokkas too").model_copy(update={"tenant": "Acme"})
        await _add(store, upper)
        assert [path.name for path in tmp_path.iterdir() if path.suffix == ".sqlite"] == ["acme.sqlite"]
        assert await store.erase("Acme") == 1
        assert [fact.id for fact in await store.facts("acme", ["shop"])] == ["f_01"]
        assert await store.facts("Acme", ["shop"]) == []
        assert await store.erase("acme") == 1
        assert list(tmp_path.iterdir()) == []  # the last tenant of the file takes it with it
    finally:
        store.close()
