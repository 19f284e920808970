"""Chaos harness: real ``switchboard worker`` processes under a supervisor, the real web tier, signed traffic.

- :class:`WorkerPool` starts ``[sys.executable, "-m", "switchboard", "worker"]`` processes, each in its own
  process group (so a signal reaches the whole worker), logs each to a file, learns each one's worker id from
  its start-up line, SIGKILLs / SIGSTOPs / SIGCONTs them on request (recording a :class:`Signal`), and restarts
  dead ones from a supervisor task. :meth:`WorkerPool.close` kills whatever is left, stopped or not.
- :class:`Gateway` serves ``create_app(load_settings(env))`` on a loopback port in the test's event loop and
  posts correctly signed Telegram updates to it, recording every answer as a :class:`Posted`.
- :func:`collect` reads the event logs, dead letters and counters from Redis and the replies from the fake
  Telegram into a :class:`History` for the pure checker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web

from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update, sign_update
from switchboard.core.messages import session_key
from switchboard.queue.eventlog import decode_entries
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.stats import read_stats
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.shardindexes import stats_of
from tests.waiting import wait_until

from .checker import History, Posted, Reply, Signal, message_text

__all__ = [
    "BOT_TOKEN",
    "CHAT_BASE",
    "SECRET",
    "Gateway",
    "WorkerPool",
    "chaos_env",
    "chat_of",
    "collect",
    "event_log",
    "interleaved",
    "key_of",
    "lease_holders",
    "replies",
    "settled",
    "text",
    "update_id",
    "wait_until",
]

ROOT = Path(__file__).resolve().parents[2]
BOT_TOKEN = "424242:chaos-token"
SECRET = "chaos_secret-1"
CHAT_BASE = 10_000
_LISTENING = re.compile(r"worker (\S+) listening on")
_GLOBAL = GlobalKeys()


def chat_of(session: int) -> int:
    """The Telegram chat of test session ``session``."""
    return CHAT_BASE + session


def key_of(session: int) -> SessionKey:
    """The gateway's session key for test session ``session`` (default tenant, agent and account)."""
    return session_key("default", "assistant", "telegram", "default", str(chat_of(session)))


def update_id(session: int, index: int) -> int:
    """A unique Telegram ``update_id`` per message."""
    return 1_000_000 + session * 1_000 + index


UNPACED = "\nchannels:\n  telegram: {send_rate: 0, chat_send_rate: 0}\n"
"""The fake Bot API has no flood limits: the gateway's own pacing at Telegram's 30 sends a second would make a
crash test of thousands of replies a test of the pacing (tests/queue/test_outbound.py covers that)."""


