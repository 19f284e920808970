r"""WhatsApp Cloud API webhook deliveries as Meta sends them, signed with the app secret (tests, simulate, bench).

Bodies are serialised like Meta's (``ensure_ascii=True``: ``é`` travels as ``\u00e9``) and signed over those
exact bytes (``X-Hub-Signature-256: sha256=<hex>``).
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from typing import Any

from switchboard.channels.meta.webhook import SIGNATURE_HEADER, sign

__all__ = [
    "PHONE_NUMBER_ID",
    "WABA_ID",
    "delivery",
    "make_message",
    "make_status",
    "sign_request",
    "text_delivery",
]

PHONE_NUMBER_ID = "106540352242922"
"""The fake business number's id."""
WABA_ID = "102290129340398"
"""The fake WhatsApp Business Account id (``entry[].id``)."""
_SEQ = itertools.count(1)


def _wamid() -> str:
    return f"wamid.HBgL{secrets.token_hex(12).upper()}{next(_SEQ):06d}"


def make_message(
    kind: str = "text", *, sender: str = "15551234567", wamid: str | None = None, **part: Any
) -> dict[str, Any]:
    """One ``messages[]`` item: ``kind`` and its part (``text`` → ``body=``, ``image`` → ``id=`` …).

    ``context=`` (a dict) makes it a reply; for ``contacts`` pass ``contacts=[...]``.
    """
    message: dict[str, Any] = {
        "from": sender,
        "id": wamid or _wamid(),
        "timestamp": str(int(time.time())),
        "type": kind,
    }
    context = part.pop("context", None)
    if context is not None:
        message["context"] = context
    if kind == "contacts":
        message["contacts"] = part.pop("contacts", [])
    else:
        message[kind] = part
    return message


def make_status(
    status: str, *, wamid: str | None = None, recipient: str = "15551234567", **extra: Any
) -> dict[str, Any]:
    """One ``statuses[]`` item about a message the business sent."""
    return {
        "id": wamid or _wamid(),
        "status": status,
        "timestamp": str(int(time.time())),
        "recipient_id": recipient,
        **extra,
    }


def delivery(
    messages: list[dict[str, Any]] | None = None,
    *,
    statuses: list[dict[str, Any]] | None = None,
    phone_number_id: str = PHONE_NUMBER_ID,
    names: dict[str, str] | None = None,
    extra_changes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A delivery with one entry and one ``messages`` change (plus ``extra_changes`` in the same entry)."""
    messages = messages or []
    senders = names or {m["from"]: "Test User" for m in messages}
    value: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550001111", "phone_number_id": phone_number_id},
    }
    if messages:
        value["contacts"] = [{"profile": {"name": name}, "wa_id": wa_id} for wa_id, name in senders.items()]
        value["messages"] = messages
    if statuses:
        value["statuses"] = statuses
    changes = [{"value": value, "field": "messages"}, *(extra_changes or [])]
    return {"object": "whatsapp_business_account", "entry": [{"id": WABA_ID, "changes": changes}]}


def text_delivery(text: str, *, sender: str = "15551234567", phone_number_id: str = PHONE_NUMBER_ID) -> dict[str, Any]:
    """A delivery carrying one text message."""
    return delivery([make_message("text", sender=sender, body=text)], phone_number_id=phone_number_id)


def sign_request(payload: dict[str, Any] | bytes, app_secret: str) -> tuple[bytes, dict[str, str]]:
    """The body as Meta serialises it and its headers (signature, JSON content type)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return body, {SIGNATURE_HEADER: sign(body, app_secret), "Content-Type": "application/json"}
