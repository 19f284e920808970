"""The routing example's cost per correct result against one strong model (``docs/evals.md``).

Runs the scenarios of ``evals/routing/`` twice through ``switchboard eval``'s runner, on the real OpenAI adapter
talking HTTP to the fake OpenAI API (``tests/fakes/openai_api.py``):

- ``routed``: ``models: {small: openai:gpt-4o-mini, strong: openai:gpt-4o}`` (the small model picks the tool and its
  argument, the strong one answers from the tool result);
- ``strong``: ``model: openai:gpt-4o`` for every step.

Prices are realistic per-token prices in US dollars (one credit = one dollar): gpt-4o-mini $0.15 / $0.60 and gpt-4o
$2.50 / $10 per million input / output tokens. The fake model is deterministic and not equally good: it reads the
user's time zone with a pattern, and the small model's pattern keeps only two parts of a zone name, so it misreads
``America/Argentina/Buenos_Aires`` (one scenario of five). Input tokens are the request's size in characters / 4
(system prompt, tool catalog and conversation, as a provider counts them roughly); output tokens the answer's.

    python -m bench.eval_routing              # prints the side-by-side figures
    python -m bench.eval_routing --json OUT   # and writes every result
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from io import StringIO
from pathlib import Path
from typing import Any

from aiohttp import web

from switchboard.core.providers import ProviderConfig
from switchboard.evals.report import side_by_side, summary
from switchboard.evals.runner import EvalSetup, ScenarioResult, Variant, run_scenarios
from switchboard.evals.scenario import Scenario, load_scenarios
from tests.fakes.model_script import Call, Failure, Reply
from tests.fakes.openai_api import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "evals" / "routing"
SMALL, STRONG = "openai:gpt-4o-mini", "openai:gpt-4o"
PRICES = {SMALL: {"input": 0.00015, "output": 0.0006}, STRONG: {"input": 0.0025, "output": 0.01}}
"""Credits (dollars) per 1,000 tokens."""
VARIANTS = [
    Variant(name="routed", overrides={"models": {"small": SMALL, "strong": STRONG}}),
    Variant(name="strong", overrides={"model": STRONG, "models": None}),
]
_ZONE = {
    "gpt-4o": re.compile(r"\bin ([A-Za-z]+(?:/[A-Za-z_]+)*)"),
    "gpt-4o-mini": re.compile(r"\bin ([A-Za-z]+(?:/[A-Za-z_]+)?)"),  # reads at most two parts of a zone name
}
_CLOCK = re.compile(r"\d\d:\d\d(:\d\d)?")


class RoutingFake(FakeOpenAI):
    """The fake OpenAI API answering time questions: a ``current_time`` call, then the time from its result.

    Speaks both wire APIs (Responses, and Chat Completions, which the adapter uses for a base URL that is not OpenAI's).
    """

    def next(self) -> Reply | Failure:
        body = self.received[-1].body  # the request being answered (recorded just before this is called)
        model, items = str(body.get("model", "")), body.get("input") or body.get("messages") or []
        tokens = len(json.dumps(body)) // 4
        last = items[-1] if items else {}
        if last.get("type") == "function_call_output" or last.get("role") == "tool":  # Responses or Chat wire
            found = _CLOCK.search(str(last.get("output", last.get("content", ""))))
            text = f"It is {found.group(0)} there." if found else "Sorry, I could not read the clock for that place."
            return Reply(text=[text], input_tokens=tokens, output_tokens=len(text) // 4 + 2)
        asked = next((i for i in reversed(items) if i.get("role") == "user"), {})
        zone = _ZONE.get(model, _ZONE["gpt-4o"]).search(json.dumps(asked.get("content", "")))
        arguments = {"timezone": zone.group(1) if zone else "UTC"}
        return Reply(calls=[Call("current_time", arguments)], input_tokens=tokens, output_tokens=18)


async def measure(scenarios: list[Scenario]) -> dict[str, list[ScenarioResult]]:
    """Each variant's results, against the fake OpenAI API on a local port."""
    fake = RoutingFake()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    setup = EvalSetup(
        providers=ProviderConfig(openai_api_key="sk-bench", openai_base_url=f"http://127.0.0.1:{port}/v1"),
        prices=PRICES,
    )
    try:
        await run_scenarios(scenarios[:1], setup=setup, variant=VARIANTS[0])  # warm up: the SDK's first import
        return {v.name: await run_scenarios(scenarios, concurrency=2, setup=setup, variant=v) for v in VARIANTS}
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Run both variants and print them side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--small-threshold", type=float, default=0.9)
    args = parser.parse_args(argv)
    scenarios = [s for path in sorted(SCENARIOS.glob("*.yaml")) for s in load_scenarios(path)]
    started = time.perf_counter()
    by_variant = asyncio.run(measure(scenarios))
    out = StringIO()
    side_by_side(by_variant, out, args.small_threshold)
    sys.stdout.write(out.getvalue())
    routed, strong = (summary(by_variant[v.name]) for v in VARIANTS)
    if routed["model_cost_per_correct"] and strong["model_cost_per_correct"]:
        ratio = strong["model_cost_per_correct"] / routed["model_cost_per_correct"]
        sys.stdout.write(
            f"model cost per correct result: routed ${routed['model_cost_per_correct']:.6f}, "
            f"strong ${strong['model_cost_per_correct']:.6f} ({ratio:.2f}x)\n"
        )
    sys.stdout.write(
        f"{len(scenarios)} scenarios x {len(VARIANTS)} variants in {time.perf_counter() - started:.1f} s\n"
    )
    if args.json is not None:
        dumped: dict[str, Any] = {
            name: [r.model_dump(mode="json") for r in results] for name, results in by_variant.items()
        }
        args.json.write_text(json.dumps(dumped, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
