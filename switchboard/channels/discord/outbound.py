"""Discord sends: messages into a channel, or answers through an interaction's webhook while its token lives.

A reply to a slash command or a click goes through the interaction: its first part replaces the deferred
"thinking…" response (``PATCH /webhooks/{app}/{token}/messages/@original``) and further parts are follow-ups
(``POST /webhooks/{app}/{token}``). The token lives 15 minutes; after that (and for gateway messages) parts
are channel messages (``POST /channels/{id}/messages``) carrying a ``nonce`` derived from the send's
idempotency key and the part number with ``enforce_nonce``, so Discord itself returns the existing message when
a retry re-sends a part it already created. Every message says ``allowed_mentions: {"parse": []}``: text the
model wrote never pings anyone.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from switchboard.channels.base import SendContext
from switchboard.channels.discord.api import DiscordApiError, DiscordRest, Upload
from switchboard.channels.parts import SentParts
from switchboard.core.messages import ConversationRef

__all__ = ["NO_MENTIONS", "Poster", "message_nonce"]

NO_MENTIONS: dict[str, Any] = {"parse": []}
_LOADING = 1 << 7
"""Message flag of a deferred interaction response still "thinking"."""
_TOKEN_MARGIN_S = 60
"""Stop using an interaction token this long before it expires (a send may take a while)."""


def message_nonce(idempotency_key: str, part: int) -> str:
    """Discord's ``nonce`` (at most 25 characters) for one part of one logical send."""
    return hashlib.sha256(f"{idempotency_key}\x00{part}".encode()).hexdigest()[:25]


def _id(answer: Any, what: str) -> str:
    if isinstance(answer, dict) and answer.get("id"):
        return str(answer["id"])
    raise DiscordApiError(f"discord {what}: answer without a message id", status=200, code=None, retryable=True)


class Poster:
    """Posts and edits messages for one account."""

    def __init__(self, rest: DiscordRest) -> None:
        self.rest = rest

    @staticmethod
    def channel_id(conversation: ConversationRef) -> str:
        """Where messages for the conversation go (the thread, when it is one)."""
        return conversation.extra.get("channel_id") or conversation.thread or conversation.conversation

    @staticmethod
    def interaction(conversation: ConversationRef, now: float | None = None) -> tuple[str, str] | None:
        """``(application id, token)`` of the interaction being answered, while its token is usable."""
        extra = conversation.extra
        token, app, expires = (
            extra.get("interaction_token"),
            extra.get("application_id"),
            extra.get("interaction_expires"),
        )
        if not token or not app or not (expires or "").isdigit():
            return None
        if (time.time() if now is None else now) > int(expires or 0) - _TOKEN_MARGIN_S:
            return None
        return app, token

    @staticmethod
    def _major(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()[:16]

    async def post(
        self,
        conversation: ConversationRef,
        content: str,
        *,
        key: str,
        part: int,
        components: list[dict[str, Any]] | None = None,
        files: list[Upload] | None = None,
    ) -> str:
        """Send one message; returns its id."""
        payload: dict[str, Any] = {"content": content, "allowed_mentions": NO_MENTIONS}
        if components:
            payload["components"] = components
        if files:
            payload["attachments"] = [{"id": i, "filename": f.name} for i, f in enumerate(files)]
        interaction = self.interaction(conversation)
        if interaction is not None:
            return await self._answer(interaction, payload, part, files)
        payload["nonce"], payload["enforce_nonce"] = message_nonce(key, part), True
        reply_to = conversation.extra.get("reply_to")
        if part == 0 and reply_to:
            payload["message_reference"] = {"message_id": reply_to, "fail_if_not_exists": False}
        channel = self.channel_id(conversation)
        answer = await self.rest.request(
            "POST",
            "/channels/{channel_id}/messages",
            major=channel,
            path=f"/channels/{channel}/messages",
            json_body=payload,
            files=files,
        )
        return _id(answer, "create message")

    async def _answer(
        self, interaction: tuple[str, str], payload: dict[str, Any], part: int, files: list[Upload] | None
    ) -> str:
        app, token = interaction
        base, major = f"/webhooks/{app}/{token}", self._major(token)
        if part == 0:
            original_route = "/webhooks/{application_id}/{token}/messages/@original"
            try:
                original = await self.rest.request(
                    "GET", original_route, major=major, path=f"{base}/messages/@original", auth=False
                )
            except DiscordApiError as exc:
                if exc.status != 404:
                    raise
                original = None  # no response was made (a gateway interaction whose answer failed)
            if isinstance(original, dict) and (
                int(original.get("flags") or 0) & _LOADING or original.get("content") == payload["content"]
            ):
                answer = await self.rest.request(
                    "PATCH", original_route, major=major, path=f"{base}/messages/@original", json_body=payload,
                    files=files, auth=False,
                )  # fmt: skip
                return _id(answer, "edit original response")
        answer = await self.rest.request(
            "POST", "/webhooks/{application_id}/{token}", major=major, path=base, json_body=payload, files=files,
            params={"wait": "true"}, auth=False,
        )  # fmt: skip
        return _id(answer, "follow-up message")

    async def edit(self, conversation: ConversationRef, message_id: str, content: str) -> None:
        """Replace a message's text (through the interaction's webhook while its token lives)."""
        payload = {"content": content, "allowed_mentions": NO_MENTIONS}
        interaction = self.interaction(conversation)
        if interaction is not None:
            app, token = interaction
            await self.rest.request(
                "PATCH", "/webhooks/{application_id}/{token}/messages/{message_id}", major=self._major(token),
                path=f"/webhooks/{app}/{token}/messages/{message_id}", json_body=payload, auth=False,
            )  # fmt: skip
            return
        channel = self.channel_id(conversation)
        await self.rest.request(
            "PATCH", "/channels/{channel_id}/messages/{message_id}", major=channel,
            path=f"/channels/{channel}/messages/{message_id}", json_body=payload,
        )  # fmt: skip

    async def post_parts(
        self,
        conversation: ConversationRef,
        parts: list[str],
        send: SendContext,
        *,
        components: list[list[dict[str, Any]]] | None = None,
        key_suffix: str = "",
        skip: int = 0,
    ) -> list[str]:
        """Send ``parts`` in order, resuming after those ``send.sent`` lists; ``components[i]`` go on part ``i``.

        ``skip`` parts of ``send.sent`` belong to an earlier step of the same send (a stream's first message).
        """
        sent = SentParts(send, skip=skip)

        async def post(index: int, part: str) -> str:
            await send.pace()
            rows = components[index] if components and index < len(components) else None
            return await self.post(
                conversation, part, key=send.idempotency_key + key_suffix, part=index, components=rows
            )

        await sent.send(parts, post)
        return sent.ids

    async def callback(self, interaction_id: str, token: str, answer: bytes) -> None:
        """Answer an interaction that came over the gateway (``POST /interactions/{id}/{token}/callback``)."""
        await self.rest.request(
            "POST", "/interactions/{interaction_id}/{token}/callback", major=self._major(token),
            path=f"/interactions/{interaction_id}/{token}/callback", json_body=json.loads(answer), auth=False,
        )  # fmt: skip
