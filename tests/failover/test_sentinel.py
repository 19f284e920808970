"""``redis+sentinel://`` URLs, clients through Sentinel, and the ingest's wait for replicas (``ACK_REPLICAS``)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from switchboard.channels.telegram.fake.platform import make_update, sign_update
from switchboard.core.messages import session_key
from switchboard.errors import QueueUnavailableError
from switchboard.queue.coalescer import ReplicasUnconfirmedError
from switchboard.queue.connection import MultiplexedConnection, async_client, sync_client
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings, Settings
from switchboard.settings.sentinel import SentinelURL, parse_sentinel_url
from tests.chaos.harness import SECRET, Gateway, chaos_env, key_of
from tests.failover.servers import ReplicatedRedis
from tests.queue.conftest import make_message

pytestmark = [pytest.mark.failover, pytest.mark.timeout(60)]


def test_a_sentinel_url_names_its_sentinels_service_database_and_password() -> None:
    url = "redis+sentinel://:s%40cret@10.0.0.1:26379,[::1]:26380,sentinel-c:26381/mymaster/3?sentinel_password=sp"
    assert parse_sentinel_url(url) == SentinelURL(
        sentinels=(("10.0.0.1", 26379), ("::1", 26380), ("sentinel-c", 26381)),
        service="mymaster",
        db=3,
        password="s@cret",
        sentinel_password="sp",
    )
    assert parse_sentinel_url("redis+sentinel://h:1/svc").db == 0


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "/service_name"),
        ("redis+sentinel://h:26379/svc/zero", "database must be a number"),
        ("redis+sentinel://h/svc", "host:port"),
        ("redis+sentinel://h:99999/svc", "host:port"),
        ("redis+sentinel://:pw@h:1,:2/svc", "host:port"),
        ("redis+sentinel://h:1/svc/0/extra", "/service_name"),
        ("redis+sentinel://h:1/svc?timeout=3", "unknown option"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_at_start_up_with_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(redis_url=url)
    assert says in str(err.value) and "redis+sentinel://" in str(err.value)
    assert "pw" not in str(err.value).replace("password", "")


async def test_both_clients_reach_the_primary_the_sentinels_name(replicated: ReplicatedRedis) -> None:
    primary = replicated.primary()
    sync = sync_client(replicated.url)
    client = async_client(replicated.url)
    try:
        sync.set("via-sync", b"1")
        await client.set("via-async", b"2")
        with primary.client() as direct:
            assert direct.mget("via-sync", "via-async") == [b"1", b"2"]
            assert direct.info("replication")["role"] == "master"
        assert MultiplexedConnection.supports(client), "the hot path must stay multiplexed through Sentinel"
    finally:
        sync.close()
        await client.aclose()


def _replica(replicated: ReplicatedRedis) -> int:
    primary = replicated.primary()
    replica = next(n for n in replicated.data if n is not primary)
    assert replica.process is not None
    return replica.process.pid


@pytest.fixture
def frozen_replica(replicated: ReplicatedRedis) -> Callable[[], None]:
    """Freezes the replica on request (SIGSTOP); always thawed at teardown."""
    pid = _replica(replicated)
    frozen: list[int] = []

    def freeze() -> None:
        os.kill(pid, signal.SIGSTOP)
        frozen.append(pid)

    yield freeze  # type: ignore[misc]
    for p in frozen:
        os.kill(p, signal.SIGCONT)


async def test_with_ack_replicas_an_ingest_returns_only_once_the_replica_has_it(
    replicated: ReplicatedRedis, frozen_replica: Callable[[], None]
) -> None:
    client = async_client(replicated.url)
    settings = QueueSettings(ack_replicas=1, ack_timeout_ms=300)
    try:
        message = make_message("kept", dedup="acked-1")
        result = await Ingestor(client, settings).ingest(message)
        primary = replicated.primary()
        replica = next(n for n in replicated.data if n is not primary)
        session = session_key("default", "assistant", "telegram", "default", "c1")
        with replica.client() as direct:  # WAIT returned: the replica has the message already
            stored = direct.lrange(SessionKeys(session).inbox, 0, -1)
        assert stored == [result.message_id.encode()], "the replica did not have the message when ingest returned"

        frozen_replica()
        started = time.monotonic()
        with pytest.raises(QueueUnavailableError) as refused:
            await Ingestor(client, settings).ingest(make_message("not confirmed", dedup="acked-2"))
        assert isinstance(refused.value.__cause__, ReplicasUnconfirmedError)
        assert "0 of 1 replicas confirmed within 300 ms" in str(refused.value.__cause__)
        assert 0.25 <= time.monotonic() - started < 2.0
        # off (the default): the same frozen replica does not hold the answer back
        done = await Ingestor(client, QueueSettings()).ingest(make_message("unacked", dedup="acked-3"))
        assert not done.duplicate
    finally:
        await client.aclose()


async def test_a_webhook_unconfirmed_by_the_replicas_is_answered_503_with_retry_after_then_its_retry_is_taken_once(
    replicated: ReplicatedRedis, frozen_replica: Callable[[], None], base_env: dict[str, str]
) -> None:
    env = chaos_env(
        base_env | {"SWITCHBOARD_REDIS_URL": replicated.url},
        "http://127.0.0.1:9",
        QUEUE__ACK_REPLICAS="1",
        QUEUE__ACK_TIMEOUT_MS="300",
    )
    gateway = Gateway(env)
    await gateway.start()
    try:
        assert (await gateway.send(1, 0)).status == 200
        frozen_replica()
        body, headers = sign_update(make_update("s1-m1", chat_id=10_001, update_id=1_001_001), SECRET)
        async with gateway.client.post(f"{gateway.url}/webhooks/telegram", data=body, headers=headers) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
        os.kill(_replica(replicated), signal.SIGCONT)
        await asyncio.sleep(0.2)
        retried = await gateway.send(1, 1)  # Telegram's retry: the same update id
        assert retried.status == 200
        with replicated.primary().client() as direct:
            inbox = direct.lrange(SessionKeys(key_of(1)).inbox, 0, -1)
        assert len(inbox) == 2, "the message that got 503 and its retry must be queued once"
    finally:
        await gateway.close()
