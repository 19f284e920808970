"""The real application (``create_app``) with console operators in its YAML file, on the suite's real Redis."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from switchboard.settings import Settings, load_settings
from switchboard.web.app import create_app
from switchboard.web.console.passwords import hash_password

PASSWORD: Final = "correct horse battery staple"
HASH: Final = hash_password(PASSWORD)
"""One hash for the module: Argon2 is slow on purpose."""

OPERATORS_CONFIG: Final = f"""
default_agent: assistant
agents:
  assistant:
    profile: {{name: Assistant}}
    instructions: You are a test assistant.
    tools: [current_time]
console:
  operators:
    - name: alice
      password_hash: "{HASH}"
      tenants: [default]
    - name: bob
      password_hash: "{HASH}"
      tenants: [other]
    - name: proxied
      tenants: [default]
"""

MakeClient = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]


@dataclass
class Console:
    """A test client of the real app, signed in or not."""

    client: TestClient[Any, Any]
    settings: Settings
    csrf: str = ""

    async def login(self, name: str = "alice", password: str = PASSWORD, **kw: Any) -> ClientResponse:
        """Sign in; on success keep the CSRF token for later writes."""
        resp = await self.client.post("/console/login", json={"name": name, "password": password}, **kw)
        if resp.status == 200:
            self.csrf = (await resp.json())["csrf"]
        return resp

    async def write(self, path: str, body: Any, *, csrf: bool = True) -> ClientResponse:
        """POST ``body`` to ``/console/api/<path>`` with (or without) the CSRF token."""
        headers = {"X-CSRF-Token": self.csrf} if csrf else {}
        return await self.client.post(f"/console/api/{path}", json=body, headers=headers)


@pytest.fixture
def console_env(base_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """``base_env`` with operators alice (tenant default), bob (tenant other) and proxied (no password)."""
    config = tmp_path / "console.yaml"
    config.write_text(OPERATORS_CONFIG)
    return {**base_env, "SWITCHBOARD_CONFIG": str(config)}


MakeConsole = Callable[[dict[str, str]], Awaitable["Console"]]


@pytest.fixture
def make_console(aiohttp_client: MakeClient) -> MakeConsole:
    """Start the real app for an environment and return a console client of it."""

    async def make(env: dict[str, str]) -> Console:
        settings = load_settings(env)
        return Console(await aiohttp_client(create_app(settings, listeners=False)), settings)

    return make


@pytest.fixture
async def console(console_env: dict[str, str], make_console: Callable[[dict[str, str]], Awaitable[Console]]) -> Console:
    """The console of an app with the three operators; not signed in."""
    return await make_console(console_env)
