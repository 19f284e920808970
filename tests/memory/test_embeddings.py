"""Embeddings from the OpenAI API (the official SDK against the fake server), cached by content hash; the
``memory:`` block of the file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from switchboard.core.memory.config import EmbeddingsConfig, MemoryConfig, build_embedder
from switchboard.core.memory.embeddings import CachedEmbedder, EmbeddingError, LocalEmbedder, OpenAIEmbedder, digest
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.errors import ConfigError
from switchboard.settings import FileConfig
from tests.fakes.openai_api import FakeOpenAI
from tests.memory.conftest import Memory, Turn, build_memory, inbound

KEY = "sk-test-embeddings"


@pytest.fixture
def fake() -> FakeOpenAI:
    return FakeOpenAI(api_key=KEY)


@pytest.fixture
async def base_url(fake: FakeOpenAI, aiohttp_server: Any) -> AsyncIterator[str]:
    server = await aiohttp_server(fake.app())
    yield str(server.make_url("/v1"))


def _inputs(fake: FakeOpenAI) -> list[list[str]]:
    return [list(request.body["input"]) for request in fake.embedding_requests()]


async def test_the_openai_embedder_speaks_the_embeddings_api(fake: FakeOpenAI, base_url: str) -> None:
    embedder = OpenAIEmbedder(model="text-embedding-3-small", dims=256, api_key=KEY, base_url=base_url)
    vectors = await embedder.embed(["invoices by email", "refunds by card"])
    assert [len(vector) for vector in vectors] == [256, 256]
    assert vectors[0] == pytest.approx(LocalEmbedder(256).vector("invoices by email"), abs=1e-6)
    (request,) = fake.embedding_requests()
    assert request.body["model"] == "text-embedding-3-small" and request.body["dimensions"] == 256
    assert request.headers["authorization"] == f"Bearer {KEY}"

    wrong = OpenAIEmbedder(model="text-embedding-3-small", dims=256, api_key="sk-wrong", base_url=base_url)
    with pytest.raises(EmbeddingError, match="AuthenticationError"):
        await wrong.embed(["x"])
    other = OpenAIEmbedder(model="text-embedding-ada-002", dims=64, api_key=KEY, base_url=base_url)
    with pytest.raises(EmbeddingError, match="other than 1 vectors of 64"):  # the model answers 1536
        await other.embed(["x"])
    fake.embeddings_status = 500
    failing = OpenAIEmbedder(model="text-embedding-3-small", dims=256, api_key=KEY, base_url=base_url, max_retries=0)
    with pytest.raises(EmbeddingError, match="InternalServerError"):
        await failing.embed(["x"])
    for client in (embedder, wrong, other, failing):
        await client.aclose()


async def test_cached_embeddings_are_asked_for_once_per_text(fake: FakeOpenAI, base_url: str, tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory")
    inner = OpenAIEmbedder(model="text-embedding-3-small", dims=64, api_key=KEY, base_url=base_url)
    cached = CachedEmbedder(inner, store, "acme")
    first = await cached.embed(["alpha", "beta", "alpha"])
    assert _inputs(fake) == [["alpha", "beta"]]
    second = await cached.embed(["beta", "gamma", "alpha"])
    assert _inputs(fake) == [["alpha", "beta"], ["gamma"]]
    assert second[0] == first[1] and second[2] == first[0]
    await cached.embed(["gamma", "alpha"])
    assert len(fake.embedding_requests()) == 2
    # the cache is the tenant's: another tenant asks again
    await CachedEmbedder(inner, store, "globex").embed(["alpha"])
    assert _inputs(fake)[-1] == ["alpha"]
    assert set(await store.cached_embeddings("acme", inner.model, [digest(inner.model, "alpha")])) == {
        digest(inner.model, "alpha")
    }
    await inner.aclose()
    store.close()


async def test_memory_tools_embed_through_the_api_once_per_text(
    fake: FakeOpenAI, base_url: str, tmp_path: Path
) -> None:
    embedder = OpenAIEmbedder(model="text-embedding-3-small", dims=128, api_key=KEY, base_url=base_url, max_retries=0)
    memory: Memory = build_memory(tmp_path, embedder)
    turn = Turn(inbound=[inbound("Ann prefers invoicing in euros", "m1")])
    source = {"kind": "message", "quote": "invoicing in euros"}
    args = {"text": "Ann prefers invoicing in euros", "source": source, "project": "shop"}
    remembered = await memory.call("remember", args, turn)
    assert remembered.ok, remembered
    for _ in range(2):
        found = await memory.call("recall", {"query": "invoices"}, None)
        assert found.ok and found.value["mode"] == "hybrid"
        assert [fact["id"] for fact in found.value["facts"]] == [remembered.value["remembered"]]
    assert _inputs(fake) == [["Ann prefers invoicing in euros"], ["invoices"]]  # the second recall hit the cache

    fake.embeddings_status = 500
    failed = await memory.call("recall", {"query": "something new"}, None)
    assert not failed.ok and "mode lexical" in str(failed.error)
    lexical = await memory.call("recall", {"query": "euros", "mode": "lexical"}, None)
    assert lexical.ok and len(lexical.value["facts"]) == 1
    await embedder.aclose()
    memory.store.close()


def test_the_memory_block_chooses_the_store_and_the_embedder() -> None:
    assert FileConfig.model_validate({}).memory == MemoryConfig()
    assert isinstance(build_embedder(MemoryConfig().embeddings), LocalEmbedder)
    config = FileConfig.model_validate(
        {"memory": {"embeddings": {"provider": "openai", "model": "text-embedding-3-large", "dims": 512}}}
    ).memory
    found = build_embedder(config.embeddings, {"OPENAI_API_KEY": "sk-1"})
    assert isinstance(found, OpenAIEmbedder) and (found.model, found.dims) == ("text-embedding-3-large", 512)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        build_embedder(config.embeddings, {})
    assert build_embedder(EmbeddingsConfig(provider="none")) is None
    with pytest.raises(ValidationError, match="dsn_env"):
        FileConfig.model_validate({"memory": {"store": "postgres"}})
    with pytest.raises(ValidationError, match="environment variable name"):
        FileConfig.model_validate({"memory": {"store": "postgres", "dsn_env": "postgres://u:secret@h/db"}})
    with pytest.raises(ValidationError, match="extra"):
        FileConfig.model_validate({"memory": {"embeddings": {"api_key": "sk-in-the-file"}}})
