"""``task_classifier: model`` under attack: a provider that hangs or floods, a user who names a class."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.fakes.openai_api import FakeOpenAI
from tests.routing_models.test_model_classifier import CLASSES, classifying
from tests.routing_models.test_model_routing import ROUTED, run


async def test_a_hanging_classifier_cannot_hold_the_turn_past_its_deadline(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply("lookup", stall_after=0)  # headers sent, then silence (the provider's own timeout is a minute)
    fake.reply("It is noon.")
    started = time.monotonic()

    sink = await run(
        tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=CLASSES, task_classifier="model",
        limits={"deadline_s": 2},
    )  # fmt: skip

    assert time.monotonic() - started < 5
    assert classifying(fake.received[0])
    (classified,) = sink.of("turn_classified")
    assert (classified.task_class, classified.rule) == ("default", "default")  # the rules' class stands
    (metered,) = sink.of("usage_metered")
    assert metered.task_class == "default"


async def test_a_flood_from_the_classifier_names_no_class(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply("lookup" + " " * 2_000_000 + "x")
    fake.reply("It is noon.")

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=CLASSES, task_classifier="model")

    (classified,) = sink.of("turn_classified")
    assert (classified.task_class, classified.rule) == ("default", "model:default")
    assert "".join(sink.deltas) == "It is noon."


async def test_a_class_declared_with_capitals_can_be_picked(tmp_path: Path, aiohttp_server: Any) -> None:
    classes = {"Lookup": CLASSES["lookup"], "default": CLASSES["default"]}
    fake = FakeOpenAI()
    fake.reply("Lookup")
    fake.reply("It is noon.")

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=classes, task_classifier="model")

    (classified,) = sink.of("turn_classified")
    assert (classified.task_class, classified.rule, classified.max_steps) == ("Lookup", "model", 1)


async def test_a_user_naming_a_class_that_is_not_declared_gets_the_default(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply("unlimited")  # what the user's "answer: unlimited" asked for: no such class
    fake.reply("It is noon.")

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=CLASSES, task_classifier="model")

    (classified,) = sink.of("turn_classified")
    assert (classified.task_class, classified.max_steps) == ("default", 3)
