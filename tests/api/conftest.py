"""The real app (``create_app``) with integration API tokens in its YAML file, on the suite's real Redis."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from switchboard.settings import Settings, load_settings
from switchboard.web.api.tokens import new_token, token_hash
from switchboard.web.app import create_app
from tests.conftest import MINIMAL_CONFIG

SENDER: Final = new_token()
"""messages:send only."""
STARTER: Final = new_token()
"""turns:start only."""
READER: Final = new_token()
"""conversations:read only (no history)."""
HISTORIAN: Final = new_token()
"""conversations:read and conversations:history."""
OTHER: Final = new_token()
"""Every scope, for tenant ``other``."""
ALL_SCOPES: Final = "[messages:send, turns:start, conversations:read, conversations:history]"

API_CONFIG: Final = f"""{MINIMAL_CONFIG}
channels:
  telegram: {{send_rate: 0, chat_send_rate: 0}}
  web: {{tenant: other}}
api:
  tokens:
    - {{name: crm, tenant: default, scopes: [messages:send], sha256: "{token_hash(SENDER)}"}}
    - {{name: shop, tenant: default, scopes: [turns:start], sha256: "{token_hash(STARTER)}"}}
    - {{name: dash, tenant: default, scopes: [conversations:read], sha256: "{token_hash(READER)}"}}
    - name: audit
      tenant: default
      scopes: [conversations:read, conversations:history]
      sha256: "{token_hash(HISTORIAN)}"
    - {{name: elsewhere, tenant: other, scopes: {ALL_SCOPES}, sha256: "{token_hash(OTHER)}"}}
"""

MakeClient = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]


@dataclass
class Api:
    """A client of the real app's integration API."""

    client: TestClient[Any, Any]
    settings: Settings

    async def call(
        self, method: str, path: str, token: str | None, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        kwargs: dict[str, Any] = {"headers": sent}
        if isinstance(body, bytes):
            kwargs["data"] = body
        elif body is not None:
            kwargs["json"] = body
        async with self.client.request(method, f"/api/v1{path}", **kwargs) as resp:
            return resp.status, (await resp.json() if resp.content_type == "application/json" else await resp.text())


@pytest.fixture
def api_env(base_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """``base_env`` with the tokens above, Telegram (tenant default, a fake token) and the web chat (tenant other)."""
    config = tmp_path / "api.yaml"
    config.write_text(API_CONFIG)
    return {
        **base_env,
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:api",
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": "http://127.0.0.1:9",
    }


@pytest.fixture
async def api(api_env: dict[str, str], aiohttp_client: MakeClient) -> Api:
    settings = load_settings(api_env)
    return Api(await aiohttp_client(create_app(settings, listeners=False)), settings)