def chaos_env(base: dict[str, str], fake_url: str, **queue: str) -> dict[str, str]:
    """``base_env`` plus the fake Telegram (sends not paced) and short queue timings (``QUEUE__NAME=value``)."""
    config = Path(base["SWITCHBOARD_CONFIG"])
    unpaced = config.with_name("switchboard-chaos.yaml")
    unpaced.write_text(config.read_text() + UNPACED)
    env = base | {
        "SWITCHBOARD_CONFIG": str(unpaced),
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": BOT_TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake_url,
        "SWITCHBOARD_TELEGRAM__BOT_USERNAME": "switchboard_test_bot",
        "SWITCHBOARD_QUEUE__LEASE_MS": "2000",
        "SWITCHBOARD_QUEUE__REAPER_INTERVAL_S": "0.5",
        "SWITCHBOARD_QUEUE__RETRY_BACKOFF_S": "0.1",
        "SWITCHBOARD_OFFLINE__DELAY_MS": "30",
        "SWITCHBOARD_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }
    env.update({f"SWITCHBOARD_{name}": value for name, value in queue.items()})
    return env


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, so a killed test run leaks no workers."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


@dataclass(slots=True)
class _Slot:
    index: int
    log: Path
    process: subprocess.Popen[bytes] | None = None
    worker_id: str | None = None
    stopped: bool = False
    generation: int = 0


@dataclass(slots=True)
class WorkerPool:
    """``count`` worker processes kept alive by a supervisor (unless :attr:`supervise` is off)."""

    env: dict[str, str]
    count: int
    log_dir: Path
    supervise: bool = True
    signals: list[Signal] = field(default_factory=list)
    restarts: int = 0
    _slots: list[_Slot] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Spawn every worker and the supervisor task."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for index in range(self.count):
            slot = _Slot(index, self.log_dir / f"worker-{index}.log")
            self._slots.append(slot)
            self._spawn(slot)
        self._task = asyncio.get_running_loop().create_task(self._supervisor())

    def _spawn(self, slot: _Slot) -> None:
        slot.generation += 1
        slot.worker_id = None
        slot.stopped = False
        with slot.log.open("ab") as log:
            log.write(f"--- start {slot.generation} at {time.time():.3f}\n".encode())
            log.flush()
            slot.process = subprocess.Popen(
                [sys.executable, "-m", "switchboard", "worker"],
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # only a prctl between fork and exec
            )

    async def _supervisor(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            if not self.supervise:
                continue
            for slot in self._slots:
                if slot.process is not None and slot.process.poll() is not None:
                    self.restarts += 1
                    self._spawn(slot)

    def worker_id(self, index: int) -> str | None:
        """The id the worker in slot ``index`` announced (read from its log on first need)."""
        slot = self._slots[index]
        if slot.worker_id is None:
            text = slot.log.read_text(errors="replace")
            current = text.rsplit(f"--- start {slot.generation} ", 1)[-1]
            found = _LISTENING.search(current)
            slot.worker_id = found.group(1) if found else None
        return slot.worker_id

    def alive(self) -> list[int]:
        """Slots whose process runs and has started listening."""
        return [
            s.index
            for s in self._slots
            if s.process is not None and s.process.poll() is None and self.worker_id(s.index) is not None
        ]

    def slot_of(self, worker: str) -> int | None:
        """The slot whose current process announced ``worker``."""
        for slot in self._slots:
            if self.worker_id(slot.index) == worker:
                return slot.index
        return None

    async def ready(self, timeout: float = 20.0) -> None:
        """Wait until every worker listens."""
        await wait_until(lambda: len(self.alive()) == self.count, timeout=timeout, what="all workers listening")

    def _signal(self, index: int, sig: signal.Signals) -> Signal:
        slot = self._slots[index]
        assert slot.process is not None
        record = Signal(time.time(), sig.name, self.worker_id(index), slot.process.pid)
        self.signals.append(record)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(slot.process.pid, sig)
        return record

    def kill(self, index: int) -> Signal:
        """SIGKILL the worker's whole process group (the supervisor restarts it)."""
        record = self._signal(index, signal.SIGKILL)
        slot = self._slots[index]
        assert slot.process is not None
        slot.process.wait()
        return record

    def stop(self, index: int) -> Signal:
        """SIGSTOP the worker's process group (frozen, not dead: the supervisor leaves it alone)."""
        self._slots[index].stopped = True
        return self._signal(index, signal.SIGSTOP)

    def cont(self, index: int) -> Signal:
        """SIGCONT a stopped worker."""
        self._slots[index].stopped = False
        return self._signal(index, signal.SIGCONT)

    def logs(self) -> str:
        """Every worker's log (for failure messages)."""
        return "\n".join(f"== {s.log.name}\n{s.log.read_text(errors='replace')[-4000:]}" for s in self._slots)

    def grep(self, pattern: str) -> list[str]:
        """Log lines of every worker matching ``pattern``."""
        found: list[str] = []
        for slot in self._slots:
            found += [line for line in slot.log.read_text(errors="replace").splitlines() if re.search(pattern, line)]
        return found

    async def close(self) -> None:
        """Stop supervising, then SIGKILL every process group (stopped ones too) and reap them."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for slot in self._slots:
            if slot.process is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(slot.process.pid, signal.SIGKILL)
        for slot in self._slots:
            if slot.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(slot.process.wait, 10)


class Gateway:
    """The real web tier, in the test's event loop, and a client posting signed Telegram updates to it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.settings = load_settings(env)
        self.app = create_app(self.settings)
        self.url = ""
        self.posted: list[Posted] = []
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        """Serve on a free loopback port; returns the base URL."""
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64), timeout=aiohttp.ClientTimeout(total=10)
        )
        return self.url

    @property
    def client(self) -> aiohttp.ClientSession:
        """The HTTP client (for other requests to the gateway)."""
        assert self._client is not None
        return self._client

    async def post_raw(self, body: bytes | Any, headers: dict[str, str]) -> tuple[int, float]:
        """POST a body to the Telegram webhook; returns ``(status, seconds)``; status 0 when the request failed."""
        started = time.monotonic()
        try:
            async with self.client.post(f"{self.url}/webhooks/telegram", data=body, headers=headers) as response:
                await response.read()
                return response.status, time.monotonic() - started
        except (aiohttp.ClientError, TimeoutError):
            return 0, time.monotonic() - started

    async def send(self, session: int, index: int, *, text: str | None = None, update: int | None = None) -> Posted:
        """Post message ``index`` of ``session`` (text ``s<session>-m<index>`` unless given) and record it."""
        uid = update if update is not None else update_id(session, index)
        payload = make_update(text or message_text(session, index), chat_id=chat_of(session), update_id=uid)
        body, headers = sign_update(payload, SECRET)
        sent_at = time.time()
        status, _ = await self.post_raw(body, headers)
        posted = Posted(session, index, uid, status, sent_at, time.time())
        self.posted.append(posted)
        return posted

    async def close(self) -> None:
        """Close the client and the server."""
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()


