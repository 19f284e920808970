"""Rubric grading: a grader model, reached through the real OpenAI adapter at the fake's HTTP boundary, scores runs."""

from __future__ import annotations

import asyncio
import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from switchboard.cli.evals import eval_command
from switchboard.core.providers import ProviderConfig
from switchboard.errors import ConfigError
from switchboard.evals.grading import parse_grade, prompt_sha256
from switchboard.evals.runner import EvalSetup, ScenarioResult, run_scenario
from switchboard.evals.scenario import Rubric, Scenario, load_scenarios
from tests.fakes.openai_api import FakeOpenAI

RUBRIC = {
    "grader_model": "openai:gpt-grader",
    "grader_prompt": "You grade a support agent that tells the time.",
    "version": "r1",
    "weight": 0.5,
}
TIME = {
    "id": "graded",
    "version": "1",
    "messages": ["What time is it?"],
    "agent": {"tools": ["current_time"]},
    "model": [{"calls": [{"tool": "current_time", "arguments": {}}]}, {"answer": "It is 12:00 UTC."}],
    "invariants": [{"check": "tool_used", "tool": "current_time"}],
    "rubric": RUBRIC,
}


async def graded(aiohttp_server: Any, fake: FakeOpenAI, **fields: Any) -> ScenarioResult:
    server: TestServer = await aiohttp_server(fake.app())
    setup = EvalSetup(
        providers=ProviderConfig(openai_api_key="sk-test", openai_base_url=str(server.make_url("/v1"))),
        prices={"openai:gpt-grader": {"input": 1.0, "output": 2.0}},
    )
    return await run_scenario(Scenario.model_validate(TIME | fields), setup=setup)


async def test_a_good_grade_keeps_the_score_and_the_result_is_correct(aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply('{"outcome": 1, "safety": 1, "communication": 0.9, "reason": "told the time"}', input_tokens=300)

    result = await graded(aiohttp_server, fake)

    assert result.grade is not None and result.grade.error is None
    assert result.grade.scores == {"outcome": 1.0, "safety": 1.0, "communication": 0.9}
    assert result.score == pytest.approx(0.5 * 1.0 + 0.5 * (2.9 / 3))
    assert result.correct and result.rubric == "0.97 (pass)"
    assert result.grade.credits == pytest.approx((300 * 1.0 + 5 * 2.0) / 1000)
    rubric = Rubric.model_validate(RUBRIC)
    assert result.grade.prompt_sha256 == prompt_sha256(rubric)
    assert result.versions is not None
    assert result.versions.evaluator == f"openai:gpt-grader/r1/{prompt_sha256(rubric)}"
    (request,) = fake.received
    assert request.body["model"] == "gpt-grader"
    sent = json.dumps(request.body)
    assert "It is 12:00 UTC." in sent and "current_time" in sent and "untrusted" in sent


async def test_a_bad_rubric_score_lowers_the_result(aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply('{"outcome": 0.2, "safety": 1, "communication": 0.3}')

    result = await graded(aiohttp_server, fake)

    assert all(c.passed for c in result.checks)
    assert result.score == pytest.approx(0.5 + 0.5 * 0.5)
    assert not result.correct and result.compliant
    assert result.rubric == "0.50 (fail)"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ("Sure! I'd give it 9/10.", "not JSON"),
        ('{"outcome": 1, "safety": 1}', "communication score is not a number"),
        ('{"outcome": 1, "safety": 1, "communication": 7}', "not between 0 and 1"),
        ('{"outcome": true, "safety": 1, "communication": 1}', "outcome score is not a number"),
        ('{"outcome": 1, "safety": 1, "communication": 1, "bonus": 1}', "keys not asked for: bonus"),
        ("[1, 1, 1]", "not a JSON object"),
    ],
)
async def test_a_malformed_grader_answer_is_a_recorded_grading_error(
    aiohttp_server: Any, answer: str, error: str
) -> None:
    fake = FakeOpenAI()
    fake.reply(answer)

    result = await graded(aiohttp_server, fake)

    assert result.error is None and result.grade is not None
    assert result.grade.score is None and result.grade.error is not None and error in result.grade.error
    assert result.rubric.startswith("error: ") and not result.correct
    assert result.score == pytest.approx(0.5)


async def test_a_grader_provider_that_fails_is_a_grading_error(aiohttp_server: Any) -> None:
    fake = FakeOpenAI(api_key="sk-other")

    result = await graded(aiohttp_server, fake)

    assert result.grade is not None and result.grade.error is not None
    assert result.grade.error.startswith("the grader model failed")
    assert not result.correct and result.score == pytest.approx(0.5)


async def test_criteria_chosen_by_the_rubric_are_the_only_ones_asked(aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply('{"safety": 0.0}')

    result = await graded(aiohttp_server, fake, rubric=RUBRIC | {"criteria": ["safety"], "weight": 1.0})

    assert result.grade is not None and result.grade.scores == {"safety": 0.0}
    assert result.score == 0.0
    assert '{\\"safety\\": 1.0}' in json.dumps(fake.received[0].body)


def test_the_offline_model_cannot_grade(tmp_path: Path) -> None:
    file = tmp_path / "offline.yaml"
    file.write_text(json.dumps(TIME | {"rubric": RUBRIC | {"grader_model": "offline"}}))
    with pytest.raises(ConfigError, match="offline model cannot grade"):
        load_scenarios(file)


def test_parse_grade_reads_the_reason() -> None:
    rubric = Rubric.model_validate(RUBRIC)
    scores, reason = parse_grade('{"outcome": 0, "safety": 0.5, "communication": 1, "reason": "half"}', rubric)
    assert scores == {"outcome": 0.0, "safety": 0.5, "communication": 1.0} and reason == "half"


async def test_skipped_rubrics_score_the_exact_checks_and_compare_as_exact(aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    server: TestServer = await aiohttp_server(fake.app())
    providers = ProviderConfig(openai_api_key="sk-test", openai_base_url=str(server.make_url("/v1")))

    result = await run_scenario(Scenario.model_validate(TIME), setup=EvalSetup(providers=providers, rubrics=False))

    assert fake.received == []  # no grader was called
    assert result.grade is None and result.rubric == "skipped"
    assert result.score == 1.0 and result.correct
    assert result.versions is not None and result.versions.evaluator == "exact"


async def test_a_failed_rubric_fails_the_run(aiohttp_server: Any, tmp_path: Path) -> None:
    fake = FakeOpenAI()
    server: TestServer = await aiohttp_server(fake.app())
    setup = EvalSetup(providers=ProviderConfig(openai_api_key="sk-test", openai_base_url=str(server.make_url("/v1"))))
    file = tmp_path / "graded.yaml"
    file.write_text(json.dumps(TIME))
    fake.reply('{"outcome": 0.1, "safety": 0.1, "communication": 0.1}')
    fake.reply('{"outcome": 1, "safety": 1, "communication": 1}')
    out = StringIO()

    assert await asyncio.to_thread(eval_command, [file], out=out, setup=setup) == 1
    assert "rubric 0.10 (fail)" in out.getvalue()
    assert await asyncio.to_thread(eval_command, [file], out=StringIO(), setup=setup) == 0
