"""A draft agent (no profile or no instructions) is never served: the user is told, the model is not asked."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.replay import ReplayModel
from tests.core.turns import MemorySink, MemoryStore, answer_step, request, runtime


@pytest.mark.parametrize(
    ("agent", "missing"),
    [
        (Agent(name="helper"), "no profile and no instructions"),
        (Agent(name="helper", instructions="Be brief."), "no profile"),
        (Agent(name="helper", profile=AgentProfile(name="Helper")), "no instructions"),
    ],
)
async def test_a_draft_agent_answers_that_it_is_not_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, agent: Agent, missing: str
) -> None:
    model = ReplayModel([answer_step("a generic answer")])
    sink = MemorySink()
    with caplog.at_level(logging.WARNING, logger="switchboard.core.agent.runtime"):
        result = await runtime(tmp_path, model=model).run_turn(request("hi", agent_=agent), sink, MemoryStore())
    assert agent.status == "draft"
    assert result.text.startswith("This agent is not ready yet (draft)") and missing in result.text
    assert model.requests == [] and result.steps == 0  # the model was never asked
    assert any(
        "'helper' is a draft" in r.getMessage() and "switchboard check" in r.getMessage() for r in caplog.records
    )


async def test_a_ready_agent_is_served(tmp_path: Path) -> None:
    agent = Agent(name="helper", profile=AgentProfile(name="Helper"), instructions="Be brief.")
    model = ReplayModel([answer_step("hello there")])
    result = await runtime(tmp_path, model=model).run_turn(request("hi", agent_=agent), MemorySink(), MemoryStore())
    assert agent.status == "ready" and result.text == "hello there" and len(model.requests) == 1


def test_a_starter_is_a_label_and_a_text_or_a_string_that_is_both() -> None:
    profile = AgentProfile.model_validate(
        {"name": "Helper", "starters": ["What time is it?", {"label": "Query", "text": "/tool sql {}"}, "x" * 100]}
    )
    assert [(s.label, s.text) for s in profile.starters[:2]] == [
        ("What time is it?", "What time is it?"),
        ("Query", "/tool sql {}"),
    ]
    assert profile.starters[2].text == "x" * 100 and len(profile.starters[2].label) == 80


@pytest.mark.parametrize(
    "starters",
    [[{"label": "", "text": "hi"}], [{"label": "hi"}], [{"label": "a", "text": "b", "extra": 1}], ["hi"] * 9],
)
def test_a_bad_starter_is_a_configuration_error(starters: list[object]) -> None:
    with pytest.raises(ValidationError):
        AgentProfile.model_validate({"name": "Helper", "starters": starters})
