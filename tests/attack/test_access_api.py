"""Access control meets the integration API: the API's sends and turns are the operator's, not a chat user's.

The gate judges chat users by their principal; an API token is the tenant's own integration, already authorised by its
token and scopes. Judging it as a chat user would refuse it under ``allowlist`` and, under ``pairing``, issue a pairing
code to ``telegram:api:<token>`` and post the refusal (with that code) into the customer's conversation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.queue.keys import GlobalKeys
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.api.conftest import API_CONFIG, SENDER, STARTER, Api, MakeClient, api_env
from tests.api.test_api import SESSION, TG, queued

__all__ = ["api_env"]


@pytest.fixture(params=["allowlist", "pairing"])
async def private_api(
    request: pytest.FixtureRequest, api_env: dict[str, str], tmp_path: Path, aiohttp_client: MakeClient
) -> Api:
    config = tmp_path / "private.yaml"
    config.write_text(
        API_CONFIG.replace(
            "telegram: {send_rate: 0, chat_send_rate: 0}",
            f"telegram: {{send_rate: 0, chat_send_rate: 0, access: {{mode: {request.param}, allow: ['telegram:42']}}}}",
        )
    )
    settings = load_settings({**api_env, "SWITCHBOARD_CONFIG": str(config)})
    return Api(await aiohttp_client(create_app(settings, listeners=False)), settings)


async def test_an_api_send_and_turn_reach_a_private_bots_conversation(
    private_api: Api, async_redis: aioredis.Redis
) -> None:
    sent: Any = await private_api.call("POST", "/messages", SENDER, {**TG, "text": "Your parcel left."})
    turn: Any = await private_api.call(
        "POST", "/turns", STARTER, {**TG, "event": "order.shipped"}, {"Idempotency-Key": "k1"}
    )

    assert sent[0] == 202 and turn[0] == 202
    assert len(await queued(async_redis, SESSION)) == 2
    assert not await async_redis.zrange(GlobalKeys().access_requests("default"), 0, -1)  # no pairing code issued
