"""The gateway on the test cluster under load: Telegram and web chat senders, and what their messages came to.

The real web tier in the test's loop and real ``switchboard worker`` processes (:mod:`tests.chaos.harness`), with
``SWITCHBOARD_REDIS_URL=redis+cluster://…`` naming every live node of a :class:`~tests.cluster.servers.LocalCluster`;
the offline model, the fake Bot API, signed webhooks. :class:`Traffic` posts ``MESSAGES`` messages on each of
``SESSIONS`` Telegram chats and ``WEB_SESSIONS`` web chat sessions, one after another per session, a non-2xx answer
posted again (as Telegram and the web chat's client do); it sets :attr:`Traffic.halfway` once ``disrupt_after``
messages are acknowledged, for the test to disrupt the cluster or the workers then. :func:`finish` waits for every
acknowledged message's reply and checks the history with :func:`tests.chaos.checker.check`, the web chat's replies
by their ``reply_to`` (as :mod:`tests.failover.test_failover` does on one primary). Issue #26.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.shards import shard_of
from switchboard.queue.stats import read_stats
from switchboard.types import SessionKey
from switchboard.web.webchat.access import hash_token
from tests.chaos.checker import Report, check
from tests.chaos.harness import Gateway, WorkerPool, collect, key_of, replies, text
from tests.cluster.servers import LocalCluster

__all__ = ["Outcome", "Traffic", "WebOutcome", "cluster_url", "finish", "session_shards", "workers_ready"]

SESSIONS = 12
WEB_SESSIONS = 4
MESSAGES = 20
PACE_S = 0.04
"""A sender's pause between one message's 2xx and its next message."""
RETRY_S = 0.25
"""A sender's wait before posting a message again after a non-2xx answer."""
REFUSED_FOR_S = 12.0
"""A sender refused this long without a break gives up (a failover takes ~2 s here): the test fails with the status."""
ANSWERED_WITHIN_S = 25.0
CROSS_SLOT = ("same key slot", "CROSSSLOT", "RedisClusterException")
"""What a worker's log says when a command or script crosses slots on the cluster."""


def cluster_url(cluster: LocalCluster) -> str:
    """``redis+cluster://`` naming every live node (any one that answers is enough to start)."""
    return "redis+cluster://" + ",".join(f"{host}:{port}" for host, port in cluster.startup_nodes)


def session_shards(sessions: range) -> dict[int, int]:
    """Test session → its logical shard."""
    return {s: shard_of(key_of(s)) for s in sessions}


