"""The outbox: idempotency records around every send, so a re-run turn sends no reply twice.

A send's key is ``sha256(run_id, logical action, ordinal)``, stable across re-runs; its record moves
``claimed → sent`` around the platform call, keeps a durable send's rendered action (a later attempt resumes the
send, never the model) and its parts sent. A channel whose send is itself a Redis write has no send window at all
(:func:`append_once`). A platform's ``retry_after`` is honoured by retrying the send alone, within ``max_wait_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from pydantic import TypeAdapter, ValidationError

from switchboard.channels.base import Capabilities, FileData, Receipt, SendContext
from switchboard.core.actions import Action
from switchboard.core.messages import ConversationRef
from switchboard.core.workspaces.store import WorkspaceStore
from switchboard.errors import DeliveryError, RateLimitedError
from switchboard.outbound.deliver import read_stored_file, read_workspace_file
from switchboard.outbound.ratelimits import SendBuckets
from switchboard.queue import scripts
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import LeaseToken, fenced_xadd
from switchboard.tracing import span

__all__ = [
    "CURRENT_SEND",
    "MAX_RATE_LIMIT_RETRIES",
    "RUN_PREFIX",
    "Ephemeral",
    "Outbox",
    "OutboxSend",
    "PendingSend",
    "SendOutcome",
    "append_once",
    "idempotency_key",
]

logger = logging.getLogger(__name__)

HOLD_ROUNDS = 10
"""With ``ack_replicas``: how many ``ack_timeout_ms`` a send's claim or record waits for the replicas before going
ahead (a primary dying meanwhile fails the wait, and the send never happens)."""

MAX_RATE_LIMIT_RETRIES = 5
"""Platform 429s honoured per send before the send counts as failed."""

Perform = Callable[[Action, ConversationRef, SendContext], Awaitable[Receipt]]
Capable = Callable[[ConversationRef], Capabilities]
_ACTION: TypeAdapter[Action] = TypeAdapter(Action)

CURRENT_SEND: ContextVar[str | None] = ContextVar("switchboard_current_send", default=None)
"""The idempotency key of the outbox send being performed in this context (``None`` outside :meth:`Outbox.send`)."""


async def append_once(
    redis: aioredis.Redis,
    lease: LeaseToken,
    stream_key: str,
    fields: Mapping[str, str],
    maxlen: int,
    max_bytes: int = 0,
) -> str:
    """Append a stream entry that *is* a delivery (the web chat's), exactly once; returns its entry id.

    With ``max_bytes`` the stream is also trimmed, oldest entries first, to stay within that many bytes.

    Inside :meth:`Outbox.send` the append and the outbox's ``sent`` record are one fenced script (an entry already
    recorded is not appended again); outside it (status, typing, streamed deltas: nothing to record) it is a plain
    fenced ``XADD``.

    Raises:
        FencedWriteError: the lease has passed to another epoch.
    """
    key = CURRENT_SEND.get()
    if key is None:
        return await fenced_xadd(redis, lease, stream_key, fields, maxlen, max_bytes)
    keys = SessionKeys(lease.session)
    args: list[scripts.ScriptArg] = [lease.token, maxlen, key, f"{time.time():.6f}", max_bytes]
    for name, value in fields.items():
        args += [name, value]
    entry = await scripts.OUTBOX_APPEND(
        redis,
        [keys.lease, keys.fenced_rejections, stream_key, keys.outbox, keys.shard.stats],
        args,
        session=lease.session,
        epoch=lease.epoch,
    )
    return entry.decode() if isinstance(entry, bytes) else str(entry)


RUN_PREFIX = "run-"
"""A turn's run id is this then its first message's gateway id (the key of the request's trace)."""


def idempotency_key(run_id: str, action: str, ordinal: int = 0) -> str:
    """``sha256(run_id, logical action, ordinal)`` as hex: the same for every re-run of a turn."""
    return hashlib.sha256(f"{run_id}\x1f{action}\x1f{ordinal}".encode()).hexdigest()


class Ephemeral:
    """The send context of an action nothing is recorded for (status, typing, a streamed delta or edit).

    It resumes nothing, records nothing and does not pace (ephemeral actions are best effort: the edit budget, not
    the send buckets, meters preview edits); it reads no files.
    """

    def __init__(self, idempotency_key: str) -> None:
        self._key = idempotency_key

    @property
    def idempotency_key(self) -> str:
        """Stable across re-runs of the same logical action."""
        return self._key

    @property
    def sent(self) -> tuple[str, ...]:
        """Nothing was recorded: always empty."""
        return ()

    async def part_sent(self, platform_id: str) -> None:
        """Nothing to record."""

    async def pace(self) -> None:
        """Ephemeral actions do not wait for send tokens."""

    async def read_file(self, path: str) -> FileData:
        """Files go out through the outbox only.

        Raises:
            DeliveryError: always (``retryable=False``).
        """
        raise DeliveryError("a file can only be sent through the outbox", channel="", retryable=False)


class OutboxSend:
    """The send context of one outbox send (:class:`~switchboard.channels.base.SendContext`)."""

    def __init__(self, outbox: Outbox, key: str, conversation: ConversationRef, sent: list[str]) -> None:
        self._outbox = outbox
        self._key = key
        self._conversation = conversation
        self._sent = sent
        """Shared with the outbox's send, so a 429 retry of the same send resumes after the parts recorded."""
        self.unrecorded: str | None = None
        """The last part sent, recorded only before the next platform call; the ``sent`` record that follows the
        last one carries it (one fenced step fewer per send)."""

    @property
    def idempotency_key(self) -> str:
        """``sha256(run_id, logical action, ordinal)``: the same for every attempt at the send."""
        return self._key

    @property
    def sent(self) -> tuple[str, ...]:
        """Platform ids of the parts already recorded for this send (by any worker)."""
        return tuple(self._sent)

    async def part_sent(self, platform_id: str) -> None:
        """Count one more part sent: recorded (fenced) before the next platform call, or by the ``sent`` record.

        Raises:
            FencedWriteError: the session's lease passed to another worker.
        """
        await self.record_unrecorded()
        self.unrecorded = platform_id
        self._sent.append(platform_id)

    async def record_unrecorded(self) -> None:
        """Record the part held back, before anything else is sent (or the send fails or stops)."""
        held, self.unrecorded = self.unrecorded, None
        if held is not None:
            await self._record_part(held)

    async def _record_part(self, platform_id: str) -> None:
        outbox = self._outbox
        await scripts.OUTBOX_PART(
            outbox.redis,
            outbox._fenced_keys(),
            [outbox.lease.token, self._key, platform_id],
            session=outbox.lease.session,
            epoch=outbox.lease.epoch,
        )

    async def pace(self) -> None:
        """Take a token of the account's and the chat's send buckets (shared by every worker), waiting if need be.

        Raises:
            RateLimitedError: no token within the bounded wait.
        """
        await self.record_unrecorded()  # every platform call is paced first: the part before it is recorded by then
        outbox = self._outbox
        if outbox.buckets is not None and outbox.capabilities is not None:
            await outbox.buckets.pace(self._conversation, outbox.capabilities(self._conversation))

    async def read_file(self, path: str) -> FileData:
        """Read ``path`` from the session's workspace.

        Raises:
            DeliveryError: no workspace here, no such file, or the path leaves the workspace (``retryable=False``).
        """
        outbox = self._outbox
        if outbox.workspace_store is not None:
            return await read_stored_file(outbox.workspace_store, outbox.lease.session, path, self._conversation)
        return await read_workspace_file(outbox.workspace_root, outbox.lease.session, path, self._conversation)


class SendOutcome:
    """What :meth:`Outbox.send` did."""

    __slots__ = ("key", "receipt", "skipped")

    def __init__(self, key: str, receipt: Receipt | None, skipped: bool) -> None:
        self.key = key
        self.receipt = receipt
        """What the send produced; for a skipped send, the platform ids an earlier attempt recorded."""
        self.skipped = skipped
        """``True`` when an earlier attempt had already delivered this send."""


@dataclass(frozen=True, slots=True)
class PendingSend:
    """A durable send an earlier attempt recorded: what to send, and how far it got."""

    action: Action
    state: str
    """``claimed`` (outcome unknown: the worker died in the send window), ``failed`` or ``sent``."""
    attempts: int
    """Delivery attempts made so far."""
    parts: int
    """Platform messages it became, once ``sent``."""


class Outbox:
    """Fenced, idempotent sends for one session under one lease."""

    def __init__(
        self,
        redis: aioredis.Redis,
        lease: LeaseToken,
        perform: Perform,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        events_maxlen: int = 2_000,
        max_wait_s: float = math.inf,
        buckets: SendBuckets | None = None,
        capabilities: Capable | None = None,
        workspace_root: Path | None = None,
        workspace_store: WorkspaceStore | None = None,
        ack_replicas: int = 0,
        ack_timeout_ms: int = 0,
    ) -> None:
        self.redis = redis
        self.ack_replicas = ack_replicas
        """Replicas a send's claim (before the platform call) and record (after it) wait for
        (``SWITCHBOARD_QUEUE__ACK_REPLICAS``), so after a failover the promoted replica knows what was sent: up to
        :data:`HOLD_ROUNDS` times ``ack_timeout_ms``, then the send goes ahead (a worker has nobody to answer 503)."""
        self.ack_timeout_ms = ack_timeout_ms
        self.workspace_store = workspace_store
        """Where workspaces are kept (``SendContext.read_file`` reads from it when set, else ``workspace_root``)."""
        self.buckets = buckets
        """The shared send buckets (``None``: sends are not paced, and a 429 holds nothing)."""
        self.capabilities = capabilities
        """The rates of a conversation's channel."""
        self.workspace_root = workspace_root
        """Where session workspaces live (``SendContext.read_file``)."""
        self.max_wait_s = max_wait_s
        """The longest the turn's sends may wait on platform ``retry_after`` in all; past it the error is raised."""
        self.waited_s = 0.0
        """Seconds this outbox's sends (and their caller's retries) have waited on the platform so far."""
        self.events_maxlen = events_maxlen
        """The session event log's cap, for facts that ride on a claim."""
        self.lease = lease
        self._perform = perform
        self._sleep = sleep
        self._keys = SessionKeys(lease.session)
        self.used: list[str] = []
        """Idempotency keys this outbox claimed (dropped from the record when the turn is acked)."""

    def _fenced_keys(self) -> list[str]:
        return [self._keys.lease, self._keys.fenced_rejections, self._keys.outbox]

    async def send(
        self,
        action: Action,
        conversation: ConversationRef,
        *,
        run_id: str,
        logical: str,
        ordinal: int = 0,
        facts: str = "",
        durable: bool = False,
        attempt: int = 1,
    ) -> SendOutcome:
        """Claim, perform and record one send.

        ``facts`` (:func:`~switchboard.queue.ledger.encode_facts`) are events the drain held back: the claim
        writes them first, in the same fenced step (one round trip fewer than writing them on their own).
        A ``durable`` send keeps the action (and ``attempt``, its delivery attempt) in its record, and a failed
        one is recorded as ``failed`` rather than dropped, so that :meth:`pending` finds it later.

        A ``send`` span records it (action kind, channel, logical name, parts, outcome ``sent`` / ``skipped`` /
        ``failed``), under the current span (a tool's send inside the ``run`` span) or else in the trace of the run's
        first message (a turn's reply, sent after the run).

        Raises:
            FencedWriteError: the lease passed to another epoch (nothing is sent).
            DeliveryError: the platform refused the send (the claim is dropped first).
        """
        with span(
            "send",
            trace_key=run_id.removeprefix(RUN_PREFIX),
            switchboard__action=action.kind,
            switchboard__channel=conversation.channel,
            switchboard__logical=logical,
            switchboard__durable=durable,
            switchboard__attempt=attempt,
        ) as opened:
            try:
                outcome = await self._send(action, conversation, run_id, logical, ordinal, facts, durable, attempt)
            except DeliveryError:
                opened.set_attribute("switchboard.outcome", "failed")
                raise
            opened.set_attribute("switchboard.outcome", "skipped" if outcome.skipped else "sent")
            if outcome.receipt is not None:
                opened.set_attribute("switchboard.parts", outcome.receipt.parts)
            return outcome

    async def _send(
        self,
        action: Action,
        conversation: ConversationRef,
        run_id: str,
        logical: str,
        ordinal: int,
        facts: str,
        durable: bool,
        attempt: int,
    ) -> SendOutcome:
        key = idempotency_key(run_id, logical, ordinal)
        record: dict[str, Any] = {"state": "claimed", "epoch": self.lease.epoch, "kind": action.kind, "at": time.time()}
        if durable:
            record |= {"attempts": attempt, "action": action.model_dump(mode="json")}
        claimed = json.dumps(record)
        keys = [*self._fenced_keys(), self._keys.shard.stats]
        args: list[scripts.ScriptArg] = [self.lease.token, key, claimed]
        if facts:
            keys.append(self._keys.events)
            args += [facts, self.events_maxlen]
        verdict = await self._write(scripts.OUTBOX_CLAIM, keys, args)
        self.used.append(key)
        state, ids = _verdict(verdict)
        if state == "sent":
            return SendOutcome(key, Receipt(platform_ids=tuple(ids), parts=len(ids)), skipped=True)
        if state == "reclaimed":
            logger.warning("re-sending %s for %s after an unrecorded earlier attempt", logical, self.lease.session)
        context = CURRENT_SEND.set(key)
        send = OutboxSend(self, key, conversation, ids)
        try:
            receipt = await self._perform_with_retries(action, conversation, send)
        except DeliveryError as err:
            # the platform refused it: nothing was delivered, so a retry is not a duplicate
            await send.record_unrecorded()
            failed = json.dumps(record | {"state": "failed", "error": str(err)[:300]}) if durable else ""
            await self._record(key, failed)
            raise
        except BaseException:
            with contextlib.suppress(Exception):  # stopped mid-send: what went out stays known, if it can be written
                await asyncio.shield(send.record_unrecorded())
            raise
        finally:
            CURRENT_SEND.reset(context)
        sent = record | {"state": "sent", "at": time.time(), "platform_ids": list(receipt.platform_ids)}
        sent["parts"] = receipt.parts
        await self._record(key, json.dumps(sent))
        return SendOutcome(key, receipt, skipped=False)

    async def pending(self, run_id: str, logical: str, ordinal: int = 0) -> PendingSend | None:
        """The durable send an earlier attempt at ``run_id`` recorded under ``logical``, if any.

        A record found is this outbox's from now on: it is dropped with the turn's ack (:attr:`used`).
        """
        key = idempotency_key(run_id, logical, ordinal)
        raw = await self.redis.hget(self._keys.outbox, key)
        if raw is None:
            return None
        self.used.append(key)
        try:
            record = json.loads(raw)
            action = _ACTION.validate_python(record["action"])
        except (ValueError, KeyError, TypeError, ValidationError):
            return None  # a plain claim (not durable), or a record this version does not read
        return PendingSend(action, str(record["state"]), int(record.get("attempts", 1)), int(record.get("parts", 1)))

    async def recorded_ids(self, run_id: str, logical: str, ordinal: int = 0) -> tuple[str, ...]:
        """Platform ids recorded for a send (delivered, or the parts an unfinished one delivered); ``()`` if none."""
        raw = await self.redis.hget(self._keys.outbox, idempotency_key(run_id, logical, ordinal))
        if raw is None:
            return ()
        try:
            record = json.loads(raw)
            ids = record.get("platform_ids") if record.get("state") == "sent" else record.get("progress")
        except (ValueError, AttributeError):
            return ()
        return tuple(str(i) for i in ids) if isinstance(ids, list) else ()

    async def hold(self, conversation: ConversationRef, seconds: float) -> None:
        """Hold the chat's buckets for ``seconds`` (the platform said 429), for every worker."""
        if self.buckets is not None and self.capabilities is not None and seconds > 0:
            await self.buckets.hold(conversation, self.capabilities(conversation), seconds)

    async def _perform_with_retries(self, action: Action, conversation: ConversationRef, send: OutboxSend) -> Receipt:
        for attempt in range(MAX_RATE_LIMIT_RETRIES + 1):
            try:
                return await self._perform(action, conversation, send)
            except RateLimitedError as err:
                wait = max(err.retry_after, 0.0)
                await self.hold(conversation, wait)
                if attempt == MAX_RATE_LIMIT_RETRIES or self.waited_s + wait > self.max_wait_s:
                    raise  # the turn's waits add up to max_wait_s at most, however the platform splits them
                logger.info("%s rate-limited; retrying the send in %.2f s", err.channel, wait)
                await self._sleep(wait)
                self.waited_s += wait
        raise AssertionError("unreachable")  # pragma: no cover

    async def _record(self, key: str, record: str) -> None:
        """Write the send's outcome (``''`` drops a clean failure's claim; recorded parts are kept either way)."""
        await self._write(scripts.OUTBOX_RECORD, self._fenced_keys(), [self.lease.token, key, record])

    async def _write(self, script: scripts.Script, keys: list[str], args: list[scripts.ScriptArg]) -> Any:
        """Run a fenced outbox script; with ``ack_replicas``, wait (bounded) for the replicas to have its write."""
        session, epoch = self.lease.session, self.lease.epoch
        if not self.ack_replicas:
            return await script(self.redis, keys, args, session=session, epoch=epoch)
        reply, acked = await script.replicated(
            self.redis,
            keys,
            args,
            replicas=self.ack_replicas,
            timeout_ms=self.ack_timeout_ms,
            rounds=HOLD_ROUNDS,
            session=session,
            epoch=epoch,
        )
        if acked < self.ack_replicas:
            logger.warning(
                "%s: %d of %d replicas have the send's state; going ahead", script.name, acked, self.ack_replicas
            )
        return reply


def _verdict(raw: Any) -> tuple[str, list[str]]:
    """``outbox_claim.lua``'s answer: the verdict, and the platform ids recorded so far."""
    verdict, ids = raw
    state = verdict.decode() if isinstance(verdict, bytes) else str(verdict)
    parsed = json.loads(ids)
    return state, [str(i) for i in parsed] if isinstance(parsed, list) else []
