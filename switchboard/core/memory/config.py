"""The file's top-level ``memory:`` block: where facts are stored and how their embeddings are computed."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from switchboard.core.memory.embeddings import LOCAL_DIMS, LOCAL_MODEL, Embedder, LocalEmbedder, OpenAIEmbedder
from switchboard.errors import ConfigError

__all__ = ["EmbeddingsConfig", "MemoryConfig", "build_embedder"]

_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")


def _env_name(value: str) -> str:
    if value and not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name (upper case, digits, '_')")
    return value


class EmbeddingsConfig(BaseModel):
    """``memory.embeddings``: who turns memory text into vectors (``local`` needs no network)."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["local", "openai", "none"] = "local"
    """``local``: deterministic offline hashing; ``openai``: the embeddings API; ``none``: words only."""
    model: str = Field("", max_length=200)
    """The embeddings model (default: ``text-embedding-3-small`` for ``openai``)."""
    dims: int = Field(0, ge=0, le=8192)
    """Vector length (default: 384 local, 1536 openai)."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the API key (never the key itself)."""
    base_url: str = Field("", max_length=500)
    """An OpenAI-compatible server (default: OpenAI itself)."""

    @field_validator("api_key_env")
    @classmethod
    def _key_env_is_a_name(cls, value: str) -> str:
        return _env_name(value)

    @model_validator(mode="after")
    def _local_has_no_model(self) -> EmbeddingsConfig:
        if self.provider == "local" and self.model and self.model != LOCAL_MODEL:
            raise ValueError(f"memory.embeddings.model: the local embedder is {LOCAL_MODEL!r}; leave model unset")
        return self


class MemoryConfig(BaseModel):
    """``memory:``: the store of projects' facts and documents, and their embeddings."""

    model_config = ConfigDict(extra="forbid")

    store: Literal["sqlite", "postgres"] = "sqlite"
    """``sqlite``: one file per tenant under the data directory; ``postgres``: a server (``dsn_env``)."""
    dsn_env: str = ""
    """For ``postgres``: the environment variable holding its DSN (never the DSN itself)."""
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)

    @field_validator("dsn_env")
    @classmethod
    def _dsn_env_is_a_name(cls, value: str) -> str:
        return _env_name(value)

    @model_validator(mode="after")
    def _postgres_has_a_dsn(self) -> MemoryConfig:
        if self.store == "postgres" and not self.dsn_env:
            raise ValueError("memory.dsn_env: name the environment variable holding the PostgreSQL DSN")
        return self


def build_embedder(config: EmbeddingsConfig, environ: Mapping[str, str] | None = None) -> Embedder | None:
    """The embedder ``config`` describes (``None`` for ``provider: none``); :class:`ConfigError` when unusable."""
    env = os.environ if environ is None else environ
    if config.provider == "none":
        return None
    if config.provider == "local":
        return LocalEmbedder(config.dims or LOCAL_DIMS)
    if config.provider == "openai":
        key = env.get(config.api_key_env, "")
        if not key and not config.base_url:
            raise ConfigError(
                f"memory.embeddings: provider openai needs its key in {config.api_key_env}", field="memory.embeddings"
            )
        return OpenAIEmbedder(
            model=config.model or "text-embedding-3-small",
            dims=config.dims or 1536,
            api_key=key or None,
            base_url=config.base_url or None,
        )
    assert_never(config.provider)
