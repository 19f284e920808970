"""The ingest router on real Redis: agent and tenant routing, unknown accounts, all-or-nothing, busy policy."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from switchboard.channels.base import Inbound, RawRequest
from switchboard.channels.registry import build_channels
from switchboard.channels.slack.fake.payloads import make_event, sign_request
from switchboard.channels.telegram.fake.updates import make_update
from switchboard.channels.web.adapter import WebChannel
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.errors import ConfigError, QueueUnavailableError
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.router import IngestRouter, resolve_route
from switchboard.settings import FileConfig, load_settings
from switchboard.types import SessionKey
from switchboard.web.metrics import Metrics

CONFIG = """
default_agent: assistant
tenant: home
agents:
  assistant: {profile: {name: A}, instructions: Be brief.}
  support: {profile: {name: S}, instructions: Help., busy_policy: collect}
  sales: {profile: {name: S}, instructions: Sell., busy_policy: steer}
channels:
  telegram:
    agent: support
    tenant: acme
    busy_policy: interrupt
    accounts:
      shop: {agent: sales, tenant: shop-co, busy_policy: sequential}
      plain: {agent: sales}
  slack:
    agent: sales
"""
ACCOUNTS = [
    ("telegram", "default"),
    ("telegram", "shop"),
    ("telegram", "plain"),
    ("slack", "default"),
    ("web", "default"),
]


def _config(tmp_path: Path, text: str = CONFIG) -> FileConfig:
    path = tmp_path / "switchboard.yaml"
    path.write_text(text)
    return load_settings({"SWITCHBOARD_CONFIG": str(path)}).file


def _message(
    channel: str, account: str, conversation: str = "c1", dedup: str = "e1", agent: str = ""
) -> InboundMessage:
    return InboundMessage(
        dedup_key=dedup,
        conversation=ConversationRef(agent=agent, channel=channel, account=account, conversation=conversation),  # type: ignore[arg-type]
        sender=Sender(id="u1"),
        text="hi",
    )


def _router(
    async_redis: aioredis.Redis, config: FileConfig, metrics: Metrics | None = None, **env: str
) -> IngestRouter:
    settings = load_settings({"SWITCHBOARD_QUEUE__INGEST_TIMEOUT_S": "0.5", **env})
    return IngestRouter(Ingestor(async_redis, settings.queue, settings.limits), config, ACCOUNTS, metrics)


def _queued(sync_redis: redis.Redis, session: str) -> int:
    return int(sync_redis.llen(SessionKeys(SessionKey(session)).inbox))


def _dedup_keys(sync_redis: redis.Redis, keys: SessionKeys) -> list[str]:
    """The dedup keys of the session's queued messages, in queue order."""
    records = [sync_redis.hget(keys.messages, i) for i in sync_redis.lrange(keys.inbox, 0, -1)]
    return [str(json.loads(r)["dedup_key"]) for r in records if isinstance(r, bytes)]


def _policy(sync_redis: redis.Redis, session: str) -> str:
    value = sync_redis.hget(SessionKeys(SessionKey(session)).meta, "busy_policy")
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.parametrize(
    ("channel", "account", "session", "policy"),
    [
        # the account's agent, tenant and policy win over the channel's ...
        ("telegram", "shop", "shop-co/sales/telegram/shop/c1", "sequential"),
        # ... an account without its own takes the channel's tenant and policy, with its own agent ...
        ("telegram", "plain", "acme/sales/telegram/plain/c1", "interrupt"),
        ("telegram", "default", "acme/support/telegram/default/c1", "interrupt"),
        # ... and a channel without a policy takes its agent's; without a tenant, the file's.
        ("slack", "default", "home/sales/slack/default/c1", "steer"),
    ],
)
async def test_messages_are_routed_to_their_accounts_agent_tenant_and_busy_policy(
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    tmp_path: Path,
    channel: str,
    account: str,
    session: str,
    policy: str,
) -> None:
    router = _router(async_redis, _config(tmp_path))
    result = await router.ingest(_message(channel, account))
    assert result is not None and not result.duplicate
    assert _queued(sync_redis, session) == 1
    assert _policy(sync_redis, session) == policy