async def workers_ready(pool: WorkerPool, timeout: float = 30.0) -> None:
    """Wait until every worker listens; fail at once with the log line when one met a command crossing slots."""
    deadline = time.monotonic() + timeout
    while len(pool.alive()) < pool.count:
        crossed = sorted({line.strip()[-200:] for line in pool.grep("|".join(CROSS_SLOT))})
        if crossed:
            raise AssertionError(f"a worker stopped on the cluster: {crossed[:5]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"workers not listening within {timeout:g} s: {pool.logs()[-3000:]}")
        await asyncio.sleep(0.1)


class Refused(AssertionError):
    """A sender was refused for :data:`REFUSED_FOR_S` without a break."""


@dataclass
class Traffic:
    """The senders; :meth:`open` first (the web chat sessions), then :meth:`run`."""

    gateway: Gateway
    redis: aioredis.Redis
    disrupt_after: int = 60
    sessions: int = SESSIONS
    web_sessions: int = WEB_SESSIONS
    messages: int = MESSAGES
    pace_s: float = PACE_S
    acked: int = 0
    refused: Counter[int] = field(default_factory=Counter)
    """Non-2xx answers by status (0: no answer), each posted again."""
    halfway: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: list[str] = field(default_factory=list)
    web_keys: list[SessionKey] = field(default_factory=list)
    web_acked: dict[int, list[tuple[str, float]]] = field(default_factory=dict)
    """Web session → ``(message_id, time answered 202)`` in order."""

    async def open(self) -> None:
        for _ in range(self.web_sessions):
            async with self.gateway.client.post(f"{self.gateway.url}/api/chat/sessions") as response:
                assert response.status == 201, await response.text()
                self.tokens.append((await response.json())["token"])
        for token in self.tokens:
            found = text(await self.redis.get(GlobalKeys().web_token(hash_token(token))))
            assert found, "the web chat session's token is not stored"
            self.web_keys.append(SessionKey(found))
        self.web_acked = {i: [] for i in range(self.web_sessions)}

    async def run(self) -> None:
        await asyncio.gather(
            *(self._telegram(s) for s in range(self.sessions)), *(self._web(s) for s in range(self.web_sessions))
        )

    def _refused(self, status: int, since: float, what: str) -> None:
        self.refused[status] += 1
        if time.monotonic() - since > REFUSED_FOR_S:
            raise Refused(f"{what} refused for {REFUSED_FOR_S:g} s, last answer {status}: {dict(self.refused)}")

    def _acked(self) -> None:
        self.acked += 1
        if self.acked >= self.disrupt_after:
            self.halfway.set()

    async def _telegram(self, session: int) -> None:
        for index in range(self.messages):
            since = time.monotonic()
            while not 200 <= (status := (await self.gateway.send(session, index)).status) < 300:
                self._refused(status, since, f"Telegram message {session}/{index}")
                await asyncio.sleep(RETRY_S)
            self._acked()
            await asyncio.sleep(self.pace_s)

    async def _web(self, session: int) -> None:
        headers = {"Authorization": f"Bearer {self.tokens[session]}"}
        url = f"{self.gateway.url}/api/chat/messages"
        for index in range(self.messages):
            body = {"text": f"w{session}-m{index}", "client_id": uuid.uuid4().hex}
            since = time.monotonic()
            while True:
                status = 0
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with self.gateway.client.post(url, json=body, headers=headers) as response:
                        status = response.status
                        if status == 202:
                            self.web_acked[session].append(((await response.json())["message_id"], time.time()))
                            break
                self._refused(status, since, f"web chat message {session}/{index}")
                await asyncio.sleep(RETRY_S)
            self._acked()
            await asyncio.sleep(self.pace_s)


@dataclass
class WebOutcome:
    """The web chat sessions' accepted messages and the replies in their web streams."""

    acked: int
    lost: list[str]
    duplicates: dict[str, int]
    out_of_order: list[int]
    acked_at: dict[str, float]


@dataclass
class Outcome:
    report: Report
    web: WebOutcome
    refused: dict[int, int]

    def summary(self) -> str:
        r, w = self.report, self.web
        return (
            f"acked {r.acked}, answered {r.answered}, lost {len(r.lost)} {r.lost[:10]}, duplicates {r.duplicates}, "
            f"inversions {r.inversions}, dead-lettered {r.dead_lettered[:5]}, send window "
            f"{r.counters.get('send_window_duplicates', 0)}, non-2xx answers {self.refused}; web chat: acked "
            f"{w.acked}, lost {len(w.lost)}, duplicates {len(w.duplicates)}, out of order {w.out_of_order}"
        )


async def _web_replies(redis: aioredis.Redis, keys: list[SessionKey]) -> dict[int, list[str]]:
    """Per web session, the ``reply_to`` of each reply in its web stream, in stream order."""
    out: dict[int, list[str]] = {}
    for i, key in enumerate(keys):
        entries: Any = await redis.xrange(SessionKeys(key).web)
        out[i] = [json.loads(f[b"data"])["reply_to"] for _id, f in entries if f[b"type"] == b"message"]
    return out


def _web_outcome(traffic: Traffic, replied: dict[int, list[str]]) -> WebOutcome:
    acked = {s: [m for m, _at in ids] for s, ids in traffic.web_acked.items()}
    counts = Counter(m for ids in replied.values() for m in ids)
    lost = [m for ids in acked.values() for m in ids if not counts[m]]
    duplicates = {m: n for m, n in counts.items() if n > 1}
    out_of_order = []
    for session, ids in acked.items():
        first = list(dict.fromkeys(m for m in replied.get(session, []) if m in set(ids)))
        if first != [m for m in ids if m in set(first)]:
            out_of_order.append(session)
    at = {m: t for ids in traffic.web_acked.values() for m, t in ids}
    return WebOutcome(sum(len(v) for v in acked.values()), lost, duplicates, out_of_order, at)


async def finish(traffic: Traffic, fake: FakeTelegram, pool: WorkerPool) -> Outcome:
    """Wait (up to :data:`ANSWERED_WITHIN_S`) for a reply to every acknowledged message; check what happened."""
    wanted = {(p.session, p.index) for p in traffic.gateway.posted if 200 <= p.status < 300}
    web_wanted = sum(len(ids) for ids in traffic.web_acked.values())
    deadline = time.monotonic() + ANSWERED_WITHIN_S
    while time.monotonic() < deadline:
        answered = {(r.chat_id, r.text) for r in replies(fake)}
        web_answered = sum(len(v) for v in (await _web_replies(traffic.redis, traffic.web_keys)).values())
        if len(answered) >= len(wanted) and web_answered >= web_wanted:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.5)  # a duplicate would show by now
    history = await collect(traffic.redis, range(traffic.sessions), fake, traffic.gateway.posted, pool.signals)
    web = _web_outcome(traffic, await _web_replies(traffic.redis, traffic.web_keys))
    return Outcome(check(history), web, dict(traffic.refused))


async def settled(redis: aioredis.Redis) -> bool:
    """Whether every accepted message reached a terminal state (the counters merged over every shard)."""
    stats = await read_stats(redis)
    return stats.accepted > 0 and stats.runs_completed + stats.dead_letters >= stats.accepted
