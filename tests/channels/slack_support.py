"""Shared pieces of the Slack tests: a send context that records progress as the outbox does, and fixtures."""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchboard.channels.base import FileData
from switchboard.channels.slack.adapter import SlackChannel
from switchboard.channels.slack.settings import SlackSettings
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError

BOT_TOKEN = "xoxb-1-test-token"
APP_TOKEN = "xapp-1-test-token"
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@dataclass
class Progress:
    """A :class:`~switchboard.channels.base.SendContext`: the parts sent so far survive a failed attempt, as the
    outbox's record does, so a retry with the same object resumes where the last attempt stopped."""

    workspace: Path | None = None
    key: str = "reply-1"
    parts: list[str] = field(default_factory=list)
    paced: int = 0

    @property
    def idempotency_key(self) -> str:
        return self.key

    @property
    def sent(self) -> tuple[str, ...]:
        return tuple(self.parts)

    async def part_sent(self, platform_id: str) -> None:
        self.parts.append(platform_id)

    async def pace(self) -> None:
        self.paced += 1

    async def read_file(self, path: str) -> FileData:
        if self.workspace is None:
            raise DeliveryError("no workspace", channel="slack", retryable=False)
        target = (self.workspace / path).resolve()
        if not target.is_relative_to(self.workspace.resolve()) or not target.is_file():
            raise DeliveryError(f"no such file: {path}", channel="slack", retryable=False)
        return FileData(target.name, target.read_bytes(), mimetypes.guess_type(target.name)[0])


def slack_settings(api_url: str, **overrides: Any) -> SlackSettings:
    values: dict[str, Any] = {"bot_token": BOT_TOKEN, "signing_secret": SECRET, "api_base_url": api_url}
    return SlackSettings.model_validate({**values, **overrides})


def make_channel(api_url: str, **overrides: Any) -> SlackChannel:
    return SlackChannel(slack_settings(api_url, **overrides), account="default")


def dm(thread: str | None = None) -> ConversationRef:
    extra = {"channel": "D0DIRECT", "channel_type": "im", "user": "U0HUMAN", "team": "T0SWITCH"}
    if thread:
        extra["thread_ts"] = thread
    return ConversationRef(channel="slack", conversation="D0DIRECT", thread=thread, extra=extra)


def in_channel(thread: str = "1700000001.000100") -> ConversationRef:
    extra = {"channel": "C0GENERAL", "channel_type": "channel", "user": "U0HUMAN", "team": "T0SWITCH"}
    return ConversationRef(
        channel="slack", conversation="C0GENERAL", thread=thread, extra={**extra, "thread_ts": thread}
    )


@dataclass
class AttemptProgress(Progress):
    """As :class:`Progress`, but ``sent`` is what earlier attempts recorded (read once when the attempt began)."""

    earlier: list[str] = field(default_factory=list)

    @property
    def sent(self) -> tuple[str, ...]:
        return tuple(self.earlier)

    def next_attempt(self) -> None:
        self.earlier = list(self.parts)
