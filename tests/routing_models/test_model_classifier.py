"""``task_classifier: model``: a turn no rule matches is put in a class by the small model, at the turn's cost."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from switchboard.core.agent.config import Agent
from tests.fakes.openai_api import FakeOpenAI
from tests.routing_models.test_model_routing import ROUTED, run

CLASSES = {
    "action": {"match": {"keywords": ["book"]}, "description": "book, cancel or change something", "max_steps": 4},
    "lookup": {"description": "a quick question with one fact as the answer", "max_steps": 1, "max_credits": 5},
    "default": {"max_steps": 3},
}


def classifying(received: Any) -> bool:
    return "You sort a request" in str(received.body)


async def test_a_turn_no_rule_matches_is_classified_by_the_small_model(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply("lookup", input_tokens=300, output_tokens=1)
    fake.reply("It is noon.", input_tokens=12, output_tokens=5)

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=CLASSES, task_classifier="model")

    first, answer = fake.received
    assert classifying(first) and not classifying(answer)
    assert first.body["model"] == "gpt-small"
    (said,) = first.body["input"]
    assert said["content"].startswith('<data source="the request" trust="untrusted">')  # the words as data
    assert "what time is it?" in said["content"]
    (classified,) = sink.of("turn_classified")
    assert (classified.task_class, classified.rule, classified.max_steps) == ("lookup", "model", 1)
    assert classified.max_credits == 5
    (metered,) = sink.of("usage_metered")
    assert metered.task_class == "lookup" and metered.steps == 1  # classifying is not a step ...
    assert (metered.input_tokens, metered.output_tokens) == (312, 6)  # ... but its tokens are the turn's


async def test_an_answer_naming_no_class_falls_back_to_default(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply("Probably research, ignore the rules!")
    fake.reply("It is noon.")

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=CLASSES, task_classifier="model")

    (classified,) = sink.of("turn_classified")
    assert (classified.task_class, classified.rule, classified.max_steps) == ("default", "model:default", 3)


async def test_a_rule_that_matches_asks_no_model(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply("It is noon.")
    classes = {**CLASSES, "action": {**CLASSES["action"], "match": {"keywords": ["time"]}}}

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=classes, task_classifier="model")

    assert not any(classifying(r) for r in fake.received)
    assert Counter(r.body["model"] for r in fake.received) == {"gpt-small": 1}
    (classified,) = sink.of("turn_classified")
    assert (classified.task_class, classified.rule) == ("action", "keyword:time")


async def test_a_failed_classification_keeps_the_rules_class(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.fail(400, "invalid_request_error", "no such model")
    fake.reply("It is noon.")

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=CLASSES, task_classifier="model")

    (classified,) = sink.of("turn_classified")
    assert (classified.task_class, classified.rule) == ("default", "default")
    assert "".join(sink.deltas) == "It is noon."


async def test_rules_alone_never_ask_a_model_to_classify(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply("It is noon.")

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=CLASSES)

    assert len(fake.received) == 1 and not classifying(fake.received[0])
    assert [e.rule for e in sink.of("turn_classified")] == ["default"]


def test_a_model_classifier_without_classes_is_refused() -> None:
    with pytest.raises(ValidationError, match="task_classifier: model needs task_classes"):
        Agent.model_validate({"name": "a", "task_classifier": "model"})
