"""Stopping a running turn: ``/stop`` from the user, or ``switchboard sessions stop KEY`` from an operator.

A stop request sets a short-lived flag and publishes the session key on its shard's cancel channel (``SPUBLISH``);
the worker running that turn cancels it, model request and tool call included. Only the running turn stops, and
``/stop`` itself is answered in order, so the user always hears back. The ``interrupt`` busy policy uses the same
path, with a reason that tells it apart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import assert_never

import redis.asyncio as aioredis

from switchboard.core.inbound import STOP_COMMAND_NAMES
from switchboard.core.messages import (
    ChoiceSelected,
    CommandIssued,
    ExternalEvent,
    InboundMessage,
    MessageDeleted,
    MessageEdited,
    OperatorActed,
    Posted,
    Scheduled,
)
from switchboard.queue.keys import SessionKeys
from switchboard.queue.shards import SHARDS
from switchboard.queue.shardwork import ShardListener
from switchboard.types import SessionKey

__all__ = [
    "CANCEL_TTL_MS",
    "STOP_COMMANDS",
    "interrupt_record",
    "interrupting_message",
    "is_stop",
    "listen_for_stops",
    "request_stop",
    "stop_requested_since",
]

logger = logging.getLogger(__name__)

STOP_COMMANDS = frozenset({"/stop", "/cancel"})
"""Messages that stop the running turn instead of starting one."""
CANCEL_TTL_MS = 120_000
"""How long a stop request is remembered (a turn starting later than this is not affected)."""

_INTERRUPTED = "interrupted by a newer message "
"""An interrupt's stop reason: this, then the id of the message that interrupted."""


def is_stop(message: InboundMessage) -> bool:
    """Whether the message asks to stop the running turn: a ``stop``/``cancel`` command, or ``/stop`` typed."""
    event = message.event
    match event:
        case CommandIssued(name=name):
            return name in STOP_COMMAND_NAMES
        case Posted():
            return message.text.strip().lower() in STOP_COMMANDS
        case ChoiceSelected() | MessageEdited() | MessageDeleted() | OperatorActed() | ExternalEvent() | Scheduled():
            return False
        case _:
            assert_never(event)


def interrupt_record(message_id: str, at: float) -> str:
    """The stop request (JSON) a message that interrupts the running turn leaves under ``SessionKeys.cancel``."""
    return json.dumps({"reason": _INTERRUPTED + message_id, "at": at})


def interrupting_message(reason: str) -> str | None:
    """The id of the message that asked for this stop when it is an interrupt (``None``: a real stop)."""
    return reason[len(_INTERRUPTED) :] if reason.startswith(_INTERRUPTED) else None


async def request_stop(redis: aioredis.Redis, session: SessionKey, *, reason: str) -> int:
    """Ask whichever worker runs ``session``'s turn to stop it; returns how many workers heard it."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(SessionKeys(session).cancel, json.dumps({"reason": reason, "at": time.time()}), px=CANCEL_TTL_MS)
        pipe.spublish(SessionKeys(session).shard.cancel, session)
        _, heard = await pipe.execute()
    return int(heard)


async def stop_requested_since(redis: aioredis.Redis, session: SessionKey, since: float) -> str | None:
    """The reason of a stop asked at or after ``since`` (Unix time), if any."""
    raw = await redis.get(SessionKeys(session).cancel)
    if not raw:
        return None
    data = json.loads(raw)
    return str(data["reason"]) if float(data.get("at", 0)) >= since else None


async def listen_for_stops(
    redis: aioredis.Redis, on_stop: Callable[[SessionKey, str], bool], stop: asyncio.Event
) -> None:
    """Call ``on_stop(session, reason)`` for every stop request of every shard until ``stop`` is set.

    What a process running drains outside the worker listens with (the worker listens to its shards' channels with
    its own :class:`~switchboard.queue.shardwork.ShardListener`).
    """
    listener = ShardListener(
        redis,
        on_ready=lambda shard: None,
        on_stop=on_stop,
        reason_of=lambda session: stop_requested_since(redis, session, 0.0),
    )
    listener.watch((), range(SHARDS))
    await listener.run(stop)
