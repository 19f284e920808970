"""What the fake Telegram Bot API remembers: calls, sent messages, files, drafts, pending updates, planned failures."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FakeCall", "FakeFile", "FakeTelegramState", "StoredFile"]


@dataclass(slots=True)
class FakeCall:
    """One call the fake received."""

    seq: int
    method: str
    params: dict[str, Any]
    time: float
    status: int = 200

    def to_json(self) -> dict[str, Any]:
        """The call as served by ``/_fake/calls``."""
        return {"seq": self.seq, "method": self.method, "params": self.params, "time": self.time, "status": self.status}


@dataclass(frozen=True, slots=True)
class FakeFile:
    """A file uploaded with ``sendDocument``, ``sendPhoto`` or ``sendVoice``."""

    method: str
    chat_id: Any
    message_id: int
    filename: str
    content_type: str
    content: bytes
    caption: str | None = None

    @property
    def size(self) -> int:
        """Bytes received."""
        return len(self.content)


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file ``getFile`` knows (one a "user" sent, or one the bot uploaded), served at ``/file/bot<token>/<path>``."""

    file_id: str
    file_path: str
    content: bytes
    reported_size: int | None
    """What ``getFile`` says ``file_size`` is (``None``: left out, as Telegram may)."""


@dataclass(slots=True)
class _Planned:
    method: str | None
    status: int
    description: str
    retry_after: float | None
    skip: int = 0
    """Matching calls to let through first."""
    delay: float = 0.0
    """Seconds to wait before answering (a slow answer: with ``status`` 0 the real answer follows)."""


