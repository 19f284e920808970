"""What a recall leaves on disk: its query was embedded through the tenant's persistent cache, so every question asked
of memory ("does Ann have HIV?") stayed in the tenant's file as a sha256 of its text and a vector, with no owner and
no date: no erasure of a person and no retention rule could find it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from switchboard.core.memory.embeddings import LocalEmbedder, digest
from tests.memory.conftest import Turn, build_memory, inbound


class ProviderEmbedder:
    """An embedder of a provider (not the local one, so the tools cache its vectors), counting what it is asked."""

    def __init__(self) -> None:
        self._local = LocalEmbedder(64)
        self.model = "provider-embedding"
        self.dims = 64
        self.asked: list[str] = []

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.asked += texts
        return await self._local.embed(texts)


async def test_recall_queries_are_not_kept_in_the_tenants_file(tmp_path: Path) -> None:
    embedder = ProviderEmbedder()
    memory = build_memory(tmp_path, embedder)
    try:
        turn = Turn(inbound=[inbound("Ann prefers invoices by email", "m1")])
        args = {"text": "Ann prefers invoices by email", "source": {"kind": "message", "quote": "invoices by email"}}
        assert (await memory.call("remember", args | {"project": "shop"}, turn)).ok
        question = "does Ann have a medical condition"
        for _ in range(2):
            found = await memory.call("recall", {"query": question}, turn)
            assert found.ok and found.value["mode"] == "hybrid"
        assert embedder.asked == ["Ann prefers invoices by email", question]  # still asked for once
        db = memory.store._db("acme")
        kept = {row[0] for row in db.execute("SELECT digest FROM embedding_cache")}
        assert digest(embedder.model, "Ann prefers invoices by email") in kept  # the check can fail
        assert digest(embedder.model, question) not in kept
    finally:
        memory.store.close()
