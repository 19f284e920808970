"""The agent's work in the web chat: a card per tool call, files in a fixed place, one notice for a stop.

API → real ingest → real Drainer running the real Runtime (a replayed model, the real tools) → WebChannel → SSE.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest

from switchboard.channels.base import Capabilities
from switchboard.channels.registry import ChannelSet
from switchboard.channels.web.adapter import WebChannel
from switchboard.core.actions import Action, SettleChoices, ShowToolCall
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.replay import RecordedStep, ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import ConversationRef
from switchboard.core.model import Finished, TextDelta, ToolCall, ToolCallEvent, Usage
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.queue.cancellation import listen_for_stops
from switchboard.sandbox.detect import choose_now
from switchboard.sandbox.runner import Sandbox
from switchboard.types import SessionKey
from switchboard.worker.drain import Drainer
from tests.core.turns import answer_step, calls_step

from .conftest import SSE, Chat, read_sse


def _sandbox() -> Sandbox:
    for kind in ("bwrap", "landlock"):
        found = choose_now(kind, allow_weak=True).sandbox
        if found is not None:
            return found
    pytest.skip("no strong sandbox on this host")


def _text_and_calls(text: str, *calls: tuple[str, dict[str, Any]], step: int, prefix: str = "c") -> RecordedStep:
    """A step that writes ``text`` and then calls tools (the model says what it does, then does it)."""
    events: list[Any] = [TextDelta(text=text)]
    events += [
        ToolCallEvent(call=ToolCall(id=f"{prefix}{step}_{i}", name=name, arguments=args))
        for i, (name, args) in enumerate(calls)
    ]
    events += [Usage(input_tokens=10, output_tokens=5), Finished(stop_reason="tool_calls")]
    return RecordedStep(step=step, events=events)


def _drainer(
    chat: Chat,
    model: ReplayModel,
    tmp_path: Path,
    tools: list[str],
    *,
    delta_every_s: float = 0.0,
    codeact: bool = False,
    **registry: Any,
) -> Drainer:
    models = ModelFactory(ProviderConfig())
    models.override("offline", model)
    runtime = Runtime(models=models, tools=default_registry(**registry), workspace_root=tmp_path / "ws")
    channels = ChannelSet({("web", "default"): WebChannel(chat.publisher.publish)})
    agent = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.", tools=tools,
                  codeact=codeact)  # fmt: skip
    update = {"max_attempts": 1, "retry_backoff_s": 0, "delta_every_s": delta_every_s}
    settings = chat.settings.queue.model_copy(update=update)
    return Drainer(chat.redis, settings, runner=runtime.run_turn, deliverer=channels, agent_for=lambda m: agent,
                   worker_id="w1", workspace_root=tmp_path / "ws")  # fmt: skip


async def _events(chat: Chat, token: str, until: str = "idle") -> list[SSE]:
    """The session's stream from the start up to its idle status (a reload's replay keeps no deltas)."""
    found: list[SSE] = []
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        while not found or not (found[-1].event == "status" and (found[-1].data or {}).get("status") == until):
            found += await read_sse(resp, 1)
    return found


async def test_a_shell_call_is_one_card_live_with_its_commands_real_output(chat: Chat, tmp_path: Path) -> None:
    command = "echo made-it; echo went-wrong >&2; exit 3"
    model = ReplayModel([calls_step(("shell", {"commands": [command]})), answer_step("It failed.", step=2)])
    drain = _drainer(chat, model, tmp_path, ["shell"], sandbox=_sandbox())
    _, token = await chat.new_session()
    session = SessionKey(await chat.session_key(token))
    asked = await chat.send(token, "run it", client_id="q1")
    await drain.drain(session)
    events = await _events(chat, token)
    cards = [e.data for e in events if e.event == "tool"]
    assert [c["state"] for c in cards if c is not None] == ["running", "failed"]
    running, done = cards
    assert running is not None and done is not None
    assert running["call_id"] == done["call_id"] == "c1_0" and running["reply_to"] == asked
    assert running["tool"] == "shell" and running["title"] == f"shell: {command}"
    assert running["duration_ms"] is None and running["output_head"] == ""
    assert done["exit_status"] == 3 and done["duration_ms"] > 0
    assert "made-it" in done["output_head"] and "went-wrong" in done["output_head"]
    assert done["started_at"] == running["started_at"] and done["files"] == []
    kinds = [e.event for e in events]
    assert kinds.index("tool") < kinds.index("message")  # the cards come before the answer


async def test_a_long_output_shows_head_and_tail_with_the_lines_between_counted(chat: Chat, tmp_path: Path) -> None:
    model = ReplayModel([calls_step(("shell", {"commands": ["seq 1 100"]})), answer_step("Counted.", step=2)])
    drain = _drainer(chat, model, tmp_path, ["shell"], sandbox=_sandbox())
    _, token = await chat.new_session()
    await chat.send(token, "count", client_id="q1")
    await drain.drain(SessionKey(await chat.session_key(token)))
    [done] = [e.data for e in await _events(chat, token) if e.event == "tool" and e.data["state"] != "running"]
    assert done["state"] == "ok" and done["exit_status"] == 0
    assert done["output_head"].splitlines() == [str(n) for n in range(1, 21)]
    assert done["output_tail"].splitlines() == [str(n) for n in range(81, 101)]
    assert done["omitted_lines"] == 60


@pytest.mark.parametrize("delta_every_s", [0.0, 60.0])
async def test_a_sent_file_comes_after_its_card_and_before_the_answer_every_run(
    chat: Chat, tmp_path: Path, delta_every_s: float
) -> None:
    for run in range(4):  # the same turn, again and again: the same order each time
        steps = [
            _text_and_calls("Writing it.", ("write_file", {"path": "report.csv", "content": "a,b\n1,2\n"}), step=1),
            _text_and_calls(" Sending it.", ("send_file", {"path": "report.csv", "caption": "Your report"}), step=2),
            answer_step("Here is your report.", step=3),
        ]
        drain = _drainer(chat, ReplayModel(steps), tmp_path / str(run), ["write_file", "send_file"],
                         delta_every_s=delta_every_s)  # fmt: skip
        _, token = await chat.new_session()
        async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
            asked = await chat.send(token, "make me a report", client_id="q1")
            await drain.drain(SessionKey(await chat.session_key(token)))
            live: list[SSE] = []
            while not live or (live[-1].data or {}).get("status") != "idle":
                live += await read_sse(resp, 1)
        shown = [
            (e.event, (e.data or {}).get("tool"), (e.data or {}).get("state"), "file" in (e.data or {}))
            for e in live
            if e.event in ("tool", "message")
        ]
        assert shown == [
            ("tool", "write_file", "running", False),
            ("tool", "write_file", "ok", False),
            ("tool", "send_file", "running", False),
            ("message", None, None, True),
            ("tool", "send_file", "ok", False),
            ("message", None, None, False),
        ], run
        kinds = [e.event for e in live]
        assert kinds.index("delta") < kinds.index("tool")  # the words before the call go out before its card
        written = [e.data for e in live if e.event == "tool" and e.data["tool"] == "write_file"][-1]
        assert written["files"] == [{"name": "report.csv", "path": "report.csv"}]
        [file_message] = [e.data for e in live if e.event == "message" and "file" in e.data]
        assert file_message["text"] == "Your report"  # the caption alone: the page shows the name on the card
        assert file_message["reply_to"] == asked  # in its place in the reply, not a reply of its own
        assert file_message["file"]["name"] == "report.csv" and file_message["file"]["size"] == 8
        assert base64.b64decode(file_message["file"]["data"]) == b"a,b\n1,2\n"


async def test_arguments_are_a_short_preview_with_secret_looking_values_redacted(chat: Chat, tmp_path: Path) -> None:
    args = {"path": "notes.txt", "content": "x" * 2000}
    model = ReplayModel([calls_step(("write_file", args)), answer_step("Done.", step=2)])
    drain = _drainer(chat, model, tmp_path, ["write_file"])
    _, token = await chat.new_session()
    await chat.send(token, "write", client_id="q1")
    await drain.drain(SessionKey(await chat.session_key(token)))
    [running, _] = [e.data for e in await _events(chat, token) if e.event == "tool"]
    assert running["title"] == "write_file: notes.txt"
    assert len(running["arguments"]) <= 500 and running["arguments"].startswith('{"content":"xxx')


class _Recording(ChannelSet):
    """The channels, recording every action performed (a channel without tool activity must be sent none)."""

    performed: list[Action]

    async def perform(self, action: Action, conversation: ConversationRef, send: Any) -> Any:
        self.performed.append(action)
        return await super().perform(action, conversation, send)


class _PlainWeb(WebChannel):
    """The web chat as a channel that declares no tool activity."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(max_text=4096, streaming="transport", files=True, statuses=True)


