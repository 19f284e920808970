"""Helpers of the approval chaos tests.

Ask for a gated ``refund`` over signed Telegram webhooks, find its buttons in the fake Bot API, press them (signed
``callback_query`` updates), and read the approval record back from Redis.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update, sign_update
from switchboard.core.approvals.records import ApprovalRecord
from switchboard.queue.approvals import record_from_fields
from switchboard.queue.keys import SessionKeys
from tests.waiting import wait_until

from .harness import SECRET, Gateway, chat_of, event_log, key_of, replies

__all__ = [
    "POLICY",
    "Buttons",
    "approval_of",
    "ask_refund",
    "buttons",
    "click",
    "command",
    "next_update_id",
    "post_update",
    "press",
    "record",
    "texts",
]

POLICY = """
rules:
  - {name: refunds, tool: refund, decide: approve, reason: refunds need a person}
approvals: {expire_after_s: EXPIRY, approvers: [requester, operators]}
"""
"""The agent's policy block: every ``refund`` waits for the requesting user or a console operator."""

_UPDATES = itertools.count(50_000_000)


def next_update_id() -> int:
    """A fresh Telegram ``update_id`` (so no two posts are deduplicated as one event)."""
    return next(_UPDATES)


async def post_update(gateway: Gateway, update: dict[str, Any]) -> int:
    """Sign ``update`` like Telegram and post it to the gateway; returns the HTTP status."""
    body, headers = sign_update(update, SECRET)
    status, _ = await gateway.post_raw(body, headers)
    return status


async def ask_refund(gateway: Gateway, session: int, ref: str, amount: int = 150) -> None:
    """The user of ``session`` asks the offline model to call ``refund``."""
    text = f'/tool refund {{"amount": {amount}, "ref": "{ref}"}}'
    status = await post_update(gateway, make_update(text, chat_id=chat_of(session), update_id=next_update_id()))
    assert status == 200, status


async def approval_of(redis: aioredis.Redis, session: int, *, timeout: float = 30) -> str:
    """Wait for ``session``'s (latest) approval request; returns its id."""
    found: list[str] = []

    async def requested() -> bool:
        ids = [e["approval_id"] for e in await event_log(redis, session) if e["kind"] == "approval_requested"]
        found[:] = ids[-1:]
        return bool(ids)

    await wait_until(requested, timeout=timeout, interval=0.05, what=f"an approval requested in session {session}")
    return found[0]


async def record(redis: aioredis.Redis, session: int, approval_id: str) -> ApprovalRecord:
    """The approval record as stored now."""
    fields = await redis.hgetall(SessionKeys(key_of(session)).approval(approval_id))
    found = record_from_fields(fields)
    assert found is not None, fields
    return found


class Buttons:
    """The approve and deny buttons of one offer message in the fake Telegram."""

    def __init__(self, chat: int, message_id: int, approve: str, deny: str) -> None:
        self.chat = chat
        self.message_id = message_id
        self.approve = approve
        self.deny = deny


async def buttons(fake: FakeTelegram, session: int, *, timeout: float = 30) -> Buttons:
    """Wait for the approval offer (an inline keyboard) in ``session``'s chat; its buttons (the latest offer)."""
    chat = chat_of(session)
    found: list[Buttons] = []

    def offered() -> bool:
        for (chat_id, message_id), markup in sorted(fake.state.markups.items(), key=lambda kv: -kv[0][1]):
            if chat_id != chat:
                continue
            flat = [b for row in markup.get("inline_keyboard", []) for b in row]
            data = [str(b.get("callback_data", "")) for b in flat]
            if len(data) >= 2:
                found.append(Buttons(chat, message_id, data[0], data[1]))
                return True
        return False

    await wait_until(offered, timeout=timeout, interval=0.05, what=f"an approval offer in chat {chat}")
    return found[0]


def command(text: str, session: int) -> dict[str, Any]:
    """A user's ``/command args`` message in ``session``'s chat, with the ``bot_command`` entity Telegram adds."""
    update = make_update(text, chat_id=chat_of(session), update_id=next_update_id())
    name = text.split()[0]
    update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(name)}]
    return update


def click(fake: FakeTelegram, found: Buttons, data: str, *, user_id: int | None = None) -> dict[str, Any]:
    """The signed-to-be ``callback_query`` update of a tap on a button (by the chat's user, or ``user_id``)."""
    update = fake.press_button(found.chat, found.message_id, data, next_update_id())
    if user_id is not None:
        update["callback_query"]["from"]["id"] = user_id
    return update


async def press(gateway: Gateway, fake: FakeTelegram, found: Buttons, *, approve: bool = True) -> int:
    """Tap approve (or deny) as the chat's user; returns the webhook's HTTP status."""
    return await post_update(gateway, click(fake, found, found.approve if approve else found.deny))


def texts(fake: FakeTelegram, session: int) -> list[str]:
    """Every message the bot sent to ``session``'s chat, in order."""
    return [r.text for r in replies(fake) if r.chat_id == chat_of(session)]


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
