"""The fake Slack's memory and its Web API methods, answered in Slack's shapes and with its error codes."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from switchboard.channels.slack.fake.checks import MAX_STREAM_CHUNK, check_blocks, pings, text_error
from switchboard.channels.slack.fake.payloads import BOT_ID, BOT_USER_ID, TEAM_ID

__all__ = ["FAKE_STATE", "FakeCall", "FakeSlackState", "Planned", "fail", "ok", "perform"]


@dataclass(slots=True)
class FakeCall:
    """One call the fake received."""

    seq: int
    method: str
    params: dict[str, Any]
    time: float
    status: int = 200
    error: str | None = None
    pings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The call as served by ``/_fake/calls``."""
        return {
            "seq": self.seq,
            "method": self.method,
            "params": self.params,
            "status": self.status,
            "error": self.error,
            "pings": self.pings,
            "time": self.time,
        }


@dataclass(slots=True)
class Planned:
    """An answer to give instead of the real one (``status`` 0: the real one, after ``delay_s``)."""

    method: str | None
    status: int
    error: str
    retry_after: float | None = None
    delay_s: float = 0.0


@dataclass
class FakeSlackState:
    """What the fake remembers."""

    bot_token: str | None
    app_token: str | None
    streaming: bool = True
    calls: list[FakeCall] = field(default_factory=list)
    messages: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    streams: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    uploads: dict[str, dict[str, Any]] = field(default_factory=dict)
    hosted: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    """Files served at ``/_fake/files/<name>`` (content, MIME type) for ``url_private`` downloads."""
    acks: list[str] = field(default_factory=list)
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    plan: list[Planned] = field(default_factory=list)
    base_url: str = ""
    _seq: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def planned(self, method: str) -> Planned | None:
        """The planned answer for this call, if any (consumed)."""
        for index, entry in enumerate(self.plan):
            if entry.method is None or entry.method == method:
                return self.plan.pop(index)
        return None

    def record(self, method: str, params: dict[str, Any], status: int, error: str | None) -> FakeCall:
        """Remember one call and wake long-polling readers of ``/_fake/calls``."""
        texts = [str(params.get(k, "")) for k in ("text", "markdown_text", "initial_comment")]
        texts += _mrkdwn_in(params.get("blocks"))
        call = FakeCall(
            len(self.calls) + 1, method, params, time.time(), status, error, [p for t in texts for p in pings(t)]
        )
        self.calls.append(call)
        self._changed.set()
        self._changed = asyncio.Event()
        return call

    def next_ts(self) -> str:
        """A fresh message ``ts``."""
        self._seq += 1
        return f"{int(time.time())}.{self._seq:06d}"

    def sent(self, method: str = "chat.postMessage", channel: str | None = None) -> list[FakeCall]:
        """Successful calls of ``method``, optionally into one channel."""
        return [
            c
            for c in self.calls
            if c.method == method
            and c.status == 200
            and c.error is None
            and (channel is None or c.params.get("channel", c.params.get("channel_id")) == channel)
        ]


def _mrkdwn_in(blocks: Any) -> list[str]:
    """The ``mrkdwn`` text objects of blocks (``plain_text`` never notifies anyone)."""
    found: list[str] = []
    if isinstance(blocks, str):  # form-encoded: the blocks are a JSON string
        try:
            return _mrkdwn_in(json.loads(blocks))
        except ValueError:
            return [blocks]
    if isinstance(blocks, dict):
        if blocks.get("type") == "mrkdwn" and isinstance(blocks.get("text"), str):
            found.append(blocks["text"])
        for value in blocks.values():
            if isinstance(value, dict | list):
                found += _mrkdwn_in(value)
    elif isinstance(blocks, list):
        for value in blocks:
            if isinstance(value, dict | list):
                found += _mrkdwn_in(value)
    return found


FAKE_STATE: web.AppKey[FakeSlackState] = web.AppKey("fake_slack_state", FakeSlackState)


def ok(**result: Any) -> web.Response:
    """Slack's success answer."""
    return web.json_response({"ok": True, **result})


def fail(error: str, status: int = 200, **extra: Any) -> web.Response:
    """Slack's error answer (HTTP 200 with ``ok: false`` unless told otherwise)."""
    return web.json_response({"ok": False, "error": error, **extra}, status=status)


