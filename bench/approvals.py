"""Approval round trip on the web chat: from the click on "Approve" to the resumed run's answer.

The real gateway (``switchboard web`` + one ``switchboard worker``, embedded-free: a private Valkey) serves two
agents that differ only in policy: ``gated`` needs approval for ``write_file``, ``plain`` does not. Each sample
opens a web chat session and asks the offline model for the same tool call (``/tool write_file {...}``):

- **plain** (the baseline): message → the tool runs → the answer; timed from the POST to the final ``message``
  event on the session's stream;
- **gated**: message → the approval offer (buttons) arrives; then the click (``{"choice": "approval:…:approve:…"}``)
  → the decision is applied, the state and authorisation re-checked, the tool runs under its recorded key, the
  model continues → the answer; timed from the click's POST to the final ``message``.

What the issue asks for is the overhead of the round trip (click to resumed program): the table shows both medians
and their ratio (gated click→answer over plain message→answer), plus the message→offer time of the gated agent.
Medians of ``--samples`` per round, sessions alternating between the two agents so both see the same noise.

    python -m bench.approvals
    python -m bench.approvals --samples 60 --rounds 3
    python -m bench.approvals --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench._harness import fmt, median, render_table, workdir
from bench._stack import HIGH_LIMITS, gateway

CONFIG = """\
tenant: default
default_agent: plain
channels:
  web: {agents: [plain, gated]}
agents:
  plain:
    profile: {name: Plain, description: Writes files without asking.}
    instructions: Answer briefly.
    tools: [write_file]
  gated:
    profile: {name: Gated, description: Asks before writing files.}
    instructions: Answer briefly.
    tools: [write_file]
    policy:
      rules:
        - {name: ask-before-writing, tool: write_file, decide: approve, reason: the benchmark gates every write}
"""
GUARD_S = 30.0
"""Upper bound on one wait: a guard against a hang, not a timing assertion."""


@dataclass
class Sample:
    """Timings of one session, in milliseconds."""

    agent: str
    to_offer_ms: float | None = None
    to_answer_ms: float = 0.0


@dataclass
class _Stream:
    """The events of one web chat session's SSE stream, as they arrive."""

    events: asyncio.Queue[tuple[str, dict[str, Any], float]] = field(default_factory=asyncio.Queue)

    async def next(self, kind: str) -> tuple[dict[str, Any], float]:
        """The next event named ``kind`` (others skipped) and when it arrived."""
        async with asyncio.timeout(GUARD_S):
            while True:
                name, data, at = await self.events.get()
                if name == kind:
                    return data, at


async def _read_sse(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    name, data = "message", ""
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                yield name, json.loads(data)
            name, data = "message", ""
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()


async def _listen(http: aiohttp.ClientSession, base: str, token: str, stream: _Stream, ready: asyncio.Event) -> None:
    async with http.get(f"{base}/api/chat/stream", params={"token": token}) as response:
        response.raise_for_status()
        ready.set()
        async for name, data in _read_sse(response):
            stream.events.put_nowait((name, data, time.perf_counter()))


async def _post(http: aiohttp.ClientSession, base: str, token: str, body: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with http.post(f"{base}/api/chat/messages", json=body, headers=headers) as response:
        if response.status != 202:
            raise RuntimeError(f"POST /api/chat/messages answered {response.status}: {await response.text()}")


async def _one(http: aiohttp.ClientSession, base: str, agent: str, n: int) -> Sample:
    async with http.post(f"{base}/api/chat/sessions", json={"agent": agent}) as response:
        response.raise_for_status()
        token = (await response.json())["token"]
    stream, ready = _Stream(), asyncio.Event()
    listener = asyncio.create_task(_listen(http, base, token, stream, ready))
    try:
        await asyncio.wait_for(ready.wait(), GUARD_S)
        call = json.dumps({"path": f"note-{n}.txt", "content": f"sample {n}"})
        sent = time.perf_counter()
        await _post(http, base, token, {"text": f"/tool write_file {call}", "client_id": f"m{n}"})
        sample = Sample(agent)
        if agent == "plain":
            _, at = await stream.next("message")
            sample.to_answer_ms = (at - sent) * 1000
            return sample
        while True:  # the approval offer: the message that carries the decision buttons
            offer, at = await stream.next("message")
            approve = [c["id"] for c in offer.get("choices", []) if ":approve:" in str(c.get("id"))]
            if approve:
                break
        sample.to_offer_ms = (at - sent) * 1000
        clicked = time.perf_counter()
        await _post(http, base, token, {"text": "Approve", "choice": approve[0], "client_id": f"c{n}"})
        _, at = await stream.next("message")
        sample.to_answer_ms = (at - clicked) * 1000
        return sample
    finally:
        listener.cancel()


async def _round(samples: int, tmp: Path) -> list[Sample]:
    config = tmp / "bench.yaml"
    config.write_text(CONFIG)
    env = {**HIGH_LIMITS, "SWITCHBOARD_CONFIG": str(config), "SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR": "0"}
    stack_of = gateway(tmp, web_cpus=None, worker_cpus=None, web_env=env, worker_env=env)
    async with stack_of as stack, aiohttp.ClientSession() as http:
        for warm in range(2):  # first imports, first Monty/tool threads: not measured
            await _one(http, stack.web_url, "gated", 10_000 + warm)
            await _one(http, stack.web_url, "plain", 20_000 + warm)
        found: list[Sample] = []
        for n in range(samples):
            found.append(await _one(http, stack.web_url, "plain" if n % 2 else "gated", n))
        return found


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--samples", type=int, default=40, help="sessions per round (half per agent)")
    args.add_argument("--rounds", type=int, default=3)
    args.add_argument("--quick", action="store_true", help="one round of 10 samples")
    opts = args.parse_args(argv)
    rounds, samples = (1, 10) if opts.quick else (opts.rounds, opts.samples)
    rows = []
    for r in range(rounds):
        with workdir("sb-bench-approvals-") as tmp:
            found = asyncio.run(_round(samples, tmp))
        plain = median([s.to_answer_ms for s in found if s.agent == "plain"])
        click = median([s.to_answer_ms for s in found if s.agent == "gated"])
        offer = median([s.to_offer_ms for s in found if s.agent == "gated" and s.to_offer_ms is not None])
        rows.append([str(r + 1), fmt(plain), fmt(offer), fmt(click), f"{click / plain:.2f}×"])
    headers = ["round", "plain: message→answer ms", "gated: message→offer ms", "gated: click→answer ms", "ratio"]
    print(render_table("Approval round trip on the web chat (medians, ms)", headers, rows))
    ratios = sorted(float(row[-1].rstrip("×")) for row in rows)
    print(f"\nmedian ratio (click→answer over message→answer): {ratios[len(ratios) // 2]:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
