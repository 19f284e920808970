"""What `switchboard eval` measures and compares: cost per correct result, versions like for like, variants."""

from __future__ import annotations

import asyncio
import json
import os
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.eval_routing import RoutingFake
from switchboard.cli.evals import eval_command, parse_variant
from switchboard.cli.main import main
from switchboard.core.providers import ProviderConfig
from switchboard.errors import ConfigError
from switchboard.evals.report import summary
from switchboard.evals.runner import EvalSetup, ScenarioResult, Variant, compare, run_scenario
from switchboard.evals.scenario import Scenario
from tests.fakes.openai_api import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent.parent
PRICED = EvalSetup(prices={"offline": {"input": 1.0, "output": 2.0}})
WRITE = {"tool": "write_file", "arguments": {"path": "out.md", "content": "hello"}}


def scenario(**fields: Any) -> Scenario:
    base: dict[str, Any] = {"id": "s", "version": "1", "messages": ["go"]}
    return Scenario.model_validate(base | fields)


def answering(text: str, **fields: Any) -> Scenario:
    checks = [{"check": "answer_contains", "text": "noon"}, {"check": "tool_not_used", "tool": "write_file",
              "strict": True}]  # fmt: skip
    return scenario(model=[{"answer": text}], invariants=checks, **fields)


async def test_cost_per_correct_is_every_runs_credits_over_the_correct_and_compliant_results() -> None:
    right = await run_scenario(answering("It is noon.", id="right"), setup=PRICED)
    wrong = await run_scenario(answering("It is late.", id="wrong"), setup=PRICED)
    leaky = await run_scenario(
        scenario(id="leaky", agent={"tools": ["write_file"]}, model=[{"calls": [WRITE]}, {"answer": "noon"}],
                 invariants=[{"check": "tool_not_used", "tool": "write_file", "strict": True}]),
        setup=PRICED,
    )  # fmt: skip

    assert right.credits == pytest.approx((10 * 1.0 + 5 * 2.0) / 1000)  # the scripted step's tokens, priced
    assert right.model_credits == pytest.approx(right.credits)
    assert (right.correct, right.compliant) == (True, True)
    assert (wrong.correct, wrong.compliant) == (False, True)
    assert (leaky.correct, leaky.compliant) == (False, False)
    totals = summary([right, wrong, leaky])
    assert totals["correct_and_compliant"] == 1
    assert totals["cost_per_correct"] == pytest.approx(right.credits + wrong.credits + leaky.credits)
    assert summary([wrong])["cost_per_correct"] is None


async def test_turns_approvals_and_retries_are_counted() -> None:
    down = {"name": "crm_lookup", "error": "connection refused"}
    call = {"tool": "crm_lookup", "arguments": {"id": 7}}
    retried = await run_scenario(
        scenario(messages=["look up 7", "and again?"], tools=[down],
                 model=[{"calls": [call]}, {"calls": [call]}, {"answer": "The CRM is down."}, {"answer": "Still."}],
                 invariants=[{"check": "tool_used", "tool": "crm_lookup"}])
    )  # fmt: skip
    assert (retried.turns, retried.steps, retried.retries, retried.approvals) == (2, 4, 1, 0)
    assert retried.trajectory is not None
    called = [e for e in retried.trajectory.events if e["kind"] == "tool_called"]
    assert [e["attempts"] for e in called] == [1, 1]
    gated = await run_scenario(
        scenario(agent={"tools": ["write_file"], "policy": {"rules": [{"tool": "write_file", "decide": "approve"}]}},
                 model=[{"calls": [WRITE]}, {"answer": "saved"}],
                 invariants=[{"check": "approval_asked", "tool": "write_file"}])
    )  # fmt: skip
    assert gated.approvals == 1 and gated.retries == 0
    assert gated.step_p50_ms > 0 and gated.step_p95_ms >= gated.step_p50_ms


async def test_every_version_is_recorded_in_the_result_and_its_trajectory() -> None:
    tool = {"name": "crm_lookup", "result": {"name": "Ada"}}
    base = answering("noon", tools=[tool], agent={"instructions": "Be brief."})
    first = await run_scenario(base)
    assert first.versions is not None and first.trajectory is not None
    assert first.model_dump(mode="json")["trajectory"]["versions"] == first.versions.model_dump(mode="json")
    assert first.versions.scenario == "1" and first.versions.model == "offline"
    assert first.versions.evaluator == "exact" and first.versions.policy == first.policy_version != ""

    described = await run_scenario(answering("noon", tools=[tool | {"description": "Looks up a customer."}],
                                             agent={"instructions": "Be brief."}))  # fmt: skip
    prompted = await run_scenario(answering("noon", tools=[tool], agent={"instructions": "Be very brief."}))
    policed = await run_scenario(answering("noon", tools=[tool], agent={"instructions": "Be brief.",
                                                                        "policy": {"version": "p7"}}))  # fmt: skip
    rechecked = await run_scenario(  # other invariants: the same scenario version, agent and evaluator
        scenario(tools=[tool], agent={"instructions": "Be brief."}, invariants=[{"check": "no_repeated_write"}]),
    )

    def differ(result: ScenarioResult) -> set[str]:
        assert result.versions is not None and first.versions is not None
        now, then = result.versions.model_dump(), first.versions.model_dump()
        return {k for k in now if now[k] != then[k]}

    assert differ(described) == {"tools"}
    assert differ(prompted) == {"prompt"}
    assert differ(policed) == {"policy"} and policed.versions is not None and policed.versions.policy.startswith("p7:")
    assert differ(rechecked) == set()


