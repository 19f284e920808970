"""The fake OpenAI Responses API of the provider tests, served over HTTP for native compaction."""

from tests.providers.conftest import fake_openai, openai_url

__all__ = ["fake_openai", "openai_url"]
