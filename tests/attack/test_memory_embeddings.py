"""A hostile or broken embeddings server against the OpenAI embedder and the memory tools over it.

Whatever the server answers (non-numbers, NaN, infinities, missing or repeated indexes, no JSON at all), the embedder
raises :class:`EmbeddingError` (the tools then answer "try again later"), and nothing is written: no fact without its
vectors, no vector without its fact, no poisoned cache entry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from switchboard.core.memory.embeddings import EmbeddingError, OpenAIEmbedder
from tests.memory.conftest import Turn, build_memory, inbound

DIMS = 4


def _row(embedding: str, index: str = '"index": 0, ') -> str:
    return '{"object": "embedding", ' + index + '"embedding": ' + embedding + "}"


def _body(*rows: str) -> str:
    return '{"object": "list", "model": "m", "data": [' + ", ".join(rows) + "]}"


BODIES = {
    "nan": _body(_row("[NaN, 1.0, 0.0, 0.0]")),
    "infinity": _body(_row("[1e999, 1.0, 0.0, 0.0]")),
    "strings": _body(_row('["a", "b", "c", "d"]')),
    "nested": _body(_row("[[1], [2], [3], [4]]")),
    "null": _body(_row("null")),
    "base64-unasked": _body(_row('"AACAPwAAAAAAAAAAAAAAAA=="')),
    "no-data": '{"object": "list", "model": "m"}',
    "data-object": '{"object": "list", "model": "m", "data": {"a": 1}}',
    "no-index": _body(_row("[1, 0, 0, 0]", index="")),
    "index-out-of-range": _body(_row("[1, 0, 0, 0]", index='"index": 7, ')),
    "not-json": "hello",
    "a-list": "[1, 2]",
}


@pytest.fixture
def answer() -> dict[str, str]:
    return {"body": BODIES["nan"]}


@pytest.fixture
async def base_url(answer: dict[str, str], aiohttp_server: Any) -> AsyncIterator[str]:
    async def embeddings(request: web.Request) -> web.Response:
        return web.Response(text=answer["body"], content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/embeddings", embeddings)
    server = await aiohttp_server(app)
    yield str(server.make_url("/v1"))


@pytest.mark.parametrize("name", list(BODIES))
async def test_any_malformed_answer_is_an_embedding_error(name: str, answer: dict[str, str], base_url: str) -> None:
    answer["body"] = BODIES[name]
    embedder = OpenAIEmbedder(model="some-model", dims=DIMS, api_key="k", base_url=base_url, max_retries=0)
    try:
        with pytest.raises(EmbeddingError, match="embeddings API"):
            await embedder.embed(["Ann prefers email"])
        answer["body"] = _body(_row("[1, 0, 0, 0]"), _row("[0, 1, 0, 0]"))  # two rows, both index 0
        with pytest.raises(EmbeddingError, match="embeddings API"):
            await embedder.embed(["one", "two"])
        answer["body"] = _body(_row("[1, 2.5, 0, -3]"))  # the check can pass
        assert await embedder.embed(["Ann prefers email"]) == [[1.0, 2.5, 0.0, -3.0]]
    finally:
        await embedder.aclose()


@pytest.mark.parametrize("name", ["nan", "strings", "null"])
async def test_remember_over_a_broken_server_writes_nothing(
    name: str, answer: dict[str, str], base_url: str, tmp_path: Path
) -> None:
    answer["body"] = BODIES[name]
    embedder = OpenAIEmbedder(model="some-model", dims=DIMS, api_key="k", base_url=base_url, max_retries=0)
    memory = build_memory(tmp_path, embedder)
    try:
        turn = Turn(inbound=[inbound("Ann prefers email over phone calls", "m1")])
        args = {"text": "Ann prefers email", "source": {"kind": "message", "quote": "prefers email"}, "project": "shop"}
        outcome = await memory.call("remember", args, turn)
        assert not outcome.ok and outcome.error_class == "transient", outcome
        assert "try again later" in str(outcome.error)
        assert await memory.store.facts("acme", ["shop"]) == [] and turn.events == []
        assert await memory.store.cached_embeddings("acme", "some-model", []) == {}
        db = memory.store._db("acme")
        assert db.execute("SELECT count(*) FROM embedding_cache").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM passages").fetchone()[0] == 0
    finally:
        await embedder.aclose()
        memory.store.close()