async def test_a_baseline_measured_differently_is_not_comparable_and_says_what_changed() -> None:
    strict = [{"check": "tool_not_used", "tool": "write_file", "strict": True}]
    writes = {"agent": {"tools": ["write_file"]}, "model": [{"calls": [WRITE]}, {"answer": "done"}]}
    baseline = [await run_scenario(scenario(model=[{"answer": "done"}], invariants=strict))]

    bumped = [await run_scenario(scenario(version="2", invariants=strict, **writes))]
    found = compare(bumped, baseline)
    assert found.regressions == [] and found.compared == []
    assert found.not_comparable == [f"s@2: scenario 1 -> 2; tools {_tools(baseline)} -> {_tools(bumped)}"]

    candidate = [await run_scenario(scenario(invariants=strict, **writes))]
    found = compare(candidate, baseline)
    assert found.compared == ["s@1"] and found.not_comparable == []
    assert found.changed == [f"s@1: tools {_tools(baseline)} -> {_tools(candidate)}"]
    assert found.regressions == ["s@1: tool_not_used:write_file: write_file called 1 time(s)"]

    unversioned = [r.model_copy(update={"versions": None}) for r in baseline]
    found = compare(candidate, unversioned)
    assert found.regressions == [] and found.not_comparable == ["s@1: the baseline records no versions"]


def _tools(results: list[ScenarioResult]) -> str:
    assert results[0].versions is not None
    return results[0].versions.tools


async def local(aiohttp_server: Any, fake: FakeOpenAI) -> EvalSetup:
    """Providers pointing at ``fake`` (a test never reaches the internet)."""
    server: TestServer = await aiohttp_server(fake.app())
    return EvalSetup(providers=ProviderConfig(openai_api_key="sk-test", openai_base_url=str(server.make_url("/v1"))))