def interleaved(sessions: int, messages: int, senders: int) -> list[list[tuple[int, int]]]:
    """Per sender, the ``(session, index)`` pairs it posts: message 0 of each of its sessions, then 1, ...

    A session belongs to one sender, so its messages are posted one after another (accepted in index order),
    while different sessions' messages interleave.
    """
    plans: list[list[tuple[int, int]]] = [[] for _ in range(senders)]
    for index in range(messages):
        for session in range(sessions):
            plans[session % senders].append((session, index))
    return plans


def replies(fake: FakeTelegram) -> list[Reply]:
    """The fake's successful ``sendMessage`` calls."""
    return [
        Reply(call.seq, int(call.params.get("chat_id", 0)), str(call.params.get("text", "")), call.time)
        for call in fake.sent(method="sendMessage")
    ]


def text(value: Any) -> str:
    """A Redis reply (``bytes`` with ``decode_responses`` off) as text; ``None`` → ``""``."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


async def event_log(redis: aioredis.Redis, session: int) -> list[dict[str, Any]]:
    """Test session ``session``'s whole event log, oldest first."""
    entries: Any = await redis.xrange(SessionKeys(key_of(session)).events)
    return decode_entries(entries or [])


async def lease_holders(redis: aioredis.Redis, sessions: Iterable[int]) -> dict[str, list[int]]:
    """Worker id → the test sessions whose lease it holds right now."""
    chosen = list(sessions)
    values = await redis.mget([SessionKeys(key_of(s)).lease for s in chosen])
    holders: dict[str, list[int]] = {}
    for session, value in zip(chosen, values, strict=True):
        if value:
            worker = text(value).split(":", 1)[1]
            holders.setdefault(worker, []).append(session)
    return holders


async def settled(redis: aioredis.Redis) -> bool:
    """Whether every accepted message reached a terminal state (completed or dead-lettered)."""
    stats = await stats_of(redis)
    accepted, completed, dead = (stats.get(name) for name in (b"accepted", b"runs_completed", b"dead_letters"))
    return int(accepted or 0) > 0 and int(completed or 0) + int(dead or 0) >= int(accepted or 0)


async def collect(
    redis: aioredis.Redis,
    sessions: Iterable[int],
    fake: FakeTelegram,
    posted: list[Posted],
    signals: list[Signal] | None = None,
) -> History:
    """Read everything the checker needs into a :class:`History`."""
    events: dict[int, list[dict[str, Any]]] = {}
    dead: dict[int, list[dict[str, Any]]] = {}
    for session in sessions:
        keys = SessionKeys(key_of(session))
        events[session] = await event_log(redis, session)
        records = await redis.lrange(keys.dead, 0, -1)
        if records:
            dead[session] = [json.loads(r) for r in records]
    stats = await read_stats(redis)
    counters = {
        "accepted": stats.accepted,
        "deduplicated": stats.deduplicated,
        "runs_completed": stats.runs_completed,
        "runs_failed": stats.runs_failed,
        "dead_letters": stats.dead_letters,
        "send_window_duplicates": stats.send_window_duplicates,
        "fenced_rejections": stats.fenced_rejections,
    }
    return History(list(posted), replies(fake), events, list(signals or []), dead, counters, CHAT_BASE)
