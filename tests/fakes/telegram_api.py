"""The fake Telegram Bot API for tests (the one shipped in the package; ``switchboard simulate`` uses it too), and a
send context for driving the adapter directly."""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass, field
from pathlib import Path

from switchboard.channels.base import FileData
from switchboard.channels.telegram.fake.platform import (
    FAKE_STATE,
    SECRET_HEADER,
    FakeCall,
    FakeTelegram,
    FakeTelegramState,
    check_html,
    create_fake_telegram,
    make_callback_query,
    make_update,
    sign_update,
)
from switchboard.errors import DeliveryError

__all__ = [
    "FAKE_STATE",
    "SECRET_HEADER",
    "FakeCall",
    "FakeTelegram",
    "FakeTelegramState",
    "RecordingSend",
    "check_html",
    "create_fake_telegram",
    "make_callback_query",
    "make_update",
    "sign_update",
]


@dataclass
class RecordingSend:
    """A :class:`~switchboard.channels.base.SendContext` that keeps its record in memory (one send's outbox record).

    ``sent`` starts with what an earlier attempt recorded; ``paced`` counts the tokens taken; files are read from
    ``workspace``. Used again after a failure, it resumes like the outbox does.
    """

    idempotency_key: str = "send-1"
    recorded: list[str] = field(default_factory=list)
    workspace: Path | None = None
    paced: int = 0

    @property
    def sent(self) -> tuple[str, ...]:
        return tuple(self.recorded)

    async def part_sent(self, platform_id: str) -> None:
        self.recorded.append(platform_id)

    async def pace(self) -> None:
        self.paced += 1

    async def read_file(self, path: str) -> FileData:
        if self.workspace is None:
            raise DeliveryError("no workspace", channel="telegram", retryable=False)
        target = (self.workspace / path).resolve()
        if not target.is_relative_to(self.workspace.resolve()) or not target.is_file():
            raise DeliveryError(f"no such file: {path}", channel="telegram", retryable=False)
        return FileData(target.name, target.read_bytes(), mimetypes.guess_type(target.name)[0])