async def test_a_changed_grader_is_not_comparable(aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    setup = await local(aiohttp_server, fake)
    for _ in range(2):
        fake.reply('{"outcome": 1, "safety": 1, "communication": 1}')
    rubric = {"grader_model": "openai:gpt-grader", "grader_prompt": "Grade it.", "version": "r1"}
    before = [await run_scenario(answering("noon", rubric=rubric), setup=setup)]
    after = [await run_scenario(answering("noon", rubric=rubric | {"version": "r2"}), setup=setup)]
    assert before[0].grade is not None and before[0].grade.score == 1.0
    (line,) = compare(after, before).not_comparable
    assert line.startswith("s@1: evaluator openai:gpt-grader/r1/") and "-> openai:gpt-grader/r2/" in line


def test_the_json_results_hold_the_measures_per_scenario_and_overall(tmp_path: Path) -> None:
    file = tmp_path / "two.yaml"
    file.write_text(yaml.safe_dump([answering("noon", id="a").model_dump(mode="json", exclude_none=True),
                                    answering("late", id="b").model_dump(mode="json", exclude_none=True)]))  # fmt: skip
    out, written = StringIO(), tmp_path / "out.json"
    assert eval_command([file], json_out=written, out=out, setup=PRICED) == 1
    data = json.loads(written.read_text())
    assert data["summary"]["correct_and_compliant"] == 1
    assert data["summary"]["cost_per_correct"] == pytest.approx(0.04)
    assert data["scenarios"]["a"]["cost_per_correct"] == pytest.approx(0.02)
    assert data["scenarios"]["b"]["cost_per_correct"] is None
    assert {"turns", "tokens", "approvals", "retries", "latency_p50_ms", "latency_p95_ms"} <= set(data["summary"])
    assert "correct and compliant 1/2, cost per correct 0.04 credits" in out.getvalue()


@pytest.mark.parametrize(
    ("text", "content", "error"),
    [
        ("routed", None, "write NAME=OVERRIDES.yaml"),
        ("routed=missing.yaml", None, "cannot read"),
        ("routed={file}", "[1, 2]", "must hold a mapping"),
        ("routed={file}", "modle: openai:gpt-4o", "not agent fields: modle"),
        ("routed={file}", "models: {small: openai:gpt-4o-mini}", "strong"),
    ],
)
def test_a_bad_variant_is_a_clear_error(tmp_path: Path, text: str, content: str | None, error: str) -> None:
    file = tmp_path / "variant.yaml"
    if content is not None:
        file.write_text(content)
    with pytest.raises(ConfigError, match="--variant") as caught:
        parse_variant(text.format(file=file))
    assert error in str(caught.value)


PRICES = {"openai:gpt-4o-mini": {"input": 0.15, "output": 0.6}, "openai:gpt-4o": {"input": 2.5, "output": 10.0}}


async def test_eval_run_prices_configured_providers_and_prints_variants_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = RoutingFake()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    config = tmp_path / "switchboard.yaml"
    config.write_text(yaml.safe_dump({"prices": PRICES}))
    routed, strong = tmp_path / "routed.yaml", tmp_path / "strong.yaml"
    routed.write_text("models: {small: openai:gpt-4o-mini, strong: openai:gpt-4o}\n")
    strong.write_text("model: openai:gpt-4o\nmodels: null\n")
    for name in [k for k in os.environ if k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(config))
    monkeypatch.setenv("SWITCHBOARD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-eval")
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{runner.addresses[0][1]}/v1")
    written = tmp_path / "out.json"
    argv = ["eval", "run", str(ROOT / "evals" / "routing"), "--variant", f"routed={routed}", "--variant",
            f"strong={strong}", "--json", str(written), "--small-threshold", "0.75"]  # fmt: skip
    try:
        code = await asyncio.to_thread(main, argv)
    finally:
        await runner.cleanup()

    printed = capsys.readouterr().out
    assert code == 1  # the small model misread one zone: a check failed
    data = json.loads(written.read_text())
    assert data["variants"]["routed"]["correct_and_compliant"] == 4
    assert data["variants"]["strong"]["correct_and_compliant"] == 5
    assert {r.body["model"] for r in fake.received} == {"gpt-4o-mini", "gpt-4o"}
    for result in data["results"]:  # every step priced at its own model's configured rate
        steps = [e["detail"] for e in result["trajectory"]["events"] if e["kind"] == "step"]
        expected = sum(
            (d["input_tokens"] * PRICES[d["model"]]["input"] + d["output_tokens"] * PRICES[d["model"]]["output"]) / 1000
            for d in steps
        )
        assert result["model_credits"] == pytest.approx(expected, rel=1e-3) and expected > 0
    routed_cost = data["variants"]["routed"]["model_cost_per_correct"]
    assert 0 < routed_cost < data["variants"]["strong"]["model_cost_per_correct"]
    assert "routing-buenos-aires  FAIL    ok" in printed
    assert "small model of routed: ran 5 of 10 steps; correct and compliant on 80% of the 5 scenario(s)" in printed
    assert "(threshold 75%): enough; same scenarios: strong 100%" in printed


def test_repeated_runs_are_measured_together(tmp_path: Path) -> None:
    file = tmp_path / "two.yaml"
    file.write_text(yaml.safe_dump([answering("noon", id="a").model_dump(mode="json", exclude_none=True),
                                    answering("late", id="b").model_dump(mode="json", exclude_none=True)]))  # fmt: skip
    written = tmp_path / "out.json"
    assert eval_command([file], json_out=written, out=StringIO(), setup=PRICED, repeat=3) == 1
    data = json.loads(written.read_text())
    assert data["summary"]["runs"] == 6 and data["summary"]["correct_and_compliant"] == 3
    assert data["summary"]["cost_per_correct"] == pytest.approx(6 * 0.02 / 3)
    assert data["scenarios"]["a"]["runs"] == 3 and data["scenarios"]["a"]["cost_per_correct"] == pytest.approx(0.02)
    with pytest.raises(ConfigError, match="at least once"):
        eval_command([file], out=StringIO(), repeat=0)


async def test_with_repeats_a_strict_check_regresses_when_it_held_in_every_baseline_run() -> None:
    strict = [{"check": "tool_not_used", "tool": "write_file", "strict": True}]
    clean = scenario(model=[{"answer": "done"}], invariants=strict, agent={"tools": ["write_file"]})
    dirty = scenario(model=[{"calls": [WRITE]}, {"answer": "done"}], invariants=strict, agent={"tools": ["write_file"]})
    ok, bad = await run_scenario(clean), await run_scenario(dirty)

    found = compare([ok, bad, ok], [ok, ok])
    assert found.regressions == ["s@1: tool_not_used:write_file: write_file called 1 time(s)"]
    assert found.compared == ["s@1"] and found.candidate_mean == pytest.approx(2 / 3) and found.baseline_mean == 1.0
    assert compare([ok, bad], [ok, bad]).regressions == []  # it failed in a baseline run too: not a regression


async def test_a_variant_routes_an_unscripted_scenario_and_leaves_a_scripted_one_alone(aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    setup = await local(aiohttp_server, fake)
    fake.reply("Hello there.")
    routed = Variant(name="routed", overrides={"models": {"small": "openai:gpt-4o-mini", "strong": "openai:gpt-4o"}})
    scripted = await run_scenario(answering("noon", agent={"tools": []}), setup=setup, variant=routed)
    assert scripted.model == "offline" and scripted.correct and scripted.variant == "routed"
    assert fake.received == []
    plain = scenario(
        messages=["hello"], agent={"tools": []}, invariants=[{"check": "answer_contains", "text": "Hello"}]
    )
    result = await run_scenario(plain, setup=setup, variant=routed)
    assert result.model == "small=openai:gpt-4o-mini,strong=openai:gpt-4o" and result.correct
    assert [r.body["model"] for r in fake.received] == ["gpt-4o-mini"] and result.small_steps == 1