async def test_a_channel_without_tool_activity_is_sent_no_card(chat: Chat, tmp_path: Path) -> None:
    channels = _Recording({("web", "default"): _PlainWeb(chat.publisher.publish)})
    channels.performed = []
    model = ReplayModel([calls_step(("write_file", {"path": "a.txt", "content": "a"})), answer_step("Ok.", step=2)])
    models = ModelFactory(ProviderConfig())
    models.override("offline", model)
    runtime = Runtime(models=models, tools=default_registry(), workspace_root=tmp_path / "ws")
    agent = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.", tools=["write_file"])
    settings = chat.settings.queue.model_copy(update={"max_attempts": 1, "retry_backoff_s": 0})
    drain = Drainer(chat.redis, settings, runner=runtime.run_turn, deliverer=channels, agent_for=lambda m: agent,
                    worker_id="w1")  # fmt: skip
    _, token = await chat.new_session()
    await chat.send(token, "write", client_id="q1")
    await drain.drain(SessionKey(await chat.session_key(token)))
    assert [a.kind for a in channels.performed if a.kind == "text"] == ["text"]
    assert not [a for a in channels.performed if isinstance(a, ShowToolCall | SettleChoices)]
    assert model.exhausted


class _Slow:
    """A turn that writes a little of its reply, then takes a minute (unless stopped); others answer at once."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def __call__(self, request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        if request.messages[-1].text.startswith("slow"):
            await sink.delta("Let me think")
            self.started.set()
            await asyncio.sleep(60)
        return TurnResult(text="done", steps=1)


def _plain_drainer(chat: Chat, runner: _Slow) -> Drainer:
    channels = ChannelSet({("web", "default"): WebChannel(chat.publisher.publish)})
    settings = chat.settings.queue.model_copy(update={"max_attempts": 1, "retry_backoff_s": 0})
    return Drainer(chat.redis, settings, runner=runner, deliverer=channels, worker_id="w1",
                   agent_for=lambda m: chat.settings.file.agent(m.conversation.agent))  # fmt: skip


def _notices(events: list[SSE]) -> list[tuple[str | None, str]]:
    """Every event that tells the user something about the stop (a bubble or a system line)."""
    shown: list[tuple[str | None, str]] = []
    for e in events:
        data = e.data or {}
        if e.event == "reply_error" or (e.event == "message" and data.get("text") != "done"):
            shown.append((e.event, str(data.get("code") or data.get("text"))))
    return shown


async def test_stop_while_a_reply_runs_shows_exactly_one_notice(chat: Chat) -> None:
    runner = _Slow()
    drainer = _plain_drainer(chat, runner)
    _, token = await chat.new_session()
    session = SessionKey(await chat.session_key(token))
    stop_listening = asyncio.Event()
    listener = asyncio.create_task(listen_for_stops(chat.redis, drainer.cancel, stop_listening))
    try:
        await chat.send(token, "slow question", client_id="q1")
        drain = asyncio.create_task(drainer.drain(session))
        await asyncio.wait_for(runner.started.wait(), 10)
        await chat.send(token, "/stop", client_id="s1")
        await asyncio.wait_for(drain, 10)
    finally:
        stop_listening.set()
        await listener
    events = await _events(chat, token)
    [stop_echo] = [e.data for e in events if e.event == "user" and e.data["text"] == "/stop"]
    assert stop_echo["command"] == "stop"  # the page shows no bubble for the button's /stop
    [question] = [e.data for e in events if e.event == "user" and e.data["text"] == "slow question"]
    assert "command" not in question
    assert _notices(events) == [("reply_error", "cancelled")]
    [error] = [e.data for e in events if e.event == "reply_error"]
    assert error["message"] == "You stopped this reply."


async def test_stop_with_nothing_running_is_one_notice_message(chat: Chat) -> None:
    drainer = _plain_drainer(chat, _Slow())
    _, token = await chat.new_session()
    await chat.send(token, "/stop", client_id="s1")
    await drainer.drain(SessionKey(await chat.session_key(token)))
    events = await _events(chat, token)
    assert _notices(events) == [("message", "Nothing was running, so there was nothing to stop.")]
    [notice] = [e.data for e in events if e.event == "message"]
    assert notice["notice"] is True


async def test_a_program_card_shows_what_it_printed_and_its_value_not_its_json(chat: Chat, tmp_path: Path) -> None:
    code = 'print("squares:", [n * n for n in range(1, 4)])\n6 * 7'
    model = ReplayModel([calls_step(("run_program", {"code": code})), answer_step("Done.", step=2)])
    drain = _drainer(chat, model, tmp_path, ["current_time"], codeact=True)
    _, token = await chat.new_session()
    await chat.send(token, "run it", client_id="q1")
    await drain.drain(SessionKey(await chat.session_key(token)))
    [done] = [e.data for e in await _events(chat, token) if e.event == "tool" and e.data["state"] != "running"]
    assert (
        done["tool"] == "run_program"
        and done["title"] == 'run_program: print("squares:", [n * n for n in range(1, 4)])'
    )
    assert done["state"] == "ok" and done["output_head"] == "squares: [1, 4, 9]\n→ 42", done
