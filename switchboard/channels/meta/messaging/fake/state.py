"""The fake Send API's memory and its checks: what Meta would refuse, refused with Meta's error shapes.

One fake serves one flavour, ``messenger`` or ``instagram``, each with its own text limit, and checks what the two
share: a recipient, a message or a lone sender action, the messaging type, quick replies within Meta's limits.
Conversations whose 24-hour window is closed refuse everything but a ``HUMAN_AGENT``-tagged message, as Meta does.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

__all__ = ["FAKE_STATE", "FakeCall", "FakeGraphState", "Flavour", "Planned", "graph_error"]

Flavour = Literal["messenger", "instagram"]
_ACTIONS = frozenset({"typing_on", "typing_off", "mark_seen"})
_TYPES = frozenset({"RESPONSE", "UPDATE", "MESSAGE_TAG"})
_TAGS = frozenset({"HUMAN_AGENT", "ACCOUNT_UPDATE", "CONFIRMED_EVENT_UPDATE", "POST_PURCHASE_UPDATE"})
_ATTACHMENTS = frozenset({"image", "video", "audio", "file"})


def graph_error(message: str, code: int, subcode: int | None = None, status: int = 400) -> web.Response:
    """An error in the Graph API's shape."""
    error: dict[str, Any] = {"message": message, "type": "OAuthException", "code": code, "fbtrace_id": "AfakeTrace"}
    if subcode is not None:
        error["error_subcode"] = subcode
    return web.json_response({"error": error}, status=status)


@dataclass(slots=True)
class FakeCall:
    """One call the fake received (``body`` is the JSON, or the multipart fields with ``filedata`` sizes)."""

    seq: int
    path: str
    body: dict[str, Any]
    time: float
    status: int = 200
    error: int | None = None
    """The Graph error code answered, if any."""

    def to_json(self) -> dict[str, Any]:
        """The call as ``/_fake/calls`` serves it."""
        return {
            "seq": self.seq,
            "path": self.path,
            "body": self.body,
            "status": self.status,
            "error": self.error,
            "time": self.time,
        }

    @property
    def recipient(self) -> str:
        """``recipient.id`` of the call."""
        recipient = self.body.get("recipient")
        return str(recipient.get("id", "")) if isinstance(recipient, dict) else ""


@dataclass(slots=True)
class Planned:
    """An error to answer instead of the real answer (``status`` 0: the real answer after ``delay_s``)."""

    status: int
    code: int
    subcode: int | None = None
    delay_s: float = 0.0


