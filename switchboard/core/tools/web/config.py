"""An agent's ``search:`` and ``images:`` blocks: which provider serves ``web_search`` and ``generate_image``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["SEARCH_ENDPOINTS", "ImageGeneration", "SearchProviderName", "WebSearch"]

SearchProviderName = Literal["hosted", "brave", "tavily", "searxng"]

SEARCH_ENDPOINTS: dict[str, str] = {
    "brave": "https://api.search.brave.com/res/v1/web/search",
    "tavily": "https://api.tavily.com/search",
}
"""Each search API's documented endpoint, used when the block gives no ``url`` (SearXNG is always self-hosted)."""


class WebSearch(BaseModel):
    """How ``web_search`` searches for one agent.

    ```yaml
    agents:
      researcher:
        tools: [web_search]
        search: {provider: brave, api_key_secret: BRAVE_KEY, max_results: 5}
        egress:
          allow: [api.search.brave.com]
          secrets: {BRAVE_KEY: {env: BRAVE_SEARCH_API_KEY, domains: [api.search.brave.com]}}
    ```
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: SearchProviderName = "hosted"
    """``hosted``: the model provider's own search (OpenAI's Responses API); ``brave``, ``tavily`` or ``searxng``: that
    search API, called through the agent's egress policy."""
    url: str | None = None
    """The API's endpoint (required for ``searxng``: the instance's ``/search`` URL; the others default to theirs)."""
    api_key_secret: str | None = None
    """The name of an egress secret (``agents.<name>.egress.secrets``) holding the API key; egress puts it in the
    request, so the key never enters the process's tool code or the model's context."""
    max_results: int = Field(5, ge=1, le=10)
    """Most results a search returns to the model."""

    @model_validator(mode="after")
    def _complete(self) -> WebSearch:
        if self.provider in ("brave", "tavily") and not self.api_key_secret:
            raise ValueError(f"search provider {self.provider} needs api_key_secret (the name of an egress secret)")
        if self.provider == "searxng" and not self.url:
            raise ValueError("search provider searxng needs url (the instance's /search endpoint)")
        if self.url is not None and not self.url.startswith(("https://", "http://")):
            raise ValueError(f"search url {self.url!r} must be an http(s) URL")
        return self

    @property
    def endpoint(self) -> str:
        """Where a search API request goes (empty for ``hosted``)."""
        return self.url or SEARCH_ENDPOINTS.get(self.provider, "")


class ImageGeneration(BaseModel):
    """How ``generate_image`` draws for one agent (``images: {model: gpt-image-1, size: 1024x1024}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["openai"] = "openai"
    """OpenAI's Images API (``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``, like the chat models)."""
    model: str = "gpt-image-1"
    size: Literal["auto", "1024x1024", "1024x1536", "1536x1024"] = "1024x1024"
    quality: Literal["auto", "low", "medium", "high"] = "auto"
    format: Literal["jpeg", "png", "webp"] = "jpeg"
    """The file type asked of the GPT image models (DALL·E always answers PNG). JPEG is the one every channel shows
    as a photo, and small enough for the web chat's inline files."""
    compression: int = Field(80, ge=0, le=100)
    """JPEG or WebP quality, 0-100 (GPT image models)."""
    timeout_s: float = Field(120.0, gt=0, le=600)