def perform(state: FakeSlackState, method: str, p: dict[str, Any]) -> web.Response:
    """Answer one Web API call as Slack would."""
    if method == "auth.test":
        return ok(
            url="https://switchboard.slack.com/",
            team="Switchboard",
            user="switchboard",
            team_id=TEAM_ID,
            user_id=BOT_USER_ID,
            bot_id=BOT_ID,
            is_enterprise_install=False,
        )
    if method == "assistant.threads.setStatus":
        if not p.get("channel_id") or not p.get("thread_ts") or "status" not in p:
            return fail("invalid_arguments")
        return ok()
    if method == "files.getUploadURLExternal":
        if not p.get("filename") or not str(p.get("length", "")).isdigit():
            return fail("invalid_arguments")
        file_id = f"F{len(state.uploads) + 1:08d}"
        state.uploads[file_id] = {"filename": p["filename"], "length": int(p["length"]), "content": None}
        return ok(upload_url=f"{state.base_url}/_fake/upload/{file_id}", file_id=file_id)
    if method == "files.completeUploadExternal":
        files = json.loads(p["files"]) if isinstance(p.get("files"), str) else p.get("files")
        if not isinstance(files, list) or not files:
            return fail("invalid_arguments")
        for entry in files:
            upload = state.uploads.get(entry.get("id", ""))
            if upload is None or upload["content"] is None:
                return fail("file_not_found")
            upload.update(
                channel=p.get("channel_id"),
                thread_ts=p.get("thread_ts"),
                title=entry.get("title"),
                initial_comment=p.get("initial_comment"),
            )
        error = text_error(p.get("initial_comment"), required=False)
        return fail(error) if error else ok(files=[{"id": f["id"], "title": f.get("title")} for f in files])
    channel = p.get("channel")
    if not isinstance(channel, str) or not channel:
        return fail("channel_not_found")
    if method == "conversations.info":
        return ok(channel={"id": channel, "is_im": channel.startswith("D")})
    if method == "chat.postMessage":
        error = text_error(p.get("text"), required="blocks" not in p)
        error = error or (check_blocks(p["blocks"]) if "blocks" in p else None)
        if error:
            return fail(error)
        ts = state.next_ts()
        state.messages[(channel, ts)] = {"text": p.get("text", ""), "thread_ts": p.get("thread_ts"), "edits": 0}
        return ok(channel=channel, ts=ts, message={"text": p.get("text", ""), "ts": ts, "bot_id": BOT_ID})
    if method == "chat.update":
        message = state.messages.get((channel, str(p.get("ts"))))
        if message is None:
            return fail("message_not_found")
        error = text_error(p.get("text"), required="blocks" not in p)
        if error:
            return fail(error)
        message.update(text=p.get("text", ""), edits=message["edits"] + 1)
        return ok(channel=channel, ts=p["ts"], text=p.get("text", ""))
    if method == "chat.startStream":
        if not state.streaming:
            return fail("unknown_method")
        if not p.get("thread_ts"):
            return fail("invalid_arguments")
        if not channel.startswith("D") and not (p.get("recipient_user_id") and p.get("recipient_team_id")):
            return fail("invalid_arguments")
        ts = state.next_ts()
        state.streams[(channel, ts)] = {
            "text": str(p.get("markdown_text") or ""),
            "open": True,
            "thread_ts": p["thread_ts"],
            "appends": 0,
        }
        return ok(channel=channel, ts=ts)
    if method in ("chat.appendStream", "chat.stopStream"):
        stream = state.streams.get((channel, str(p.get("ts"))))
        if stream is None:
            return fail("message_not_found")
        if not stream["open"]:
            return fail("message_not_in_streaming_state")
        chunk = str(p.get("markdown_text") or "")
        if method == "chat.appendStream" and not 0 < len(chunk) <= MAX_STREAM_CHUNK:
            return fail("invalid_arguments")
        stream["text"] += chunk
        stream["appends"] += method == "chat.appendStream"
        stream["open"] = method == "chat.appendStream"
        return ok(channel=channel, ts=p["ts"])
    return fail("unknown_method")
