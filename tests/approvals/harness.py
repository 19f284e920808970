"""A Switchboard session with a gated tool, driven through the real drain, runtime, gateway and Redis.

``refund(amount)`` is a real write tool (high risk, irreversible: the default policy asks a person before it
runs); every run is counted in ``World.refunds``. ``note(text)`` is a low-risk write that runs without asking.
The model is the offline one: ``/tool refund {"amount": 150}`` makes it call the tool, ``/run <code>`` runs a
CodeAct program.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.runtime import Runtime
from switchboard.core.approvals.policy import PolicyConfig
from switchboard.core.approvals.records import ApprovalRecord
from switchboard.core.messages import (
    ChoiceSelected,
    CommandIssued,
    ConversationRef,
    InboundEvent,
    InboundMessage,
    OperatorActed,
    Sender,
)
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import ToolRegistry, default_registry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.queue.approvals import record_from_fields
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey
from switchboard.worker.drain import Drainer
from tests.queue.conftest import RecordingDeliverer

KEY = b"test-approval-key-0123456789abcdef"


class RefundInput(BaseModel):
    amount: int = Field(gt=0)


class NoteInput(BaseModel):
    text: str


@dataclass
class World:
    """One conversation with the agent, and what its tools did."""

    client: aioredis.Redis
    settings: QueueSettings
    ingestor: Ingestor
    tmp_path: Path
    codeact: bool = False
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    refunds: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deliverer: RecordingDeliverer = field(default_factory=RecordingDeliverer)
    conversation: str = "c1"
    user: str = "u1"
    model: Any = None
    counter: int = 0

    def registry(self) -> ToolRegistry:
        async def refund(args: RefundInput, ctx: ToolContext) -> dict[str, Any]:
            self.refunds.append(args.amount)
            return {"refunded": args.amount}

        async def note(args: NoteInput, ctx: ToolContext) -> dict[str, Any]:
            self.notes.append(args.text)
            return {"noted": args.text}

        registry = default_registry()
        registry.register(
            Tool(
                name="refund",
                description="Refund an amount to the customer.",
                input=RefundInput,
                fn=refund,
                side_effect="write",
                risk="high",
                reversible=False,
                resources=lambda a: (f"amount:{a.amount}",),
            ),
            replace=True,
        )
        registry.register(
            Tool(name="note", description="Take a note.", input=NoteInput, fn=note, side_effect="write"),
            replace=True,
        )
        return registry

    def agent(self) -> Agent:
        return Agent(
            name="assistant",
            profile=AgentProfile(name="A"),
            instructions="Answer.",
            tools=["refund", "note", "read_file", "write_file", "update_state"],
            codeact=self.codeact,
            policy=self.policy,
        )

    def drainer(self, worker_id: str = "w1") -> Drainer:
        """A worker's drainer with its own runtime (a fresh process would build the same from the settings)."""
        models = ModelFactory(ProviderConfig())
        if self.model is not None:
            models.override("offline", self.model)
        runtime = Runtime(models=models, tools=self.registry(), workspace_root=self.tmp_path / "ws", snapshot_key=KEY)
        agent = self.agent()
        return Drainer(
            self.client,
            self.settings,
            runner=runtime.run_turn,
            deliverer=self.deliverer,
            agent_for=lambda m: agent,
            worker_id=worker_id,
        )

    # ---------------------------------------------------------------- messages

    def message(self, text: str, event: InboundEvent | None = None, *, user: str | None = None) -> InboundMessage:
        self.counter += 1
        values: dict[str, Any] = {
            "dedup_key": f"evt-{self.counter}-{time.time_ns()}",
            "conversation": ConversationRef(agent="assistant", channel="telegram", conversation=self.conversation),
            "sender": Sender(id=user or self.user, name="User"),
            "text": text,
        }
        if event is not None:
            values["event"] = event
        return InboundMessage(**values)

    def click(self, option_id: str, *, user: str | None = None) -> InboundMessage:
        return self.message("Approve", ChoiceSelected(option_id=option_id, offer_message_id="1"), user=user)

    def command(self, name: str, args: str, *, user: str | None = None) -> InboundMessage:
        return self.message(args, CommandIssued(name=name), user=user)

    def operator(
        self, action: str, *, operator: str = "console:alice", text: str = "", approval_id: str | None = None,
        verdict: str | None = None,
    ) -> InboundMessage:  # fmt: skip
        event = OperatorActed(action=action, operator=operator, approval_id=approval_id, verdict=verdict)
        return self.message(text, event, user=operator)

    @property
    def session(self) -> SessionKey:
        return self.message("x").session_key

    async def raw_record(self, approval_id: str) -> dict[str, Any]:
        """The record JSON as stored (to tamper with it as someone with Redis access could)."""
        raw = await self.client.hget(SessionKeys(self.session).approval(approval_id), "record")
        assert raw is not None
        found: dict[str, Any] = json.loads(raw)
        return found

    async def send(self, message: InboundMessage, drainer: Drainer | None = None) -> None:
        """Ingest ``message`` and drain the session (one worker, as the RQ job would)."""
        await self.ingestor.ingest(message)
        await (drainer or self.drainer()).drain(message.session_key)

    # ---------------------------------------------------------------- what happened

    def offers(self) -> list[Any]:
        return [s.action for s in self.deliverer.sent if s.action.kind == "choice"]

    def texts(self) -> list[str]:
        return self.deliverer.texts()

    def approve_option(self, index: int = -1) -> str:
        return str(self.offers()[index].options[0].id)

    def deny_option(self, index: int = -1) -> str:
        return str(self.offers()[index].options[1].id)

    async def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        found = await read_events(self.client, self.session, 1000)
        return [e for e in found if kind is None or e["kind"] == kind]

    async def record(self, approval_id: str) -> ApprovalRecord:
        fields = await self.client.hgetall(SessionKeys(self.session).approval(approval_id))
        found = record_from_fields(fields)
        assert found is not None
        return found

    async def only_approval(self) -> ApprovalRecord:
        requested = await self.events("approval_requested")
        assert requested, "no approval was requested"
        return await self.record(requested[-1]["approval_id"])

    async def history(self) -> list[dict[str, Any]]:
        raw = await self.client.lrange(SessionKeys(self.session).history, 0, -1)
        return [json.loads(item) for item in raw]


def where(items: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [i for i in items if all(i.get(k) == v for k, v in match.items())]


Check = Callable[[], Any]
