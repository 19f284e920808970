"""End to end with real worker processes (the offline model) and the fake Bot API: what the API queues is sent by a
worker through the outbox, an external event is answered once per Idempotency-Key, and the workers' facts reach a
real webhook receiver signed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.outbound.webhooks import SIGNATURE_HEADER, verify_signature
from switchboard.web.api.tokens import new_token, token_hash
from tests.chaos import conftest as chaos
from tests.chaos.harness import Gateway, WorkerPool, chaos_env, replies
from tests.conftest import MINIMAL_CONFIG
from tests.waiting import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]
fake, gateways, pools = chaos.fake, chaos.gateways, chaos.pools  # the chaos tests' fixtures: the same harness

TOKEN = new_token()
SECRET = "whsec_e2e"
CHAT = "5150"


@pytest.fixture
async def hooks() -> AsyncIterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    received: list[tuple[dict[str, str], bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        received.append((dict(request.headers), await request.read()))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hooks", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("/hooks")), received
    await server.close()


@pytest.fixture
def env(base_env: dict[str, str], fake: FakeTelegram, tmp_path: Path, hooks: tuple[str, list[Any]]) -> dict[str, str]:
    config = tmp_path / "e2e.yaml"
    config.write_text(
        f"""{MINIMAL_CONFIG}
api:
  tokens:
    - name: shop
      tenant: default
      scopes: [messages:send, turns:start, conversations:read, conversations:history]
      sha256: "{token_hash(TOKEN)}"
  webhooks:
    - tenant: default
      url: "{hooks[0]}"
      events: [message_received, reply_sent]
      secret_env: E2E_HOOK_SECRET
      allow_networks: [127.0.0.0/8]
"""
    )
    return chaos_env(base_env | {"SWITCHBOARD_CONFIG": str(config)}, fake.base_url) | {
        "E2E_HOOK_SECRET": SECRET,
        "SWITCHBOARD_WEBHOOKS__POLL_S": "0.1",
    }


async def test_send_turn_and_webhooks_through_real_workers(
    env: dict[str, str],
    fake: FakeTelegram,
    gateways: Callable[[dict[str, str]], Gateway],
    pools: Callable[[dict[str, str], int], WorkerPool],
    hooks: tuple[str, list[tuple[dict[str, str], bytes]]],
) -> None:
    gateway = gateways(env)
    url = await gateway.start()
    pool = pools(env, 1)
    await pool.ready()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    target = {"channel": "telegram", "conversation": CHAT}

    async with gateway.client.post(
        f"{url}/api/v1/messages", json={**target, "text": "Your order shipped today."}, headers=auth
    ) as resp:
        assert resp.status == 202
    await wait_until(lambda: any(r.text == "Your order shipped today." for r in replies(fake)), "the message sent")

    turn = {**target, "event": "order.delivered", "data": {"order": 7}}
    answers = []
    for _ in range(2):
        async with gateway.client.post(
            f"{url}/api/v1/turns", json=turn, headers={**auth, "Idempotency-Key": "delivery-7"}
        ) as resp:
            answers.append((resp.status, await resp.json()))
    assert answers[0] == answers[1] and answers[0][0] == 202
    await wait_until(lambda: any("order.delivered" in r.text for r in replies(fake)), "the event answered")
    await wait_until(lambda: sum(json.loads(b)["type"] == "reply_sent" for _, b in hooks[1]) >= 2, "two replies hooked")

    answered = [r for r in replies(fake) if "order.delivered" in r.text]
    assert len(answered) == 1 and str(answered[0].chat_id) == CHAT
    assert 'trust="untrusted"' in answered[0].text  # the offline model repeats what it read: the event, as data
    bodies = [json.loads(body) for _, body in hooks[1]]
    assert all(verify_signature(SECRET.encode(), h[SIGNATURE_HEADER], b) for h, b in hooks[1])
    assert {b["type"] for b in bodies} == {"message_received", "reply_sent"}
    assert len({b["id"] for b in bodies}) == len(bodies)
    async with gateway.client.get(f"{url}/api/v1/conversations/telegram/default/{CHAT}", headers=auth) as resp:
        state = await resp.json()
    assert state["exists"] and state["approvals"] == []
    assert any("order.delivered" in entry["text"] for entry in state["history"])
