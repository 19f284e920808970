"""③ Ingest: accept one inbound message durably, in one Lua script (one round trip on the hot path).

``lua/ingest.lua`` checks dedup and the abuse limits, then records the message, appends it to the inbox, marks the
session runnable and enqueues a drain job only when none is pending, all atomically: a platform retry is never
dropped while its original was lost (``docs/ARCHITECTURE.md`` §5). With ``idempotent=True`` (the web chat's
``client_id``) the same key with another text is refused as :attr:`IngestResult.reused` instead of deduplicated.

The per-sender limit is the one check outside the script: a sender writes into several sessions, so its meter is in
no session's cluster slot. With ``messages_per_sender_per_minute > 0`` its token is taken first by
``sender_meter.lua`` on the sender's own slot (one round trip, batched across concurrent requests), and a message the
script then does not write hands it back.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from switchboard.core.access import ROLE_META, RULE_META
from switchboard.core.events import DropReason
from switchboard.core.messages import InboundMessage, Posted, session_key
from switchboard.errors import QueueUnavailableError
from switchboard.queue import scripts
from switchboard.queue.cancellation import CANCEL_TTL_MS, STOP_COMMANDS, interrupt_record, is_stop, request_stop
from switchboard.queue.coalescer import Coalescer
from switchboard.queue.jobs import entry
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys
from switchboard.queue.message_ids import new_message_id
from switchboard.queue.scripts import ScriptArg
from switchboard.queue.shards import shard_of
from switchboard.settings import LimitsSettings, QueueSettings
from switchboard.tracing import note_ingested
from switchboard.types import BusyPolicy, SessionKey

__all__ = ["WEB_ECHO_MAXLEN", "IngestResult", "Ingestor", "new_message_id"]

logger = logging.getLogger(__name__)

WEB_ECHO_MAXLEN = 1000
"""Approximate cap of each session's web stream (the web chat's retained history; ``WEB_STREAM_MAXLEN``)."""
_QUEUED_STATUS = '{"status":"queued"}'
_GLOBAL = GlobalKeys()
_ASSIGNED: set[str] = {"id", "received_at"}
"""Fields ingest sets on the stored record (the draft's values are left out of its JSON)."""
_to_json: Callable[..., bytes] = InboundMessage.__pydantic_serializer__.to_json
"""``model_dump_json`` without its wrapper and without decoding: the record goes to Redis as bytes."""


_AFTER_KEY: Final = 13
"""``KEYS[13]`` of a platform message's call in a wave: the dedup key of its session's message before it in the same
write; the script writes nothing unless that one landed. (A web chat call's ``KEYS[13]`` is its web stream: a web
chat message is never sent in a wave.)"""
_SENDER_ARG: Final = 16
"""Index in the script's arguments (``ARGV[17]``) of the sender meter's wait (0 = counted, or no per-sender limit)."""
_MINUTE_MS: Final = 60_000
_NO_RETENTION: Final[tuple[ScriptArg, ...]] = ("", 0)
"""ARGV 25–26 for an echo outside the web chat: no idle TTL (a platform's retention is the operator's)."""
_DUPLICATE: Final = 1
_REFUSED: Final = 2
_REUSED: Final = 3
_AFTER_MISSING: Final = 4
_NO_LIMITS: Final = LimitsSettings(  # the retention settings (idle TTL, web history bytes) keep their defaults
    sessions_per_address_per_hour=0,
    messages_per_session_per_minute=0,
    messages_per_sender_per_minute=0,
    inbox_depth=0,
    streams_per_session=0,
    streams_per_address=0,
)
_DROP_REASONS: Final[dict[str, DropReason]] = {
    "inbox_full": "inbox_full",
    "session_rate": "session_rate",
    "sender_rate": "sender_rate",
}


def _drop_reason(value: str) -> DropReason:
    try:
        return _DROP_REASONS[value]
    except KeyError:
        raise RedisError(f"the ingest script refused a message for an unknown reason {value!r}") from None


_session_key = functools.lru_cache(maxsize=16_384)(session_key)
"""Session keys of recently seen conversations (escaping five components costs more than the lookup)."""
_json_string: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""``json.dumps`` of a ``str`` (the same C function it calls), without its Python layers."""


@functools.lru_cache(maxsize=16_384)
def _session_keys(session: SessionKey) -> tuple[SessionKeys, str, str, str, str, str, str, str, ShardKeys]:
    """A session's keys the ingest script touches (messages, inbox, meta, events, drain, rate, cancel), made once."""
    keys = SessionKeys(session)
    return keys, keys.messages, keys.inbox, keys.meta, keys.events, keys.drain, keys.rate, keys.cancel, keys.shard


_SHARD_INDEXES: Final = tuple((shard.runnable, shard.sessions, shard.stats) for shard in ShardKeys.every())
"""Each shard's indexes the ingest script writes (runnable, sessions, stats), by shard."""


@functools.lru_cache(maxsize=16_384)
def _web_keys(session: SessionKey) -> tuple[str, ...]:
    """The web chat's part of the script's keys (KEYS 14–20), made once per session."""
    keys = SessionKeys(session)
    return keys.web, keys.attempts, keys.history, keys.slots, keys.outbox, keys.dead, keys.epoch


def _result(message_id: str, reply: Any) -> IngestResult:
    """What the ingest script's ``[status, stored id, drain]`` reply means for the message given ``message_id``."""
    status, stored_id, drain = reply
    stored = stored_id.decode() if isinstance(stored_id, bytes) else str(stored_id)
    if status == _REFUSED:
        return IngestResult(message_id, False, False, _drop_reason(stored), int(drain))
    if status == _REUSED:
        return IngestResult(stored, duplicate=False, drain_enqueued=False, reused=True)
    note_ingested(stored)  # a webhook span joins the trace of the first message it accepted
    return IngestResult(message_id=stored, duplicate=status == _DUPLICATE, drain_enqueued=bool(drain))


_LONGEST_STOP = max(map(len, STOP_COMMANDS))


def _stops(message: InboundMessage) -> bool:
    """``is_stop``, without lower-casing a long posted text (``lower`` never shortens a string: it cannot match)."""
    if type(message.event) is not Posted:
        return is_stop(message)
    text = message.text.strip()
    return len(text) <= _LONGEST_STOP and text.lower() in STOP_COMMANDS


def _wave(
    messages: Sequence[tuple[InboundMessage, BusyPolicy]], start: int, senders: bool = False
) -> list[tuple[InboundMessage, BusyPolicy]]:
    """The messages from ``start`` on that may be sent together.

    A session's later message is sent guarded by the one before it (see :meth:`Ingestor.ingest_all`). The wave ends
    with a ``/stop`` (its stop is requested before anything after it is sent). With ``senders`` (a per-sender limit),
    it also ends before a message whose sender meter a guarded message of another session counts: that one may be
    sent again on its own, and one by one it is counted first.
    """
    wave: list[tuple[InboundMessage, BusyPolicy]] = []
    sessions: set[SessionKey] = set()
    guarded: dict[tuple[str, str, str, str], set[SessionKey]] = {}
    for message, policy in messages[start:]:
        c = message.conversation
        session = _session_key(c.tenant, c.agent, c.channel, c.account, c.conversation, c.thread)
        if senders:
            held = guarded.setdefault((c.tenant, c.channel, c.account, message.sender.id), set())
            if any(other != session for other in held):
                break
            if session in sessions:
                held.add(session)
        sessions.add(session)
        wave.append((message, policy))
        if _stops(message):
            break
    return wave


def _fingerprint(text: str) -> str:
    """A text's short hash for an idempotent dedup record: 64 bits, as a key is reused by mistake, not attacked."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _sender_wait(args: list[ScriptArg], wait_ms: int) -> bool:
    """Pass the sender meter's answer to the ingest script (``ARGV[17]``); whether the message was counted.

    A message the meter refused still goes to the script, which refuses it after its duplicate check: a platform's
    retry of an accepted message stays a duplicate, never a refusal.
    """
    if wait_ms > 0:
        args[_SENDER_ARG] = wait_ms
    return wait_ms == 0


class _ScriptCall(NamedTuple):
    """One message's ingest script call, and what reading its reply needs."""

    message_id: str
    """The id the message gets if it is stored."""
    session: SessionKey
    stop: bool
    """The message is a ``/stop``: once accepted, the turn running now is asked to stop."""
    keys: list[str]
    args: list[ScriptArg]

    def after(self, dedup_key: str) -> None:
        """Write this message only if the message holding ``dedup_key`` (its session's one before it) landed."""
        if len(self.keys) != _AFTER_KEY - 1:
            raise ValueError(f"only a platform message's call is guarded (KEYS[{_AFTER_KEY}])")
        self.keys.append(dedup_key)


@dataclass(slots=True)
class _Pending:
    """A message of a wave whose script call is on its way to Redis."""

    message: InboundMessage
    policy: BusyPolicy
    call: _ScriptCall
    reply: asyncio.Future[Any]
    counted: bool = False
    """The sender meter counted it (before the wave was sent): a message then not written hands its token back."""


@dataclass(slots=True)
class IngestResult:
    """What ingest did with one message.

    Read-only by convention (not frozen: one is made per message, and a frozen dataclass's ``__init__`` costs four
    times a plain one's).
    """

    message_id: str
    """The gateway id; for a duplicate, the id the original got; for a refused message, the id it would have had."""
    duplicate: bool
    drain_enqueued: bool
    """Whether this call enqueued a drain job (no drain was pending for the session)."""
    limited: DropReason | None = None
    """Set when an abuse limit refused the message: nothing was queued (see :class:`Ingestor`)."""
    retry_after_ms: int = 0
    """With ``limited``: how long until the limit would let the message in."""
    reused: bool = False
    """An ``idempotent`` ingest whose dedup key an earlier message with another text holds: nothing was written."""


class Ingestor:
    """Accepts inbound messages into their sessions' queues."""

    def __init__(self, redis: aioredis.Redis, settings: QueueSettings, limits: LimitsSettings | None = None) -> None:
        """Ingest into ``redis``; ``limits=None`` checks no abuse limits (the app passes ``Settings.limits``).

        Web chat sessions get the idle TTL and web history budget of ``limits`` (with ``None``, their defaults).
        """
        self.redis = redis
        self.settings = settings
        self.limits = limits or _NO_LIMITS
        self._limited = any(
            (
                self.limits.messages_per_session_per_minute,
                self.limits.messages_per_sender_per_minute,
                self.limits.inbox_depth,
            )
        )
        self._coalescer = Coalescer(
            redis,
            settings.ingest_timeout_s,
            ack_replicas=settings.ack_replicas,
            ack_timeout_ms=settings.ack_timeout_ms,
        )
        self._reloading = asyncio.Lock()
        self._per_sender = self.limits.messages_per_sender_per_minute
        self._senders = (
            Coalescer(redis, settings.ingest_timeout_s, script=scripts.SENDER_METER) if self._per_sender > 0 else None
        )
        """The sender meter's takes of concurrent requests, one pipeline per loop iteration (only with the limit)."""
        self._config: tuple[ScriptArg, ...] = (settings.dedup_ttl_s, settings.events_maxlen)
        """The script's constant arguments ARGV 13–14."""
        self._limits_config: tuple[ScriptArg, ...] = (
            self.limits.messages_per_session_per_minute,
            0,  # the sender meter's wait, set per call when it refused (see _sender_wait)
            self.limits.inbox_depth,
            CANCEL_TTL_MS,
        )
        """The script's constant arguments ARGV 16–19 (15 and 20 are the session's shard's channels)."""
        self._web_retention: tuple[ScriptArg, ...] = (
            self.limits.idle_session_ttl_s,
            self.limits.web_history_kib * 1024,
        )
        """ARGV 25–26 for web chat sessions."""

    async def ingest(
        self,
        message: InboundMessage,
        *,
        busy_policy: BusyPolicy = "sequential",
        echo: Mapping[str, str] | None = None,
        idempotent: bool = False,
    ) -> IngestResult:
        """Durably accept ``message`` (dedup, limits, append, mark runnable, enqueue a drain when none is pending).

        A message over an abuse limit comes back with :attr:`IngestResult.limited` set. With ``echo`` (the web
        chat, which answers 429) nothing at all is written; without it (a platform, which is answered 2xx since a
        refusal would only be retried) the drop is recorded as a ``message_dropped`` fact in the session's log.
        A duplicate is recognised before any limit is counted.

        Args:
            message: the parsed draft; its ``id`` is assigned here.
            busy_policy: what happens when the message lands while the session runs a turn: it waits for a turn of
                its own (``sequential``), is folded with everything waiting into the next turn (``collect``), stops
                the running turn, which restarts with everything waiting (``interrupt``), or is handed to the running
                turn at its next step (``steer``). The last message's policy is the session's.
            echo: web chat only: ``{"type": "user", "data": <json>}`` appended to the session's web stream
                in the same script, followed by a ``queued`` status entry.
            idempotent: the dedup key is an idempotency key (the web chat's ``client_id``): reused with a different
                text, the message is refused as :attr:`IngestResult.reused`, and nothing is written.

        Raises:
            QueueUnavailableError: Redis did not confirm within ``ingest_timeout_s`` (answer 503: the
                platform retries, and the dedup key makes the retry safe).
        """
        try:  # the round trip in this coroutine itself: one coroutine less per message on the hot path
            message_id, session, stop, keys, args = self._script_call(message, busy_policy, echo, idempotent)
            counted = False
            if self._senders is not None:  # the per-sender limit: one round trip of its own, on the sender's slot
                meter = self._sender_meter(message)
                counted = _sender_wait(args, await self._taken(self._senders.submit(*self._take(meter)), meter))
            try:
                reply = await self._coalescer.submit(keys, args)
            except NoScriptError:  # Redis lost its script cache (restart, SCRIPT FLUSH): load it, run this one alone
                reply = await self._alone(keys, args)
            result = _result(message_id, reply)
            if counted and reply[0] != 0:
                await self._give_back(meter)
            if stop and not (result.duplicate or result.limited or result.reused):  # the turn running now stops
                await request_stop(self.redis, session, reason=f"/stop from {message.sender.id}")
            return result
        except (TimeoutError, RedisError, OSError) as err:
            logger.warning("ingest for %s not confirmed: %s", message.conversation.channel, type(err).__name__)
            raise QueueUnavailableError(f"Redis did not confirm the message: {type(err).__name__}") from err

    async def ingest_all(
        self,
        messages: Sequence[tuple[InboundMessage, BusyPolicy]],
        confirmed: Callable[[InboundMessage, IngestResult], None] | None = None,
    ) -> list[IngestResult]:
        """:meth:`ingest` for each message of one platform delivery, in order, sent in one write.

        Each stays its own atomic script. A session's later message carries its earlier one's dedup key and is written
        only if that one landed (refused by a limit, it is sent again on its own once that is known), and the messages
        after a ``/stop`` are sent once its stop is requested, as one by one (a message alone in its wave goes through
        :meth:`ingest`). Platform messages only. ``confirmed`` is called with each message's result as soon
        as Redis confirms it (also for the messages confirmed before a failure).

        Raises:
            QueueUnavailableError: one was not confirmed in time (answer 503; the retry's duplicates are dropped).
        """
        results: list[IngestResult] = []
        pending: deque[_Pending] = deque()
        index = 0
        try:
            while index < len(messages):
                wave = _wave(messages, index, self.limits.messages_per_sender_per_minute > 0)
                index += len(wave)
                if len(wave) == 1:  # nothing to send together: exactly as one by one
                    message, policy = wave[0]
                    results.append(result := await self.ingest(message, busy_policy=policy))
                    if confirmed is not None:
                        confirmed(message, result)
                    continue
                last: dict[SessionKey, str] = {}  # session → the dedup key of its latest message in this wave
                waits: list[int] = []
                if self._senders is not None:  # every sender token of the wave in one round trip, in order
                    meters = [self._sender_meter(m) for m, _ in wave]
                    takes = [self._senders.submit(*self._take(meter)) for meter in meters]
                    try:
                        waits = [await self._taken(take, meter) for take, meter in zip(takes, meters, strict=True)]
                    except BaseException:
                        for take in takes:  # their outcome no longer matters: never an unretrieved exception
                            take.add_done_callback(lambda f: f.cancelled() or f.exception())
                        raise
                for n, (message, policy) in enumerate(wave):
                    call = self._script_call(message, policy, None, False)
                    counted = bool(waits) and _sender_wait(call.args, waits[n])
                    after = last.get(call.session)
                    last[call.session] = call.keys[0]
                    if after is not None:
                        call.after(after)
                    pending.append(
                        _Pending(message, policy, call, self._coalescer.submit(call.keys, call.args), counted)
                    )
                while pending:
                    item = pending.popleft()
                    message, call = item.message, item.call
                    try:
                        reply = await item.reply
                    except NoScriptError:  # as in ingest: load the script, run the rest one by one, in order
                        reply = await self._alone(call.keys, call.args)
                    if item.counted and reply[0] != 0:  # not written: its sender token goes back (a resend takes anew)
                        await self._give_back(self._sender_meter(message))
                    if resent := reply[0] == _AFTER_MISSING:  # the one before it was refused: now it goes alone
                        result = await self.ingest(message, busy_policy=item.policy)  # (which requests its stop)
                    else:
                        result = _result(call.message_id, reply)
                    results.append(result)
                    if confirmed is not None:
                        confirmed(message, result)
                    if call.stop and not (resent or result.duplicate or result.limited or result.reused):
                        await request_stop(self.redis, call.session, reason=f"/stop from {message.sender.id}")
            return results
        except (TimeoutError, RedisError, OSError) as err:
            for item in pending:  # their outcome no longer matters: never an unretrieved exception
                item.reply.add_done_callback(lambda f: f.cancelled() or f.exception())
            logger.warning("ingest for %s not confirmed: %s", messages[0][0].conversation.channel, type(err).__name__)
            raise QueueUnavailableError(f"Redis did not confirm the message: {type(err).__name__}") from err

    def _sender_meter(self, message: InboundMessage) -> str:
        c = message.conversation
        return _GLOBAL.sender_rate(f"{c.tenant}/{c.channel}/{c.account}/{message.sender.id}")

    def _take(self, meter: str, how: str = "take") -> tuple[list[str], list[ScriptArg]]:
        """The sender meter script's keys and arguments (``sender_meter.lua``)."""
        return [meter], [self._per_sender, _MINUTE_MS, how]

    async def _taken(self, take: asyncio.Future[Any], meter: str) -> int:
        """The sender meter's answer to a take: 0 when the message was counted, else the wait in ms."""
        try:
            return int(await take)
        except NoScriptError:  # a server without the script (restarted, promoted): load it with this call
            async with asyncio.timeout(self.settings.ingest_timeout_s):
                return int(await scripts.SENDER_METER(self.redis, *self._take(meter)))

    async def _give_back(self, meter: str) -> None:
        """Hand back the sender token of a message ingest did not write (a duplicate, another limit, a reused key).

        Best effort: a failure here leaves the sender one message short of its limit for at most a minute.
        """
        try:
            async with asyncio.timeout(self.settings.ingest_timeout_s):
                await scripts.SENDER_METER(self.redis, *self._take(meter, "give"))
        except (TimeoutError, RedisError, OSError) as err:
            logger.warning("a sender's token was not handed back: %s", type(err).__name__)

    async def _alone(self, keys: list[str], args: list[ScriptArg]) -> Any:
        """Load the ingest script (a server without it: restarted, or a promoted replica) and run one call.

        With ``ack_replicas`` the call goes through the coalescer again, so its ``WAIT`` follows it on its connection.
        One call at a time, in the order the refusals came back (``asyncio.Lock`` is FIFO): a batch refused with
        ``NOSCRIPT`` is sent again in its own order, so one session's concurrent messages keep theirs.
        """
        async with asyncio.timeout(self.settings.ingest_timeout_s), self._reloading:
            if not self.settings.ack_replicas:
                return await scripts.INGEST(self.redis, keys, args)
            await self.redis.script_load(scripts.INGEST.source)
            return await self._coalescer.submit(keys, args)

    def _script_call(
        self, message: InboundMessage, busy_policy: BusyPolicy, echo: Mapping[str, str] | None, idempotent: bool
    ) -> _ScriptCall:
        """The new message id, the session, whether it is a stop, and the ingest script's keys and arguments."""
        now = time.time()
        message_id = new_message_id(now)
        job_id = "d" + message_id[:24]  # the same shape as new_job_id(now): ms then 48 random bits
        conv = message.conversation
        channel = conv.channel
        session = _session_key(conv.tenant, conv.agent, channel, conv.account, conv.conversation, conv.thread)
        keys, messages, inbox, meta, events, drain, rate, cancel, shard = _session_keys(session)
        # The stored record is the draft plus the two fields assigned here, spliced in front of the draft's JSON
        # (no model copy); the two facts are written directly in their EventAdapter JSON shape (the channel is a
        # ChannelName, validated to [a-z0-9_], so it needs no escaping).
        at = repr(now)
        stop = _stops(message)
        sender = _json_string(message.sender.id)
        draft = _to_json(message, exclude=_ASSIGNED)
        record = b"".join((b'{"id":"', message_id.encode(), b'","received_at":', at.encode(), b",", draft[1:]))
        received = (
            f'{{"at":{at},"message_id":"{message_id}","kind":"message_received","channel":"{channel}",'
            f'"sender":{sender},"chars":{len(message.text)}}}'
        )
        if (rule := message.meta.get(RULE_META)) is not None:  # access control admitted it: by which rule, as what
            role = _json_string(str(message.meta.get(ROLE_META, "")))
            received = f'{received[:-1]},"access":{_json_string(str(rule))},"role":{role}}}'

        queued = f'{{"at":{at},"message_id":"{message_id}","kind":"run_queued"}}'
        dropped = ""
        if echo is None and self._limited:
            # a platform is answered 2xx when over a limit, so the drop is logged (the script appends the reason)
            dropped = f'{{"at":{at},"kind":"message_dropped","channel":"{channel}","sender":{sender},"reason":"'
        runnable, sessions, stats = _SHARD_INDEXES[shard_of(session)]
        script_keys = [
            keys.dedup(message.dedup_key),
            messages,
            inbox,
            meta,
            events,
            drain,
            runnable,
            sessions,
            stats,
            shard.drainq,
            rate,
            cancel,
        ]
        script_args: list[ScriptArg] = [
            message_id,
            record,
            int(now * 1000),
            session,
            channel,
            busy_policy,
            received,
            queued,
            job_id,
            entry(session, job_id),
            dropped,
            interrupt_record(message_id, now) if busy_policy == "interrupt" and not stop else "",
            *self._config,
            shard.ready,
            *self._limits_config,
            shard.cancel,
        ]
        if channel == "web" or echo is not None or idempotent:
            # The web chat's part of the script (echo, idle TTL over every key of the session, idempotency) is passed
            # only when used: a platform message's call sends 33 arguments, not 47 (packing them is a measurable part
            # of its CPU). A script must declare every key it touches; a platform session's ingest touches none of them.
            script_keys += _web_keys(session)
            script_args += [
                echo.get("type", "user") if echo is not None else "",
                echo.get("data", "{}") if echo is not None else "",
                WEB_ECHO_MAXLEN,
                _QUEUED_STATUS,
                *(self._web_retention if channel == "web" else _NO_RETENTION),
                _fingerprint(message.text) if idempotent else "",
            ]
        return _ScriptCall(message_id, session, stop, script_keys, script_args)