@dataclass
class FakeTelegramState:
    """What the fake remembers: the calls it received and the messages it "sent"."""

    token: str | None
    bot: dict[str, Any]
    calls: list[FakeCall] = field(default_factory=list)
    messages: dict[tuple[Any, int], str] = field(default_factory=dict)
    markups: dict[tuple[Any, int], dict[str, Any]] = field(default_factory=dict)
    """``reply_markup`` of the messages sent with one (the inline keyboards a user may tap)."""
    files: list[FakeFile] = field(default_factory=list)
    """Files received with ``sendDocument`` / ``sendPhoto`` / ``sendVoice``, in order."""
    stored: dict[str, StoredFile] = field(default_factory=dict)
    """Files ``getFile`` finds, by ``file_id``."""
    drafts: list[tuple[Any, int, str]] = field(default_factory=list)
    """``(chat_id, draft_id, text)`` of every ``sendMessageDraft``, in order."""
    answered: dict[str, str | None] = field(default_factory=dict)
    """``callback_query_id`` → the notice text of every ``answerCallbackQuery``."""
    webhook: dict[str, Any] = field(default_factory=dict)
    commands: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    """The command menus ``setMyCommands`` set, by scope (JSON of the scope and its ``language_code``)."""
    plan: list[_Planned] = field(default_factory=list)
    """Answers to give instead of the real ones, in order."""
    updates: list[dict[str, Any]] = field(default_factory=list)
    """Updates waiting for ``getUpdates`` (forgotten once a call's ``offset`` passes them)."""
    offsets: list[int | None] = field(default_factory=list)
    """The ``offset`` of every ``getUpdates`` call, in order."""
    polls_in_flight: int = 0
    max_polls_in_flight: int = 0
    """The most ``getUpdates`` calls that were open at once (a second one ends the first with 409, as Telegram)."""
    poll_generation: int = 0
    poll_hooks: list[Callable[[int | None], Awaitable[None]]] = field(default_factory=list)
    """Awaited with the ``offset`` of every ``getUpdates`` call as it arrives (tests check what it confirms)."""
    _next_update_id: int = 1000
    _ids: dict[Any, int] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _updates_changed: asyncio.Event = field(default_factory=asyncio.Event)

    def fail_next(self, count: int, *, retry_after: float = 1, method: str | None = None, after: int = 0) -> None:
        """Answer ``count`` calls (of ``method``, or any) with 429 and ``retry_after``, after ``after`` got through."""
        shown = int(retry_after) if float(retry_after).is_integer() else retry_after
        description = f"Too Many Requests: retry after {shown}"
        self.plan.append(_Planned(method, 429, description, retry_after, after))
        self.plan.extend(_Planned(method, 429, description, retry_after) for _ in range(count - 1))

    def refuse_next(self, count: int, *, status: int, description: str, method: str | None = None) -> None:
        """Answer the next ``count`` calls (of ``method``, or any) with ``status`` and ``description`` (5xx too)."""
        self.plan.extend(_Planned(method, status, description, None) for _ in range(count))

    def delay_next(self, count: int, seconds: float, *, method: str | None = None) -> None:
        """Answer the next ``count`` calls (of ``method``, or any) only after ``seconds`` (then as usual)."""
        self.plan.extend(_Planned(method, 0, "", None, delay=seconds) for _ in range(count))

    def planned(self, method: str) -> _Planned | None:
        """The planned answer for this call, if any (consumed)."""
        for index, entry in enumerate(self.plan):
            if entry.method is None or entry.method == method:
                if entry.skip:
                    entry.skip -= 1
                    return None
                return self.plan.pop(index)
        return None

    def sent(self, chat_id: int | str | None = None, method: str = "sendMessage") -> list[FakeCall]:
        """Successful calls of ``method``, optionally for one chat."""
        return [c for c in self.calls if c.method == method and c.status == 200 and chat_matches(c, chat_id)]

    def record(self, method: str, params: dict[str, Any], status: int) -> FakeCall:
        """Remember one call and wake long-polling readers of ``/_fake/calls``."""
        call = FakeCall(len(self.calls) + 1, method, params, time.time(), status)
        self.calls.append(call)
        self._changed.set()
        self._changed = asyncio.Event()
        return call

    async def changed(self, wait_s: float) -> None:
        """Wait until a call is recorded (or ``wait_s`` seconds pass: ``TimeoutError``)."""
        await asyncio.wait_for(self._changed.wait(), wait_s)

    def next_message_id(self, chat_id: Any) -> int:
        """The next ``message_id`` in a chat (ids are per chat on Telegram)."""
        self._ids[chat_id] = self._ids.get(chat_id, 0) + 1
        return self._ids[chat_id]

    def store_file(self, content: bytes, *, name: str = "file.bin", reported_size: int | None = -1) -> StoredFile:
        """Make ``content`` fetchable with ``getFile``; ``reported_size`` -1 reports its true size."""
        number = len(self.stored) + 1
        stored = StoredFile(
            file_id=f"FILE{number:04d}",
            file_path=f"documents/file_{number}_{name}",
            content=content,
            reported_size=len(content) if reported_size == -1 else reported_size,
        )
        self.stored[stored.file_id] = stored
        return stored

    # getUpdates ------------------------------------------------------------------------------------

    def end_polls(self) -> None:
        """End every waiting ``getUpdates`` now (with 409, as when another poller starts): the fake is stopping."""
        self.poll_generation += 1

    def push_update(self, update: dict[str, Any]) -> int:
        """Queue ``update`` for ``getUpdates`` (an ``update_id`` is given when missing); returns its id."""
        if "update_id" not in update:
            self._next_update_id += 1
            update = {"update_id": self._next_update_id, **update}
        self._next_update_id = max(self._next_update_id, int(update["update_id"]))
        self.updates.append(update)
        self._updates_changed.set()
        self._updates_changed = asyncio.Event()
        return int(update["update_id"])

    @property
    def confirmed(self) -> int:
        """The highest ``offset`` a ``getUpdates`` call passed: every update below it is confirmed (forgotten)."""
        return max((o for o in self.offsets if o is not None), default=0)

    async def get_updates(self, offset: int | None, limit: int, wait_s: float) -> list[dict[str, Any]] | None:
        """What ``getUpdates`` answers: pending updates from ``offset`` on, waiting up to ``wait_s`` s for one.

        ``None`` when a later ``getUpdates`` call ended this one (Telegram's 409 Conflict).
        """
        self.offsets.append(offset)
        for hook in self.poll_hooks:
            await hook(offset)
        if offset is not None:
            self.updates = [u for u in self.updates if int(u["update_id"]) >= offset]
        self.poll_generation += 1
        mine = self.poll_generation
        self.polls_in_flight += 1
        self.max_polls_in_flight = max(self.max_polls_in_flight, self.polls_in_flight)
        try:
            deadline = time.monotonic() + wait_s
            while not self.updates:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._updates_changed.wait(), min(left, 0.05))
                if self.poll_generation != mine:
                    return None
            return self.updates[: max(1, min(limit, 100))]
        finally:
            self.polls_in_flight -= 1


def chat_matches(call: FakeCall, chat_id: int | str | None) -> bool:
    """Whether ``call`` went to ``chat_id`` (any chat when ``None``)."""
    return chat_id is None or str(call.params.get("chat_id")) == str(chat_id)