async def test_a_web_session_keeps_the_agent_it_chose_and_takes_the_channel_or_agent_policy(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    router = _router(async_redis, _config(tmp_path))
    chosen = _message("web", "default", agent="support").model_copy(
        update={"conversation": ConversationRef(tenant="t0", agent="support", channel="web", conversation="s1")}
    )
    await router.ingest(chosen)
    assert _queued(sync_redis, "t0/support/web/default/s1") == 1
    assert _policy(sync_redis, "t0/support/web/default/s1") == "collect"  # support's own policy


async def test_a_message_for_an_unknown_account_is_dropped_with_a_warning_and_a_metric(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics(["telegram"])
    router = _router(async_redis, _config(tmp_path), metrics)
    before = sorted(sync_redis.keys("*"))
    inbound = Inbound(messages=(_message("telegram", "ghost"),))
    answer = await router.accept(WebChannel(None), inbound)
    assert answer == inbound.answer  # acknowledged: the platform must not retry it for ever
    assert sorted(sync_redis.keys("*")) == before
    assert any("ghost" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    rendered = metrics.render(None, None).decode()
    assert 'switchboard_requests_rejected_total{channel="telegram",reason="unknown_account"} 1.0' in rendered


_NO_SENDER_LIMIT = {"SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE": "0"}
"""The per-sender limit takes its token in a round trip of its own before the ingest scripts (issue #26): while Redis
holds writes back, nothing after it is sent. Tests of what the ingest scripts do in a stall turn it off."""


@pytest.mark.parametrize("sender_limit", [False, True])
async def test_every_message_of_a_request_is_accepted_or_it_is_refused_and_the_retry_is_safe(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path, sender_limit: bool
) -> None:
    metrics = Metrics(["telegram"])
    router = _router(async_redis, _config(tmp_path), metrics, **({} if sender_limit else _NO_SENDER_LIMIT))
    first, second = _message("telegram", "default", dedup="e1"), _message("telegram", "default", dedup="e2")
    await router.accept(WebChannel(None), Inbound(messages=(first,)))  # an earlier attempt got this far
    both = Inbound(messages=(first, second))
    sync_redis.execute_command("CLIENT", "PAUSE", "2000", "WRITE")
    try:
        with pytest.raises(QueueUnavailableError):
            await router.accept(WebChannel(None), both)
    finally:
        sync_redis.execute_command("CLIENT", "UNPAUSE")
    await asyncio.sleep(0.1)  # let the timed-out scripts finish before the retry
    await router.accept(WebChannel(None), both)  # the platform's retry
    session = "acme/support/telegram/default/c1"
    assert _queued(sync_redis, session) == 2  # each once
    # Without a sender limit the second went in the same write as the first (a duplicate, so it landed): the retry
    # finds both. With one, the stall held the sender meter's step, so nothing was sent: the retry accepts the second.
    rendered = metrics.render(None, None).decode()
    accepted, deduplicated = ("2.0", "1.0") if sender_limit else ("1.0", "2.0")
    assert f'switchboard_messages_accepted_total{{channel="telegram"}} {accepted}' in rendered
    assert f'switchboard_messages_deduplicated_total{{channel="telegram"}} {deduplicated}' in rendered
    assert 'reason="queue_unavailable"} 1.0' in rendered


async def test_one_deliverys_messages_are_sent_together_each_sessions_in_order(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    """A delivery's scripts are all handed over before the first is confirmed: while Redis holds writes back, they are
    already on their way (one by one, each would wait for the previous answer). A session's second message goes in
    the same write, after its first (Redis runs one write's scripts in order)."""
    metrics = Metrics(["telegram"])
    router = _router(async_redis, _config(tmp_path), metrics, **_NO_SENDER_LIMIT)
    five = tuple(_message("telegram", "default", conversation=f"c{i}", dedup=f"m{i}") for i in range(5))
    later = _message("telegram", "default", conversation="c0", dedup="m5")  # c0's second message
    ghost = _message("telegram", "ghost", dedup="g1")  # an unknown account's message is dropped as one by one
    delivery = Inbound(messages=(five[0], ghost, *five[1:], later))
    sync_redis.execute_command("CLIENT", "PAUSE", "1000", "WRITE")
    try:
        with pytest.raises(QueueUnavailableError):
            await router.accept(WebChannel(None), delivery)
    finally:
        sync_redis.execute_command("CLIENT", "UNPAUSE")
    await asyncio.sleep(0.2)  # the timed-out scripts land now
    sessions = [f"acme/support/telegram/default/c{i}" for i in range(5)]
    assert [_queued(sync_redis, s) for s in sessions] == [2, 1, 1, 1, 1]  # all sent, though none was confirmed
    first = SessionKeys(SessionKey(sessions[0]))
    assert _dedup_keys(sync_redis, first) == ["m0", "m5"]  # in the delivery's order
    answer = await router.accept(WebChannel(None), delivery)  # the retry
    assert answer == delivery.answer and _dedup_keys(sync_redis, first) == ["m0", "m5"]
    rendered = metrics.render(None, None).decode()
    assert 'switchboard_messages_deduplicated_total{channel="telegram"} 6.0' in rendered
    assert 'switchboard_messages_accepted_total{channel="telegram"}' not in rendered
    assert 'reason="unknown_account"} 2.0' in rendered  # dropped and counted on each attempt, as one by one


async def test_a_sessions_later_message_never_lands_when_an_earlier_one_in_the_same_write_failed(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    """The second message's script fails (its dedup key holds the wrong type); the third, sent in the same write,
    is guarded by the second's dedup key and writes nothing. The first is stored and counted as accepted."""
    metrics = Metrics(["telegram"])
    router = _router(async_redis, _config(tmp_path), metrics)
    session = SessionKeys(SessionKey("acme/support/telegram/default/c1"))
    sync_redis.hset(session.dedup("f1"), "not", "a string")  # GET on it is an error reply: that script fails
    delivery = Inbound(messages=tuple(_message("telegram", "default", dedup=f"f{i}") for i in range(3)))
    with pytest.raises(QueueUnavailableError):
        await router.accept(WebChannel(None), delivery)
    await asyncio.sleep(0.1)
    assert _dedup_keys(sync_redis, session) == ["f0"]  # the third never landed after the failed second
    assert not sync_redis.exists(session.dedup("f2"))
    rendered = metrics.render(None, None).decode()
    assert 'switchboard_messages_accepted_total{channel="telegram"} 1.0' in rendered
    assert 'reason="queue_unavailable"} 1.0' in rendered
    sync_redis.delete(session.dedup("f1"))  # the fault clears: the platform's retry stores the rest, in order
    await router.accept(WebChannel(None), delivery)
    assert _dedup_keys(sync_redis, session) == ["f0", "f1", "f2"]


async def test_a_message_after_one_refused_by_a_limit_is_sent_on_its_own_as_one_by_one(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    """With an inbox depth of 2: the first two land, the third is refused (inbox full), so the fourth, guarded by the
    third's dedup key, is not written in that write; it is then sent on its own and refused as one by one would be."""
    metrics = Metrics(["telegram"])
    router = _router(async_redis, _config(tmp_path), metrics, SWITCHBOARD_LIMITS__INBOX_DEPTH="2")
    session = SessionKeys(SessionKey("acme/support/telegram/default/c1"))
    delivery = Inbound(messages=tuple(_message("telegram", "default", dedup=f"d{i}") for i in range(4)))
    await router.accept(WebChannel(None), delivery)  # acknowledged: a platform's refusal would only be retried
    assert _dedup_keys(sync_redis, session) == ["d0", "d1"]
    dropped = [e for _id, e in sync_redis.xrange(session.events) if e[b"kind"] == b"message_dropped"]
    assert len(dropped) == 2  # the third and the fourth, each refused by the limit (the fourth on its own)
    rendered = metrics.render(None, None).decode()
    assert 'reason="rate_limited"} 2.0' in rendered
    sync_redis.delete(session.inbox)  # room again: now the fourth gets in (its refusal wrote no dedup record)
    await router.accept(WebChannel(None), Inbound(messages=(delivery.messages[3],)))
    assert sync_redis.exists(session.dedup("d3"))


async def test_a_stop_in_a_delivery_is_confirmed_and_requested_before_the_messages_after_it(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    router = _router(async_redis, _config(tmp_path))
    first, last = _message("telegram", "default", dedup="s1"), _message("telegram", "default", dedup="s3")
    stop = _message("telegram", "default", dedup="s2").model_copy(update={"text": "/stop"})
    session = SessionKeys(SessionKey("acme/support/telegram/default/c1"))
    pubsub = async_redis.pubsub()
    await pubsub.ssubscribe(session.shard.cancel)
    await pubsub.get_message(timeout=1.0)  # the subscription's confirmation
    await router.accept(WebChannel(None), Inbound(messages=(first, stop, last)))
    assert _queued(sync_redis, str(session.session)) == 3
    heard = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
    assert heard is not None and heard["data"] == str(session.session).encode()
    assert sync_redis.exists(session.cancel)
    await pubsub.aclose()


async def test_an_emit_hands_a_listeners_messages_to_the_same_routing(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    router = _router(async_redis, _config(tmp_path))
    emit = router.emit_for(WebChannel(None))
    await emit(Inbound(messages=(_message("telegram", "shop", conversation="c9"),)))
    assert _queued(sync_redis, "shop-co/sales/telegram/shop/c9") == 1


def test_a_route_to_an_unknown_agent_is_a_config_error_naming_the_place(tmp_path: Path) -> None:
    config = _config(tmp_path, CONFIG.replace("agent: sales, tenant: shop-co", "agent: ghost, tenant: shop-co"))
    with pytest.raises(ConfigError, match=r"channels\.telegram\.accounts\.shop: unknown agent 'ghost'"):
        resolve_route(config, "telegram", "shop")
    assert resolve_route(config, "telegram", "plain").agent == "sales"


@pytest.mark.parametrize(
    ("channel", "agent", "tenant", "policy"),
    [("telegram", "support", "acme", "interrupt"), ("slack", "sales", "home", "steer")],
)
async def test_adapters_build_their_drafts_already_routed_and_the_router_takes_them_without_a_copy(
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    tmp_path: Path,
    channel: str,
    agent: str,
    tenant: str,
    policy: str,
) -> None:
    path = tmp_path / "switchboard.yaml"
    path.write_text(CONFIG)
    settings = load_settings(
        {
            "SWITCHBOARD_CONFIG": str(path),
            "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:test",
            "SWITCHBOARD_SLACK__BOT_TOKEN": "xoxb-test",
            "SWITCHBOARD_SLACK__SIGNING_SECRET": "s3cret",
        }
    )
    adapters = build_channels(settings, publish=None)
    adapter = adapters[(channel, "default")]
    if channel == "telegram":
        body, headers = json.dumps(make_update("hello", chat_id=7, update_id=1)).encode(), {}
    else:
        body, headers = sign_request(make_event("hello", channel="D0SEVEN"), "s3cret")
    try:
        inbound = await adapter.receive(RawRequest("POST", f"/webhooks/{channel}", headers, {}, body))
    finally:
        for built in adapters.values():
            await built.aclose()
    (draft,) = inbound.messages
    assert (draft.conversation.agent, draft.conversation.tenant) == (agent, tenant)
    router = _router(async_redis, settings.file)
    routed = router.route(draft)
    assert routed is not None and routed[0] is draft and routed[1] == policy
    await router.accept(adapter, inbound)
    assert _queued(sync_redis, draft.session_key) == 1 and draft.session_key.startswith(f"{tenant}/{agent}/")
    assert _policy(sync_redis, draft.session_key) == policy


async def test_text_that_cannot_be_stored_is_refused_as_malformed_before_anything_is_written(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    from switchboard.errors import MalformedBodyError

    router = _router(async_redis, _config(tmp_path))
    broken = _message("telegram", "default", dedup="e2").model_copy(update={"text": "half an emoji \ud83d"})
    before = sorted(sync_redis.keys("*"))
    with pytest.raises(MalformedBodyError):
        await router.accept(WebChannel(None), Inbound(messages=(broken,)))
    assert sorted(sync_redis.keys("*")) == before
