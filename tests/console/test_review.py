"""Production sampling and the console's review queue: real runs drained by the real drain, sampled at the configured
rate into Redis, reviewed through the console's API (verdicts, transcripts per role, replay cases)."""

from __future__ import annotations

import asyncio
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.cli.evals import eval_command
from switchboard.control import ControlService, OperatorScope
from switchboard.errors import ConfigError
from switchboard.evals.scenario import load_scenarios
from switchboard.queue.erasure import Eraser
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.review import ReviewQueue, ReviewSample, ReviewVerdict
from switchboard.settings import load_settings
from switchboard.settings.evals import EvalSettings
from switchboard.types import SessionKey
from switchboard.worker.sampling import Sampler
from tests.console.conftest import HASH, OPERATORS_CONFIG, Console, MakeConsole
from tests.console.conversation import QUESTION, TOOL_OUTPUT, conversation_ref, drain, user_says

KEYS = GlobalKeys()
VIEWER = f"""
    - name: carol
      password_hash: "{HASH}"
      tenants: [default]
      role: viewer
"""


@pytest.fixture
def review_env(base_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "review.yaml"
    config.write_text(OPERATORS_CONFIG.rstrip("\n") + VIEWER)
    return {**base_env, "SWITCHBOARD_CONFIG": str(config)}


@pytest.fixture
async def console(review_env: dict[str, str], make_console: MakeConsole) -> Console:
    return await make_console(review_env)


async def _sampled(redis: aioredis.Redis, workspace: Path, tenant: str = "default", rate: float = 1.0) -> SessionKey:
    """A real turn (a tool call, an answer) drained with sampling at ``rate``."""
    session = await user_says(redis, conversation_ref(tenant=tenant), QUESTION, f"evt-{tenant}")
    await drain(redis, session, workspace, Sampler(redis, EvalSettings(sample_rate=rate)))
    return session


async def _samples(console: Console) -> dict[str, Any]:
    resp = await console.client.get("/console/api/review")
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


# -- sampling ------------------------------------------------------------------------------------------------------


async def test_a_finished_run_is_sampled_without_its_words(async_redis: aioredis.Redis, tmp_path: Path) -> None:
    session = await _sampled(async_redis, tmp_path)
    raw = await async_redis.lrange(KEYS.review_runs("default"), 0, -1)
    assert len(raw) == 1
    sample = ReviewSample.model_validate_json(raw[0])
    assert sample.session == session and sample.run_id.startswith("run-") and sample.agent == "assistant"
    assert sample.tools == ["lookup"] and sample.steps == 2 and sample.answered and sample.channel == "telegram"
    assert b"Paris" not in raw[0] and TOOL_OUTPUT.encode() not in raw[0]  # ids and counts, no words


@pytest.mark.parametrize(
    "settings",
    [
        EvalSettings(sample_rate=1.0, exclude_tenants=("default",)),
        EvalSettings(sample_rate=1.0, agent_rates={"assistant": 0.0}),
        EvalSettings(sample_rate=0.0),
    ],
    ids=["tenant-opted-out", "agent-rate-zero", "rate-zero"],
)
async def test_a_run_not_drawn_leaves_nothing(
    async_redis: aioredis.Redis, tmp_path: Path, settings: EvalSettings
) -> None:
    session = await user_says(async_redis, conversation_ref(), QUESTION, "evt-x")
    deliverer = await drain(async_redis, session, tmp_path, Sampler(async_redis, settings))
    assert deliverer.sent  # the run did finish
    assert await async_redis.exists(KEYS.review_runs("default")) == 0


async def test_a_command_answered_without_the_model_is_not_sampled(async_redis: aioredis.Redis, tmp_path: Path) -> None:
    session = await user_says(async_redis, conversation_ref(), "/usage", "evt-usage")
    deliverer = await drain(async_redis, session, tmp_path, Sampler(async_redis, EvalSettings(sample_rate=1.0)))
    assert deliverer.sent
    assert await async_redis.exists(KEYS.review_runs("default")) == 0


def test_the_rates_decide_the_draw() -> None:
    drawn = 0.5
    settings = EvalSettings(sample_rate=0.4, agent_rates={"support": 0.6}, exclude_tenants=("acme",))
    sampler = Sampler(aioredis.Redis(), settings, draw=lambda: drawn)
    assert not sampler.wanted("default", "assistant")  # 0.5 >= 0.4
    assert sampler.wanted("default", "support")  # 0.5 < 0.6
    assert not sampler.wanted("acme", "support")  # opted out
    assert Sampler.build(aioredis.Redis(), EvalSettings()) is None  # nothing to draw: the drain asks nothing more
    assert Sampler.build(aioredis.Redis(), EvalSettings(agent_rates={"a": 0.1})) is not None


async def test_the_queue_is_bounded_and_verdicts_go_with_their_samples(async_redis: aioredis.Redis) -> None:
    queue = ReviewQueue(async_redis, max_per_tenant=3)
    made = [ReviewSample(run_id=f"run-{i}", session=f"t/a/web/default/c{i}", tenant="t", agent="a", channel="web")
            for i in range(5)]  # fmt: skip
    await queue.add(made[0])
    await queue.judge(made[0], ReviewVerdict(verdict="fail", note="wrong tool", by="console:alice"))
    for sample in made[1:]:
        await queue.add(sample)
    assert [s.run_id for s, _ in await queue.samples("t")] == ["run-4", "run-3", "run-2"]
    await queue.judge(made[4], ReviewVerdict(verdict="pass", by="console:alice"))
    assert await async_redis.hkeys(KEYS.review_verdicts("t")) == [made[4].member.encode()]  # run-0's went with it


def test_the_sampling_settings_come_from_the_environment(base_env: dict[str, str]) -> None:
    env = {
        **base_env,
        "SWITCHBOARD_EVALS__SAMPLE_RATE": "0.05",
        "SWITCHBOARD_EVALS__AGENT_RATES": '{"support": 0.2}',
        "SWITCHBOARD_EVALS__EXCLUDE_TENANTS": '["acme"]',
        "SWITCHBOARD_EVALS__REDACT": "true",
        "SWITCHBOARD_EVALS__MAX_PER_TENANT": "50",
    }
    evals = load_settings(env).evals
    assert (evals.sample_rate, evals.agent_rates, evals.exclude_tenants) == (0.05, {"support": 0.2}, ("acme",))
    assert evals.redact and evals.max_per_tenant == 50 and evals.rate("acme", "support") == 0.0
    with pytest.raises(ConfigError, match="SWITCHBOARD_EVALS__SAMPLE_RATE"):
        load_settings({**base_env, "SWITCHBOARD_EVALS__SAMPLE_RATE": "1.5"})


async def test_erasing_a_tenant_erases_its_samples(async_redis: aioredis.Redis, tmp_path: Path) -> None:
    await _sampled(async_redis, tmp_path / "a")
    await _sampled(async_redis, tmp_path / "b", tenant="other")
    queue = ReviewQueue(async_redis)
    [(sample, _)] = await queue.samples("default")
    await queue.judge(sample, ReviewVerdict(verdict="pass", by="console:alice"))
    await Eraser(async_redis).erase("default", by="test")
    assert await async_redis.exists(KEYS.review_runs("default"), KEYS.review_verdicts("default")) == 0
    assert len(await queue.samples("other")) == 1  # another tenant's stay


async def test_erasing_a_session_erases_its_samples_and_verdicts(async_redis: aioredis.Redis, tmp_path: Path) -> None:
    gone = await _sampled(async_redis, tmp_path / "a")
    kept = await user_says(async_redis, conversation_ref(conversation="c2"), QUESTION, "evt-c2")
    await drain(async_redis, kept, tmp_path / "b", Sampler(async_redis, EvalSettings(sample_rate=1.0)))
    queue = ReviewQueue(async_redis)
    for sample, _ in await queue.samples("default"):
        await queue.judge(sample, ReviewVerdict(verdict="fail", by="console:alice"))
    report = await Eraser(async_redis).erase("default", session=gone, by="test")
    assert report.counts["review"] == 2  # the sample and its verdict
    left = await queue.samples("default")
    assert [s.session for s, _ in left] == [kept] and left[0][1] is not None


async def test_an_operator_of_every_tenant_sees_every_tenants_samples(
    async_redis: aioredis.Redis, review_env: dict[str, str], tmp_path: Path
) -> None:
    await _sampled(async_redis, tmp_path / "a")
    await _sampled(async_redis, tmp_path / "b", tenant="other")
    settings = load_settings(review_env)
    service = ControlService(async_redis, settings, Ingestor(async_redis, settings.queue))
    found = await service.review_samples(OperatorScope.everything("console:root"))
    assert sorted(s.tenant for s, _ in found) == ["default", "other"]
    scoped = await service.review_samples(OperatorScope(operator="console:bob", tenants=frozenset({"other"})))
    assert [s.tenant for s, _ in scoped] == ["other"]


# -- the console -----------------------------------------------------------------------------------------------------


async def test_reviewers_see_their_tenants_samples_only(
    console: Console, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    mine = await _sampled(async_redis, tmp_path / "a")
    await _sampled(async_redis, tmp_path / "b", tenant="other")
    assert (await console.login("alice")).status == 200
    body = await _samples(console)
    assert [s["session"] for s in body["samples"]] == [mine]
    assert body["samples"][0]["verdict"] is None and body["redacted"] is False
    assert (await console.login("bob")).status == 200
    assert [s["tenant"] for s in (await _samples(console))["samples"]] == ["other"]


async def test_a_verdict_is_kept_for_operators_only(
    console: Console, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    session = await _sampled(async_redis, tmp_path)
    assert (await console.login("alice")).status == 200
    run = (await _samples(console))["samples"][0]["run_id"]
    verdict = {"session": session, "run": run, "verdict": "fail", "note": "it should have asked first"}
    assert (await console.write("review/verdict", verdict, csrf=False)).status == 403
    for bad, status in (
        ({**verdict, "verdict": "maybe"}, 400),
        ({**verdict, "note": "x" * 5000}, 400),
        ({**verdict, "run": "run-unknown"}, 404),
        ({"session": session}, 400),
    ):
        assert (await console.write("review/verdict", bad)).status == status, bad
    assert (await _samples(console))["samples"][0]["verdict"] is None  # nothing changed
    resp = await console.write("review/verdict", verdict)
    assert resp.status == 200, await resp.text()
    kept = (await _samples(console))["samples"][0]["verdict"]
    assert kept["verdict"] == "fail" and kept["note"] == verdict["note"] and kept["by"] == "console:alice"

    assert (await console.login("carol")).status == 200  # a viewer
    assert (await console.write("review/verdict", {**verdict, "verdict": "pass"})).status == 403
    assert (await console.login("bob")).status == 200  # another tenant's operator
    assert (await console.write("review/verdict", {**verdict, "verdict": "pass"})).status == 403
    assert (await async_redis.hlen(KEYS.review_verdicts("default"))) == 1


async def test_the_transcript_withholds_words_from_a_viewer(
    console: Console, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    session = await _sampled(async_redis, tmp_path)
    assert (await console.login("alice")).status == 200
    seen = await (await console.client.get("/console/api/review/transcript", params={"session": session})).json()
    assert not seen["redacted"] and QUESTION in str(seen["transcript"])
    assert (await console.login("carol")).status == 200
    hidden = await (await console.client.get("/console/api/review/transcript", params={"session": session})).json()
    assert hidden["redacted"] and "Paris" not in str(hidden["transcript"])
    assert [line["tool"] for line in hidden["transcript"] if line["kind"] == "tool_call"] == ["lookup"]


async def test_a_sampled_run_becomes_a_replay_case_that_passes(
    console: Console, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    session = await _sampled(async_redis, tmp_path)
    assert (await console.login("alice")).status == 200
    run = (await _samples(console))["samples"][0]["run_id"]
    resp = await console.client.get("/console/api/review/case", params={"session": session, "run": run})
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Disposition"].startswith('attachment; filename="replay-assistant-')
    case = tmp_path / "case.yaml"
    case.write_text(await resp.text())
    [scenario] = load_scenarios(case)
    assert scenario.messages == [QUESTION] and [t.name for t in scenario.tools] == ["lookup"]
    agents = {"assistant": console.settings.file.agents["assistant"]}
    assert await asyncio.to_thread(eval_command, [case], agents=agents, out=StringIO()) == 0

    assert (
        await console.client.get("/console/api/review/case", params={"session": session, "run": "run-x"})
    ).status == 404
    for name in ("carol", "bob"):  # a viewer (no words), another tenant's operator
        assert (await console.login(name)).status == 200
        refused = await console.client.get("/console/api/review/case", params={"session": session, "run": run})
        assert refused.status == 403, name


async def test_redacted_reviews_show_no_words_to_anyone(
    review_env: dict[str, str], make_console: MakeConsole, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    console = await make_console({**review_env, "SWITCHBOARD_EVALS__REDACT": "1"})
    session = await _sampled(async_redis, tmp_path)
    assert (await console.login("alice")).status == 200
    body = await _samples(console)
    assert body["redacted"] is True
    seen = await (await console.client.get("/console/api/review/transcript", params={"session": session})).json()
    assert seen["redacted"] and "Paris" not in str(seen["transcript"])
    run = body["samples"][0]["run_id"]
    refused = await console.client.get("/console/api/review/case", params={"session": session, "run": run})
    assert refused.status == 403 and (await refused.json())["error"]["code"] == "redacted"


async def test_an_operators_words_are_not_replayed_as_the_models(
    console: Console, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    """A take-over, an operator's answer and a hand-back between two turns: the case holds the user's words, and
    what they said while the operator held the conversation goes with their next turn (the operator's is no step)."""
    session = await user_says(async_redis, conversation_ref(), QUESTION, "evt-1")
    await drain(async_redis, session, tmp_path)
    assert (await console.login("alice")).status == 200
    for path, extra in (("take-over", {}), ("say", {"text": "Alice here, one moment."}), ("hand-back", {})):
        if path == "say":  # the user speaks while the operator holds the conversation; the operator answers
            await user_says(async_redis, conversation_ref(), "are you there?", "evt-held")
            await drain(async_redis, session, tmp_path)
        resp = await console.write(f"sessions/{path}", {"session": session, **extra})
        assert resp.status == 202, await resp.text()
        await drain(async_redis, session, tmp_path)
    await user_says(async_redis, conversation_ref(), "thanks, and now?", "evt-2")
    await drain(async_redis, session, tmp_path)
    resp = await console.client.get("/console/api/review/case", params={"session": session})
    assert resp.status == 200, await resp.text()
    text = await resp.text()
    assert "Alice here" not in text
    case = tmp_path / "case.yaml"
    case.write_text(text)
    [scenario] = load_scenarios(case)
    assert scenario.messages == [QUESTION, "are you there?\nthanks, and now?"]
    agents = {"assistant": console.settings.file.agents["assistant"]}
    assert await asyncio.to_thread(eval_command, [case], agents=agents, out=StringIO()) == 0


async def test_first_verdicts_are_counted_by_agent_and_tenant_on_metrics(
    console: Console, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    session = await _sampled(async_redis, tmp_path)
    assert (await console.login("alice")).status == 200
    run = (await _samples(console))["samples"][0]["run_id"]
    verdict = {"session": session, "run": run, "verdict": "fail", "note": "it should have asked first"}
    assert (await console.write("review/verdict", verdict)).status == 200
    assert (await console.write("review/verdict", {**verdict, "verdict": "pass"})).status == 200  # a changed mind

    text = await (await console.client.get("/metrics")).text()
    counted = [line for line in text.splitlines() if line.startswith("switchboard_review_verdicts_total{")]
    assert counted == ['switchboard_review_verdicts_total{agent="assistant",tenant="default",verdict="fail"} 1.0']
    assert (await _samples(console))["samples"][0]["verdict"]["verdict"] == "pass"  # the verdict kept is the last
