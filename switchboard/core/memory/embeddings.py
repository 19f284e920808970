"""Embeddings of memory text: the :class:`Embedder` protocol and its local, OpenAI and cached implementations.

:class:`LocalEmbedder` needs no network and gives the same vector for the same text on every machine: words and
character trigrams hashed into a fixed number of dimensions, so texts sharing words or parts of words (``invoice``,
``invoices``, ``invoicing``) are near. :class:`OpenAIEmbedder` calls the provider's embeddings API through the
official SDK. :class:`CachedEmbedder` keeps vectors by content hash (``sha256`` of the model and the text) in the
tenant's memory store, so a text is embedded once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = [
    "LOCAL_DIMS",
    "LOCAL_MODEL",
    "CachedEmbedder",
    "Embedder",
    "EmbeddingCache",
    "EmbeddingError",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "digest",
]

logger = logging.getLogger(__name__)

LOCAL_MODEL = "local-hash-1"
LOCAL_DIMS = 384

_WORD = re.compile(r"\w+", re.UNICODE)
_WORD_WEIGHT = 1.0
_GRAM_WEIGHT = 0.35
_STOP = frozenset(
    (
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "her",
        "his",
        "i",
        "in",
        "is",
        "it",
        "its",
        "me",
        "my",
        "not",
        "of",
        "on",
        "or",
        "our",
        "she",
        "so",
        "than",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    )
)
_OPENAI_BATCH = 512
"""Most texts in one embeddings request."""


class EmbeddingError(RuntimeError):
    """The embeddings could not be computed (the provider failed or answered with vectors of another shape)."""


class Embedder(Protocol):
    """Turns texts into vectors of ``dims`` floats, the same text always into the same vector for one ``model``."""

    model: str
    dims: int

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        ...


class EmbeddingCache(Protocol):
    """Where vectors are kept by content hash: the embedding cache methods of a memory store."""

    async def cached_embeddings(self, tenant: str, model: str, digests: Sequence[str]) -> dict[str, list[float]]:
        """The cached vectors of ``model`` among ``digests``, by digest."""
        ...

    async def cache_embeddings(self, tenant: str, model: str, vectors: Mapping[str, Sequence[float]]) -> None:
        """Keep ``vectors`` of ``model`` by digest."""
        ...


def digest(model: str, text: str) -> str:
    """The cache key of ``text`` embedded by ``model``."""
    return hashlib.sha256(f"{model}\n{text}".encode()).hexdigest()


def _normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(value * value for value in vector))
    return vector if norm == 0 else [value / norm for value in vector]


class LocalEmbedder:
    """Deterministic offline embeddings: signed feature hashing of words and character trigrams, unit length."""

    def __init__(self, dims: int = LOCAL_DIMS) -> None:
        if dims < 16:
            raise ValueError("a local embedding has at least 16 dimensions")
        self.model = LOCAL_MODEL if dims == LOCAL_DIMS else f"{LOCAL_MODEL}-{dims}"
        self.dims = dims

    def vector(self, text: str) -> list[float]:
        """The embedding of one text (the zero vector for a text without words).

        A feature seen ``n`` times weighs ``1 + ln n`` times its base weight, so words a passage repeats do not
        drown the rest.
        """
        counts: Counter[str] = Counter()
        for word in _WORD.findall(text.lower()):
            if word in _STOP:
                continue
            counts["w:" + word] += 1
            padded = f"<{word}>"
            for at in range(len(padded) - 2):
                counts["g:" + padded[at : at + 3]] += 1
        vector = [0.0] * self.dims
        for feature, count in counts.items():
            weight = (_WORD_WEIGHT if feature[0] == "w" else _GRAM_WEIGHT) * (1.0 + math.log(count))
            hashed = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
            vector[hashed % self.dims] += -weight if hashed >> 63 else weight
        return _normalised(vector)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        return [self.vector(text) for text in texts]


class OpenAIEmbedder:
    """Embeddings from the OpenAI API (or a server speaking it) through the official SDK's ``embeddings.create``."""

    def __init__(
        self,
        *,
        model: str = "text-embedding-3-small",
        dims: int = 1536,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 2,
    ) -> None:
        from openai import AsyncOpenAI  # the SDK only when this embedder is configured

        self.model = model
        self.dims = dims
        self._client = AsyncOpenAI(
            api_key=api_key or "unset", base_url=base_url or None, timeout=timeout_s, max_retries=max_retries
        )

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
        await self._client.close()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order, asked for in batches."""
        import openai

        out: list[list[float]] = []
        for at in range(0, len(texts), _OPENAI_BATCH):
            batch = list(texts[at : at + _OPENAI_BATCH])
            try:
                if self.model.startswith("text-embedding-3"):
                    response = await self._client.embeddings.create(
                        model=self.model, input=batch, dimensions=self.dims, encoding_format="float"
                    )
                else:
                    response = await self._client.embeddings.create(
                        model=self.model, input=batch, encoding_format="float"
                    )
            except (openai.OpenAIError, ValueError) as error:  # ValueError: an answer that is not JSON
                logger.warning("embeddings request failed: %s", type(error).__name__)
                raise EmbeddingError(f"the embeddings API failed ({type(error).__name__})") from error
            out.extend(_vectors(getattr(response, "data", None), len(batch), self.dims))
        return out


def _vectors(rows: object, count: int, dims: int) -> list[list[float]]:
    """The ``count`` vectors of an embeddings answer in input order; :class:`EmbeddingError` for anything else.

    The SDK does not check the answer's shape, so a server can send anything: each row must have its own index and
    ``dims`` finite numbers (a NaN or an infinity would be stored and cached, and poison every search).
    """
    wrong = EmbeddingError(f"the embeddings API answered other than {count} vectors of {dims} finite numbers")
    if not isinstance(rows, list) or len(rows) != count:
        raise wrong
    found: dict[int, list[float]] = {}
    for row in rows:
        index, vector = getattr(row, "index", None), getattr(row, "embedding", None)
        if type(index) is not int or not 0 <= index < count or index in found:
            raise wrong
        if not isinstance(vector, list) or len(vector) != dims:
            raise wrong
        if not all(type(value) in (int, float) and math.isfinite(value) for value in vector):
            raise wrong
        found[index] = [float(value) for value in vector]
    return [found[index] for index in range(count)]


class CachedEmbedder:
    """An :class:`Embedder` whose vectors are kept in ``tenant``'s memory store by content hash."""

    def __init__(self, inner: Embedder, store: EmbeddingCache, tenant: str) -> None:
        self.inner = inner
        self.store = store
        self.tenant = tenant
        self.model = inner.model
        self.dims = inner.dims

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order: from the cache, else from the inner embedder (then cached)."""
        if not texts:
            return []
        keys = [digest(self.model, text) for text in texts]
        found = await self.store.cached_embeddings(self.tenant, self.model, list(dict.fromkeys(keys)))
        missing = list(dict.fromkeys(key for key in keys if key not in found))
        if missing:
            first = {key: text for key, text in zip(keys, texts, strict=True)}
            vectors = await self.inner.embed([first[key] for key in missing])
            fresh = {key: array("f", vector).tolist() for key, vector in zip(missing, vectors, strict=True)}
            await self.store.cache_embeddings(self.tenant, self.model, fresh)  # kept as float32, so given as such
            found = {**found, **fresh}
        return [list(found[key]) for key in keys]
