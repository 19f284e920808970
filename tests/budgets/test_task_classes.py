"""Task classes: a turn is classified by its agent's rules and its envelope carries the class's budgets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from switchboard.core.agent.config import Agent
from switchboard.core.agent.runtime import Runtime
from switchboard.core.agent.taskclass import TaskClass, classify
from switchboard.core.messages import CommandIssued, ConversationRef, InboundMessage, Posted, Sender
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.worker.authority import turn_request
from tests.core.turns import MemorySink, MemoryStore
from tests.fakes.model_script import Call
from tests.fakes.openai_api import FakeOpenAI

CLASSES: dict[str, Any] = {
    "research": {"match": {"commands": ["research"], "pattern": r"\bcompare\b.*\bwith\b"}, "max_steps": 12},
    "action": {"match": {"keywords": ["book", "cancel"]}, "max_steps": 4, "max_credits": 2.5, "deadline_s": 20},
    "lookup": {"match": {"channels": ["slack"]}, "max_steps": 1, "max_tokens": 3000},
    "default": {"max_steps": 2},
}


def make_agent(**extra: Any) -> Agent:
    return Agent.model_validate(
        {
            "name": "a",
            "profile": {"name": "a"},
            "instructions": "Be brief.",
            "tools": ["current_time"],
            "task_classes": CLASSES,
            **extra,
        }
    )


def inbound(text: str, *, channel: str = "web", command: str | None = None) -> InboundMessage:
    return InboundMessage(
        id="m1",
        dedup_key="d-m1",
        conversation=ConversationRef(agent="a", channel=channel, conversation="c1"),
        sender=Sender(id="u1", name="Ada"),
        text=text,
        event=CommandIssued(name=command) if command else Posted(),
    )


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (inbound("please Book a table for two"), ("action", "keyword:book")),
        (inbound("bookkeeping question"), ("default", "default")),  # a keyword matches whole words only
        (inbound("solar panels", command="research"), ("research", "command:research")),
        (inbound("compare plan A with plan B"), ("research", "pattern")),
        (inbound("what time is it", channel="slack"), ("lookup", "channel:slack")),
        (inbound("cancel it", channel="slack"), ("action", "keyword:cancel")),  # first declared class wins
    ],
)
def test_the_first_matching_class_is_picked(message: InboundMessage, expected: tuple[str, str]) -> None:
    picked = classify(make_agent().task_classes, [message])

    assert picked is not None and (picked.name, picked.rule) == expected


def test_without_a_default_class_an_unmatched_turn_has_none() -> None:
    classes = {"action": TaskClass.model_validate({"match": {"keywords": ["book"]}})}

    assert classify(classes, [inbound("hello")]) is None


def test_a_bad_pattern_is_refused_when_the_file_loads() -> None:
    with pytest.raises(ValidationError, match="regular expression"):
        TaskClass.model_validate({"match": {"pattern": "(unclosed"}})


def test_the_envelope_carries_the_class_budgets() -> None:
    agent = make_agent(limits={"max_steps": 8, "deadline_s": 60})
    before = time.time()

    request = turn_request(None, inbound("book a table").session_key, agent, [inbound("book a table")], "run-1")

    assert (request.task_class, request.task_rule) == ("action", "keyword:book")
    assert (request.step_budget, request.token_budget, request.credit_budget) == (4, None, 2.5)
    assert before + 19 <= request.deadline <= time.time() + 20  # the class's 20 s, not the agent's 60 s


def test_without_task_classes_the_envelope_budgets_stay_unset() -> None:
    agent = Agent.model_validate({"name": "a", "profile": {"name": "a"}})

    request = turn_request(None, inbound("book").session_key, agent, [inbound("book")], "run-1")

    assert (request.task_class, request.step_budget, request.token_budget, request.credit_budget) == (
        "",
        None,
        None,
        None,
    )


async def test_a_turn_over_its_class_step_budget_stops_with_a_clear_message(
    tmp_path: Path, aiohttp_server: Any
) -> None:
    fake = FakeOpenAI()
    server: TestServer = await aiohttp_server(fake.app())
    fake.reply(calls=[Call("current_time", {})])
    fake.fail(400, "invalid_request_error", "no")  # the last call without tools fails: the fixed reply
    models = ModelFactory(ProviderConfig(openai_api_key="sk-test", openai_base_url=str(server.make_url("/v1"))))
    rt = Runtime(models=models, tools=default_registry(), workspace_root=tmp_path / "ws", model_backoff_s=0.0)
    agent = make_agent(model="openai:gpt-test")
    message = inbound("what time is it", channel="slack")
    sink = MemorySink()

    result = await rt.run_turn(turn_request(None, message.session_key, agent, [message], "run-1"), sink, MemoryStore())
    await models.aclose()
    fake.release()

    assert result.stopped_by == "steps" and result.steps == 1
    assert result.text.startswith("I had to stop before finishing: the step budget of this turn ran out.")
    assert "current_time" in result.text
    [classified] = sink.of("turn_classified")
    assert (classified.task_class, classified.rule, classified.max_steps) == ("lookup", "channel:slack", 1)
    [metered] = sink.of("usage_metered")
    assert (metered.task_class, metered.stopped_by) == ("lookup", "steps")
    final = fake.received[1].body
    assert "The step budget of this turn ran out" in str(final.get("instructions", final))
