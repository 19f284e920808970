"""What Discord sends: gateway message events and interactions, and interactions signed with Ed25519.

:func:`signing_key` makes a local key pair (the public half is what ``SWITCHBOARD_DISCORD__PUBLIC_KEY`` takes);
:func:`sign_interaction` signs ``timestamp + raw body`` exactly as Discord does.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from typing import Any

from nacl.signing import SigningKey

__all__ = [
    "bot_token",
    "make_command",
    "make_component",
    "make_message",
    "make_ping",
    "sign_interaction",
    "signing_key",
    "snowflake",
]

_counter = itertools.count(1)
_EPOCH_MS = 1420070400000


def snowflake() -> str:
    """A fresh, increasing Discord id."""
    return str(((int(time.time() * 1000) - _EPOCH_MS) << 22) | (next(_counter) % 4096))


def bot_token(bot_id: str) -> str:
    """A bot token of Discord's shape for ``bot_id`` (its first segment is the id in base64)."""
    head = base64.b64encode(bot_id.encode()).decode().rstrip("=")
    return f"{head}.GfakeT.fake-token-signature-for-tests-only"


def signing_key() -> SigningKey:
    """A new Ed25519 key; ``key.verify_key.encode().hex()`` is the application's public key."""
    return SigningKey.generate()


def sign_interaction(
    payload: dict[str, Any] | bytes, key: SigningKey, *, timestamp: str | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of an interaction request as Discord sends it."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    stamp = timestamp if timestamp is not None else str(int(time.time()))
    signature = key.sign(stamp.encode() + body).signature.hex()
    headers = {"X-Signature-Ed25519": signature, "X-Signature-Timestamp": stamp, "Content-Type": "application/json"}
    return body, headers


def _user(user_id: str, name: str = "ada", *, bot: bool = False) -> dict[str, Any]:
    return {
        "id": user_id,
        "username": name,
        "global_name": name.title(),
        "discriminator": "0",
        "avatar": None,
        "bot": bot,
        "public_flags": 0,
    }


def make_message(
    content: str,
    *,
    channel_id: str = "300",
    guild_id: str | None = None,
    author_id: str = "501",
    author_bot: bool = False,
    mentions: list[str] | None = None,
    message_id: str | None = None,
    attachments: list[dict[str, Any]] | None = None,
    webhook_id: str | None = None,
) -> dict[str, Any]:
    """A ``MESSAGE_CREATE`` dispatch's ``d`` (a message object as the gateway sends it)."""
    message: dict[str, Any] = {
        "id": message_id or snowflake(),
        "type": 0,
        "channel_id": channel_id,
        "author": _user(author_id, bot=author_bot),
        "content": content,
        "timestamp": "2026-12-01T12:00:00.000000+00:00",
        "edited_timestamp": None,
        "tts": False,
        "mention_everyone": False,
        "mentions": [_user(m, "bot", bot=True) for m in mentions or ()],
        "mention_roles": [],
        "attachments": attachments or [],
        "embeds": [],
        "pinned": False,
        "flags": 0,
        "components": [],
    }
    if guild_id is not None:
        message["guild_id"] = guild_id
        message["member"] = {"nick": None, "roles": []}
    if webhook_id is not None:
        message["webhook_id"] = webhook_id
    return message


def _interaction(
    kind: int, *, application_id: str, channel_id: str, guild_id: str | None, user_id: str
) -> dict[str, Any]:
    interaction: dict[str, Any] = {
        "id": snowflake(),
        "application_id": application_id,
        "type": kind,
        "token": "aW50ZXJhY3Rpb246" + snowflake(),
        "version": 1,
        "channel_id": channel_id,
        "channel": {"id": channel_id, "type": 0 if guild_id else 1},
        "locale": "en-US",
        "app_permissions": "0",
    }
    if guild_id is not None:
        interaction["guild_id"] = guild_id
        interaction["member"] = {"user": _user(user_id), "nick": None, "roles": []}
    else:
        interaction["user"] = _user(user_id)
    return interaction


def make_ping(application_id: str = "900") -> dict[str, Any]:
    """A PING interaction (Discord checks the endpoint with it)."""
    return {"id": snowflake(), "application_id": application_id, "type": 1, "token": "ping-token", "version": 1}


def make_command(
    name: str,
    text: str | None = None,
    *,
    application_id: str = "900",
    channel_id: str = "300",
    guild_id: str | None = "200",
    user_id: str = "501",
    token: str | None = None,
) -> dict[str, Any]:
    """A slash command interaction (``/ask text``, ``/reset``, ``/stop``)."""
    interaction = _interaction(
        2, application_id=application_id, channel_id=channel_id, guild_id=guild_id, user_id=user_id
    )
    data: dict[str, Any] = {"id": snowflake(), "name": name, "type": 1}
    if text is not None:
        data["options"] = [{"name": "text", "type": 3, "value": text}]
    interaction["data"] = data
    if token is not None:
        interaction["token"] = token
    return interaction


def make_component(
    custom_id: str,
    *,
    message: dict[str, Any],
    application_id: str = "900",
    guild_id: str | None = "200",
    user_id: str = "501",
) -> dict[str, Any]:
    """A button click on ``message`` (a message object the bot sent, with its components)."""
    channel_id = str(message["channel_id"])
    interaction = _interaction(
        3, application_id=application_id, channel_id=channel_id, guild_id=guild_id, user_id=user_id
    )
    interaction["data"] = {"custom_id": custom_id, "component_type": 2}
    interaction["message"] = message
    return interaction
