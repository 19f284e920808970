"""Fixtures: the fake provider servers on 127.0.0.1, and adapters pointed at them."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from switchboard.core.model import ModelEvent, ModelRequest
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.openai_api import FakeOpenAI

ServerFactory = Callable[..., Awaitable[TestServer]]


@pytest.fixture
def fake_openai() -> FakeOpenAI:
    return FakeOpenAI()


@pytest.fixture
async def openai_url(fake_openai: FakeOpenAI, aiohttp_server: ServerFactory) -> AsyncIterator[str]:
    server = await aiohttp_server(fake_openai.app())
    yield str(server.make_url("/v1"))
    fake_openai.release()


@pytest.fixture
def fake_anthropic() -> FakeAnthropic:
    return FakeAnthropic()


@pytest.fixture
async def anthropic_url(fake_anthropic: FakeAnthropic, aiohttp_server: ServerFactory) -> AsyncIterator[str]:
    server = await aiohttp_server(fake_anthropic.app())
    yield str(server.make_url(""))
    fake_anthropic.release()


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


async def collect(stream: AsyncIterator[ModelEvent]) -> list[Any]:
    return [event async for event in stream]


def request(**overrides: Any) -> ModelRequest:
    values: dict[str, Any] = {
        "model": "test-model",
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "hi"}],
    }
    values.update(overrides)
    return ModelRequest.model_validate(values)