@dataclass
class FakeGraphState:
    """What the fake remembers."""

    flavour: Flavour
    token: str | None
    calls: list[FakeCall] = field(default_factory=list)
    plan: list[Planned] = field(default_factory=list)
    closed: set[str] = field(default_factory=set)
    """Recipients whose standard messaging window is closed."""
    hosted: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    """Media served at ``/_fake/cdn/<name>`` (what inbound attachments' ``payload.url`` points at)."""
    accounts: dict[str, str] = field(default_factory=dict)
    """Further tokens the fake accepts → the Page / account id ``GET /me`` names for each."""
    redirects: dict[str, str] = field(default_factory=dict)
    """``/_fake/lookaside/<name>`` → where it redirects (default: ``/_fake/cdn/<name>``)."""
    base_url: str = ""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, path: str, body: dict[str, Any], status: int, error: int | None) -> FakeCall:
        """Remember one call and wake readers waiting for calls."""
        call = FakeCall(len(self.calls) + 1, path, body, time.time(), status, error)
        self.calls.append(call)
        self._changed.set()
        self._changed = asyncio.Event()
        return call

    def accepts(self, token: str) -> bool:
        """Whether ``token`` is one the fake knows (any, when it was started without one)."""
        return self.token is None or token == self.token or token in self.accounts

    def next_mid(self) -> str:
        """A fresh ``message_id``."""
        return f"m_fake{next(self._ids):08d}"

    def close_window(self, recipient: str) -> None:
        """Refuse untagged messages to ``recipient`` from now on (its 24-hour window closed)."""
        self.closed.add(recipient)

    def delivered(self, recipient: str | None = None) -> list[FakeCall]:
        """Successful message sends (not sender actions), optionally to one recipient."""
        return [
            c
            for c in self.calls
            if c.status == 200 and "message" in c.body and (recipient is None or c.recipient == recipient)
        ]

    def actions(self, recipient: str | None = None) -> list[str]:
        """The sender actions accepted, in order, optionally to one recipient."""
        return [
            str(c.body["sender_action"])
            for c in self.calls
            if c.status == 200 and "sender_action" in c.body and (recipient is None or c.recipient == recipient)
        ]

    def check(self, body: dict[str, Any]) -> web.Response | None:
        """Meta's refusal of a Send API body, or ``None`` when it would be accepted."""
        recipient = body.get("recipient")
        if not isinstance(recipient, dict) or not isinstance(recipient.get("id"), str) or not recipient["id"]:
            return graph_error("(#100) The parameter recipient is required", 100)
        action, message = body.get("sender_action"), body.get("message")
        if action is not None:
            if message is not None or action not in _ACTIONS:
                return graph_error("(#100) sender_action must be typing_on, typing_off or mark_seen alone", 100)
            return None
        if not isinstance(message, dict):
            return graph_error("(#100) The parameter message is required", 100)
        kind, tag = body.get("messaging_type"), body.get("tag")
        if self.flavour == "messenger" and kind is None:
            return graph_error("(#100) The parameter messaging_type is required", 100)
        if kind is not None and kind not in _TYPES:
            return graph_error("(#100) Invalid messaging_type", 100)
        if kind == "MESSAGE_TAG" and tag not in _TAGS:
            return graph_error("(#100) Param tag must be a valid message tag", 100)
        if recipient["id"] in self.closed and tag != "HUMAN_AGENT":
            return graph_error(
                "(#10) This message is sent outside of allowed window.", 10, 2018278 if kind != "UPDATE" else 2534022
            )
        return self._check_message(message)

    def _check_message(self, message: dict[str, Any]) -> web.Response | None:
        text, attachment = message.get("text"), message.get("attachment")
        if text is None and attachment is None:
            return graph_error("(#100) Message must have text or an attachment", 100)
        if text is not None:
            if not isinstance(text, str) or not text:
                return graph_error("(#100) Message text must be a non-empty string", 100)
            too_long = len(text.encode()) > 1000 if self.flavour == "instagram" else len(text) > 2000
            if too_long:
                limit = "1000 bytes" if self.flavour == "instagram" else "2000 characters"
                return graph_error(f"(#100) Length of param message[text] must be less than or equal to {limit}", 100)
        if attachment is not None and (not isinstance(attachment, dict) or attachment.get("type") not in _ATTACHMENTS):
            return graph_error("(#100) Unsupported attachment type", 100)
        replies = message.get("quick_replies")
        if replies is not None:
            if not isinstance(replies, list) or not 1 <= len(replies) <= 13:
                return graph_error("(#100) param message[quick_replies] must have between 1 and 13 elements", 100)
            for reply in replies:
                if not isinstance(reply, dict) or reply.get("content_type") != "text":
                    return graph_error("(#100) quick reply content_type must be text", 100)
                title, payload = reply.get("title"), reply.get("payload")
                if not isinstance(title, str) or not 0 < len(title) <= 20:
                    return graph_error("(#100) Quick reply title must be 1-20 characters", 100)
                if not isinstance(payload, str) or not 0 < len(payload) <= 1000:
                    return graph_error("(#100) Quick reply payload must be 1-1000 characters", 100)
        return None


FAKE_STATE = web.AppKey("fake_graph_state", FakeGraphState)
