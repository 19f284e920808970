"""Model providers behind the :class:`~switchboard.core.model.ModelAdapter` Protocol, and their factory.

A model spec is ``offline`` or ``provider:name`` (``openai:gpt-4.1-mini``, ``anthropic:claude-sonnet-4-5``).
:class:`ModelFactory` keeps one adapter per provider for the life of the process, so HTTP connection
pools are reused across turns; the model name travels in each request. Provider SDKs are imported
only when their provider is first used: the offline model needs neither.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from switchboard.core.model import ModelAdapter
from switchboard.errors import ConfigError

__all__ = ["PROVIDERS", "ModelFactory", "ProviderConfig", "model_name", "parse_model_spec"]

logger = logging.getLogger(__name__)

PROVIDERS = ("offline", "openai", "anthropic")


@dataclass(frozen=True)
class ProviderConfig:
    """Provider credentials and endpoints, read once from the settings."""

    openai_api_key: str | None = None
    openai_base_url: str | None = None
    openai_wire_api: Literal["responses", "chat"] = "responses"
    anthropic_api_key: str | None = None
    anthropic_base_url: str | None = None
    offline_delay_ms: int = 0

    def __repr__(self) -> str:  # keys must never reach a log line
        return (
            f"ProviderConfig(openai_api_key={'***' if self.openai_api_key else None}, "
            f"openai_base_url={self.openai_base_url!r}, openai_wire_api={self.openai_wire_api!r}, "
            f"anthropic_api_key={'***' if self.anthropic_api_key else None}, "
            f"anthropic_base_url={self.anthropic_base_url!r}, offline_delay_ms={self.offline_delay_ms})"
        )


def parse_model_spec(spec: str) -> tuple[str, str]:
    """Split ``provider:name`` into its parts (``offline`` alone is ``("offline", "offline")``).

    Raises:
        ConfigError: unknown provider, or a provider without a model name; the message says how to fix it.
    """
    provider, _, name = spec.strip().partition(":")
    provider = provider.lower()
    if provider not in PROVIDERS:
        raise ConfigError(
            f"unknown model provider {provider!r} in {spec!r}: use offline, openai:<model> or anthropic:<model> "
            "(set SWITCHBOARD_MODEL or the agent's `model:`)",
            field="model",
        )
    if provider == "offline":
        return provider, name or "offline"
    if not name:
        raise ConfigError(f"model spec {spec!r} names no model: write {provider}:<model name>", field="model")
    return provider, name


def model_name(spec: str) -> str:
    """The provider's own model name in a spec (what goes into ``ModelRequest.model``)."""
    return parse_model_spec(spec)[1]


class ModelFactory:
    """Adapters by model spec, one per provider, created on first use and closed together."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._adapters: dict[str, ModelAdapter] = {}

    def get(self, spec: str) -> ModelAdapter:
        """The adapter serving ``spec`` (cached).

        Raises:
            ConfigError: unknown provider or malformed spec.
        """
        provider, _ = parse_model_spec(spec)
        adapter = self._adapters.get(provider)
        if adapter is None:
            adapter = self._adapters[provider] = self._create(provider)
        return adapter

    def override(self, provider: str, adapter: ModelAdapter) -> None:
        """Serve every spec of ``provider`` with ``adapter`` (replayed runs, tests, custom adapters)."""
        if provider not in PROVIDERS:
            raise ConfigError(f"unknown model provider {provider!r}: use one of {', '.join(PROVIDERS)}", field="model")
        self._adapters[provider] = adapter

    def _create(self, provider: str) -> ModelAdapter:
        config = self.config
        if provider == "offline":
            from switchboard.core.providers.offline import OfflineModel

            return OfflineModel(delay_ms=config.offline_delay_ms)
        if provider == "openai":
            from switchboard.core.providers.openai import OpenAIModel

            return OpenAIModel(
                api_key=config.openai_api_key, base_url=config.openai_base_url, wire_api=config.openai_wire_api
            )
        from switchboard.core.providers.anthropic import AnthropicModel

        return AnthropicModel(api_key=config.anthropic_api_key, base_url=config.anthropic_base_url)

    async def aclose(self) -> None:
        """Close every adapter's connection pool."""
        adapters, self._adapters = list(self._adapters.values()), {}
        for adapter in adapters:
            try:
                await adapter.aclose()
            except Exception:  # closing must not hide the others
                logger.exception("closing the %s adapter failed", getattr(adapter, "provider", "?"))
