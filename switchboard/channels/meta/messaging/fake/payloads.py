"""Messenger Platform webhook deliveries as Meta sends them (Messenger and Instagram), signed for real.

:func:`make_delivery` wraps messaging items in ``{"object": "page" | "instagram", "entry": [...]}``;
:func:`text_item`, :func:`quick_reply_item`, :func:`postback_item` build the items a user's app causes;
:func:`sign_delivery` serialises like Meta (``ensure_ascii=True``: ``é`` travels escaped, as six ASCII bytes)
and adds the ``X-Hub-Signature-256`` header over the exact bytes sent.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any, Literal

from switchboard.channels.meta.webhook import SIGNATURE_HEADER, sign

__all__ = [
    "IG_ACCOUNT_ID",
    "PAGE_ID",
    "make_delivery",
    "postback_item",
    "quick_reply_item",
    "sign_delivery",
    "text_item",
]

PAGE_ID = "106000000000001"
"""The fake's Facebook Page id (``entry[].id`` of Messenger deliveries)."""
IG_ACCOUNT_ID = "17841400000000001"
"""The fake's Instagram professional account id (``entry[].id`` of Instagram deliveries)."""
_SEQ = itertools.count(1)


def _now_ms() -> int:
    return int(time.time() * 1000)


def text_item(
    text: str, *, user: str, account: str, mid: str | None = None, reply_to: str | None = None
) -> dict[str, Any]:
    """A user's text message to ``account`` (Page or Instagram account id)."""
    message: dict[str, Any] = {"mid": mid or f"m_{next(_SEQ):08d}", "text": text}
    if reply_to:
        message["reply_to"] = {"mid": reply_to}
    return {"sender": {"id": user}, "recipient": {"id": account}, "timestamp": _now_ms(), "message": message}


def quick_reply_item(title: str, payload: str, *, user: str, account: str, mid: str | None = None) -> dict[str, Any]:
    """A tap on a quick reply: the title as text, the payload the bot offered it with."""
    item = text_item(title, user=user, account=account, mid=mid)
    item["message"]["quick_reply"] = {"payload": payload}
    return item


def postback_item(title: str, payload: str, *, user: str, account: str, mid: str | None = None) -> dict[str, Any]:
    """A tap on a postback button (template button, persistent menu, Get Started)."""
    return {
        "sender": {"id": user},
        "recipient": {"id": account},
        "timestamp": _now_ms(),
        "postback": {"mid": mid or f"m_{next(_SEQ):08d}", "title": title, "payload": payload},
    }


def make_delivery(
    kind: Literal["page", "instagram"], entries: list[tuple[str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    """``{"object": kind, "entry": [{"id", "time", "messaging"}]}`` for ``(account id, items)`` pairs."""
    return {
        "object": kind,
        "entry": [{"id": account, "time": _now_ms(), "messaging": items} for account, items in entries],
    }


def sign_delivery(payload: dict[str, Any] | bytes, app_secret: str) -> tuple[bytes, dict[str, str]]:
    """The body and headers Meta would send for ``payload``."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return body, {"Content-Type": "application/json", SIGNATURE_HEADER: sign(body, app_secret)}
