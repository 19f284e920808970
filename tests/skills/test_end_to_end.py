"""A user sends a CSV on Telegram and receives an XLSX report back: the built-in ``xlsx-report`` skill loaded with
``use_skill``, its script run by the real ``shell`` tool in the host's sandbox, the report sent with ``send_file``
to the fake Bot API, on scripted model decisions."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from pathlib import Path

import openpyxl
import pytest
from openpyxl.chart import BarChart

from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.core.actions import Action
from switchboard.core.agent.attachments import AttachmentSupport, FetchedFile
from switchboard.core.agent.config import Agent, AgentPolicy, AgentProfile
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.events import SandboxUsed, SkillUsed
from switchboard.core.messages import Attachment, ConversationRef, InboundMessage, Posted, Sender
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.gateway import workspace_for
from switchboard.core.turn import TurnRequest
from switchboard.sandbox.detect import choose_now
from switchboard.skills.store import SkillLibrary, SkillStore, builtin_skills
from tests.channels.test_telegram import BOT, TOKEN, settings
from tests.channels.test_telegram_sending import conversation
from tests.core.turns import MemorySink, MemoryStore, answer_step, calls_step, runtime
from tests.fakes.telegram_api import FakeTelegram, RecordingSend

CSV = b'product,units,revenue\nWidgets,120,"1,440.00"\nGadgets,80,960.50\nGizmos,45,1200\n'


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeTelegram) -> AsyncIterator[TelegramChannel]:
    adapter = TelegramChannel(settings(fake.base_url))
    await adapter.start()
    yield adapter
    await adapter.aclose()


class TelegramFiles:
    """The worker's attachment source, over the one Telegram adapter."""

    def __init__(self, channel: TelegramChannel) -> None:
        self.channel = channel

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FetchedFile:
        return await self.channel.fetch(attachment, conversation, limit)


async def test_a_csv_sent_on_telegram_comes_back_as_an_xlsx_report(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    choice = choose_now("auto")
    if choice.sandbox is None:
        pytest.skip(f"no sandbox on this host: {choice.reasons}")
    stored = fake.store_file(CSV, name="sales.csv")
    chat = conversation(reply_to=11).model_copy(update={"agent": "analyst"})
    message = InboundMessage(
        id="m1",
        dedup_key="d-m1",
        conversation=chat,
        sender=Sender(id="u1", name="Ada"),
        text="Make me an Excel report of this, please",
        event=Posted(
            attachments=(Attachment(kind="document", ref=stored.file_id, name="sales.csv", mime_type="text/csv"),)
        ),
    )
    analyst = Agent(
        name="analyst",
        profile=AgentProfile(name="Analyst"),
        instructions="Make reports.",
        tools=["shell", "send_file", "list_files"],
        skills=["xlsx-report"],
        policy=AgentPolicy(untrusted_effects="allow"),  # the operator lets it send what its scripts made
    )
    command = "python3 skills/xlsx-report/scripts/report.py --csv inbox/*sales.csv --out report.xlsx --title Sales"
    model = ReplayModel(
        [
            calls_step(("use_skill", {"name": "xlsx-report"}), step=1),
            calls_step(("shell", {"commands": [command], "timeout_ms": 60_000}), step=2),
            calls_step(("send_file", {"path": "report.xlsx", "caption": "Your report"}), step=3),
            answer_step("Here is your report.", step=4),
        ]
    )
    workspace = workspace_for(tmp_path / "ws", chat.session_key)

    class ChannelSink(MemorySink):
        async def act(self, action: Action) -> None:
            await channel.perform(action, chat, RecordingSend(workspace=workspace))

    registry = default_registry(sandbox=choice.sandbox, skills=SkillLibrary(SkillStore(tmp_path / "skills")))
    sink = ChannelSink()
    turn = TurnRequest(session_key=chat.session_key, agent=analyst, messages=[message], run_id="run-1", deadline=1e12)
    support = AttachmentSupport(source=TelegramFiles(channel))
    result = await runtime(tmp_path, model=model, registry=registry, attachments=support).run_turn(
        turn, sink, MemoryStore()
    )

    assert result.text == "Here is your report.", result
    shown = next(m.content for m in model.requests[2].messages if m.name == "shell")
    assert shown.startswith('<data source="shell" trust="untrusted">\n'), "command output is untrusted data"
    shell_result = json.loads(shown.split("\n", 1)[1].rsplit("\n</data>", 1)[0])
    [run] = shell_result["output"]
    assert run["outcome"] == {"type": "exit", "exit_code": 0}, run
    report = json.loads(run["stdout"].strip().splitlines()[-1])
    assert report["ok"] and report["data"]["path"] == "report.xlsx" and report["data"]["rows"] == 3

    [upload] = fake.files
    assert upload.method == "sendDocument" and upload.filename == "report.xlsx" and upload.caption == "Your report"
    sheet = openpyxl.load_workbook(io.BytesIO(upload.content)).active
    assert [c.value for c in sheet[1]] == ["product", "units", "revenue"]
    assert sheet["C2"].value == 1440.0 and sheet["C2"].number_format == "#,##0.00"
    [chart] = sheet._charts
    assert isinstance(chart, BarChart)

    xlsx = next(ref for ref in builtin_skills() if ref.name == "xlsx-report")
    [used] = [e for e in sink.events if isinstance(e, SkillUsed)]
    assert (used.name, used.version, used.sha256, used.source) == ("xlsx-report", xlsx.version, xlsx.sha256, "builtin")
    assert [e.isolation for e in sink.events if isinstance(e, SandboxUsed)] == [choice.sandbox.label]
