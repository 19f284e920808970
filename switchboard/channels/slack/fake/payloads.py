"""Slack's inbound payloads as Slack sends them, and its request signature: for tests, benchmarks and ``simulate``.

:func:`make_event` builds an Events API ``event_callback`` (a DM, a channel mention, a thread reply, a file share),
:func:`make_block_actions` an interactivity click, and :func:`sign_request` the ``X-Slack-Signature`` /
``X-Slack-Request-Timestamp`` headers over the exact bytes sent — signed for real with the signing secret.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from typing import Any
from urllib.parse import urlencode

__all__ = [
    "BOT_ID",
    "BOT_USER_ID",
    "TEAM_ID",
    "form_body",
    "make_block_actions",
    "make_event",
    "make_slash_command",
    "sign",
    "sign_request",
]

TEAM_ID = "T0SWITCH"
BOT_USER_ID = "U0BOTUSER"
BOT_ID = "B0BOTID"
_SEQ = itertools.count(1)


def sign(secret: str, timestamp: int | str, body: bytes) -> str:
    """``v0=`` + hex HMAC-SHA256 of ``v0:{timestamp}:{body}`` keyed with the signing secret."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def sign_request(
    payload: dict[str, Any] | bytes, secret: str, *, timestamp: int | None = None, form: bool = False
) -> tuple[bytes, dict[str, str]]:
    """The body and headers Slack would send for ``payload`` (JSON; ``form`` wraps it as ``payload=…``)."""
    if isinstance(payload, bytes):
        body = payload
    elif form:
        body = form_body(payload)
    else:
        body = json.dumps(payload, ensure_ascii=False).encode()
    stamp = int(time.time()) if timestamp is None else timestamp
    headers = {
        "Content-Type": "application/x-www-form-urlencoded" if form else "application/json",
        "X-Slack-Request-Timestamp": str(stamp),
        "X-Slack-Signature": sign(secret, stamp, body),
    }
    return body, headers


def form_body(payload: dict[str, Any]) -> bytes:
    """An interactivity body: ``payload=<url-encoded JSON>``."""
    return urlencode({"payload": json.dumps(payload, ensure_ascii=False)}).encode()


def _ts() -> str:
    return f"{int(time.time())}.{next(_SEQ):06d}"


def make_event(
    text: str,
    *,
    channel: str = "D0DIRECT",
    channel_type: str = "im",
    user: str = "U0HUMAN",
    ts: str | None = None,
    thread_ts: str | None = None,
    event_type: str = "message",
    event_id: str | None = None,
    subtype: str | None = None,
    files: list[dict[str, Any]] | None = None,
    bot_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An Events API ``event_callback`` for one message event (add fields of the event with ``extra``)."""
    stamp = ts or _ts()
    event: dict[str, Any] = {
        "type": event_type,
        "channel": channel,
        "user": user,
        "text": text,
        "ts": stamp,
        "event_ts": stamp,
        "channel_type": channel_type,
    }
    if event_type == "app_mention":
        del event["channel_type"]
    for key, value in (("thread_ts", thread_ts), ("subtype", subtype), ("files", files), ("bot_id", bot_id)):
        if value is not None:
            event[key] = value
    event.update(extra)
    return {
        "token": "verification-token-unused",
        "team_id": TEAM_ID,
        "api_app_id": "A0SWITCH",
        "event": event,
        "type": "event_callback",
        "event_id": event_id or f"Ev{next(_SEQ):08d}",
        "event_time": int(float(stamp)),
        "authorizations": [{"team_id": TEAM_ID, "user_id": BOT_USER_ID, "is_bot": True}],
    }


def make_block_actions(
    option_id: str,
    *,
    label: str = "Yes",
    channel: str = "D0DIRECT",
    user: str = "U0HUMAN",
    message_ts: str = "1700000000.000100",
    thread_ts: str | None = None,
    action_ts: str | None = None,
) -> dict[str, Any]:
    """A ``block_actions`` payload: ``user`` clicked the button of ``option_id`` on the message ``message_ts``."""
    message: dict[str, Any] = {"type": "message", "ts": message_ts, "bot_id": BOT_ID, "text": "Pick one"}
    if thread_ts:
        message["thread_ts"] = thread_ts
    return {
        "type": "block_actions",
        "user": {"id": user, "username": "human", "name": "human", "team_id": TEAM_ID},
        "api_app_id": "A0SWITCH",
        "team": {"id": TEAM_ID, "domain": "switchboard"},
        "container": {"type": "message", "message_ts": message_ts, "channel_id": channel, "is_ephemeral": False},
        "trigger_id": f"{next(_SEQ)}.trigger",
        "channel": {"id": channel, "name": "directmessage"},
        "message": message,
        "response_url": "https://hooks.slack.com/actions/T0SWITCH/1/unused",
        "actions": [
            {
                "action_id": option_id,
                "block_id": "switchboard_choice",
                "text": {"type": "plain_text", "text": label, "emoji": True},
                "value": option_id,
                "type": "button",
                "action_ts": action_ts or f"{time.time():.6f}",
            }
        ],
    }


def make_slash_command(
    command: str,
    text: str = "",
    *,
    channel: str = "C0GENERAL",
    channel_name: str = "general",
    user: str = "U0HUMAN",
    trigger_id: str | None = None,
) -> bytes:
    """A slash command's body as Slack posts it to the command's Request URL (form-encoded fields, no ``payload``)."""
    seq = next(_SEQ)
    return urlencode(
        {
            "token": "verification-token-unused",
            "team_id": TEAM_ID,
            "team_domain": "switchboard",
            "channel_id": channel,
            "channel_name": channel_name,
            "user_id": user,
            "user_name": "human",
            "command": command,
            "text": text,
            "api_app_id": "A0SWITCH",
            "is_enterprise_install": "false",
            "response_url": f"https://hooks.slack.com/commands/{TEAM_ID}/{seq}/unused",
            "trigger_id": trigger_id or f"{seq}.{seq}.trigger",
        }
    ).encode()
