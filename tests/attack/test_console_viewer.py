"""A viewer (console role ``viewer``) tries every console read and the live stream for message text.

The held draft, the gated call's arguments and what they rest on are words; a viewer sees that an approval waits, for
which tool and under which rule, never its arguments or draft, in any of the routes that return approvals.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Final

import pytest
import redis.asyncio as aioredis

from switchboard.core.approvals.records import ApprovalRecord, ApprovalRequest, new_approval_id
from switchboard.queue.approvals import RedisApprovals
from switchboard.queue.lease import Lease
from switchboard.types import SessionKey
from switchboard.web.console import stream as console_stream
from tests.console.conftest import HASH, OPERATORS_CONFIG, Console, MakeConsole, make_console
from tests.console.conversation import conversation_ref, user_says

__all__ = ["make_console"]

SECRET_ARG: Final = "wire-to-IBAN-DE89370400440532013000"
SECRET_RESOURCE: Final = "customer-file-of-Mrs-Example"
SECRET_DRAFT: Final = "Dear Mrs Example, your diagnosis is"
SECRET_EVIDENCE: Final = "lookup said the balance is 9912"
VIEWER: Final = f"""
    - name: carol
      password_hash: "{HASH}"
      tenants: [default]
      role: viewer
"""


@pytest.fixture
async def console(base_env: dict[str, str], tmp_path: Path, make_console: MakeConsole) -> Console:
    config = tmp_path / "viewer.yaml"
    config.write_text(OPERATORS_CONFIG.rstrip("\n") + VIEWER)
    return await make_console({**base_env, "SWITCHBOARD_CONFIG": str(config)})


async def _open(redis: aioredis.Redis, session: SessionKey, **fields: object) -> None:
    now = time.time()
    record = ApprovalRecord.model_validate(
        {
            "id": new_approval_id(),
            "session": session,
            "tenant": "default",
            "agent": "assistant",
            "channel": "telegram",
            "run_id": "run-1",
            "requested_by": "telegram:42",
            "requested_at": now,
            "expires_at": now + 3600,
            "state_sha256": "cd" * 32,
            "approvers": ("operators",),
            **fields,
        }
    )
    lease = await Lease(redis, worker_id="test-worker", lease_ms=60_000).acquire(session)
    assert lease is not None
    try:
        await RedisApprovals(redis, session, lease.token, lease.epoch).approval_open(record)
    finally:
        await Lease(redis, worker_id="test-worker", lease_ms=60_000).abandon(lease)


@pytest.fixture
async def session(async_redis: aioredis.Redis) -> SessionKey:
    key = await user_says(async_redis, conversation_ref(), "hello", "evt-v1")
    request = ApprovalRequest(
        tool="pay",
        arguments={"to": SECRET_ARG, "amount": 250},
        action_sha256="ab" * 32,
        idempotency_key="k1",
        resources=(SECRET_RESOURCE,),
        reason="payments need an operator",
        rule="payments",
        policy_version="v1",
    )
    await _open(async_redis, key, request=request)
    await _open(async_redis, key, kind="reply", draft=SECRET_DRAFT, evidence=(SECRET_EVIDENCE,))
    return key


SECRETS: Final = (SECRET_ARG, SECRET_RESOURCE, SECRET_DRAFT, SECRET_EVIDENCE)


async def test_a_viewer_reads_no_approvals_words_on_any_route(console: Console, session: SessionKey) -> None:
    assert (await console.login("carol")).status == 200
    reads = {
        "approvals": {},
        "transcript": {"session": session},
        "timeline": {"session": session},
        "sessions": {},
        "dead-letters": {},
        "effects": {},
    }
    for route, params in reads.items():
        resp = await console.client.get(f"/console/api/{route}", params=params)
        assert resp.status == 200, (route, await resp.text())
        text = await resp.text()
        for secret in SECRETS:
            assert secret not in text, (route, secret)
    approvals = (await (await console.client.get("/console/api/approvals")).json())["approvals"]
    assert sorted(a["tool"] for a in approvals) == ["pay", "reply"]  # that they wait stays visible
    assert all(a["redacted"] for a in approvals)
    # an operator who reads messages still sees them all
    assert (await console.login("alice")).status == 200
    text = await (await console.client.get("/console/api/approvals")).text()
    assert all(secret in text for secret in SECRETS)


async def test_a_viewers_stream_carries_no_approvals_words(console: Console, session: SessionKey) -> None:
    assert (await console.login("carol")).status == 200
    resp = await console.client.get("/console/api/stream", params={"session": session})
    assert resp.status == 200
    seen = b""
    try:
        while b"event: transcript" not in seen or not seen.endswith(b"\n\n"):
            seen += await asyncio.wait_for(resp.content.readany(), 5)
    finally:
        resp.close()
    assert b'"redacted":true' in seen
    for secret in SECRETS:
        assert secret.encode() not in seen, secret


async def test_reloading_the_console_never_runs_out_of_streams(console: Console) -> None:
    """Each reload closes its stream and opens one: a closed one is let go at once, not at its next write."""
    assert (await console.login("carol")).status == 200
    for reload in range(2 * console_stream.MAX_STREAMS_PER_OPERATOR):
        resp = await console.client.get("/console/api/stream")
        assert resp.status == 200, f"reload {reload}: {resp.status}"
        await asyncio.wait_for(resp.content.readuntil(b"event: sessions"), 5)
        resp.close()  # the browser leaves the page
        await asyncio.sleep(0.3 * console_stream.TICK_S)
