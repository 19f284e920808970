"""Teams' 15-second window: N messages, a 10-second agent run behind each, every activity re-sent like Teams does.

The gateway runs as an operator runs it (``python -m switchboard web`` and one ``worker``, real Redis), with the Teams
channel pointed at the fake Bot Framework (this process: OpenID metadata + keys, the Entra token endpoint, the
Connector). The agent is the real runtime on the offline model with ``SWITCHBOARD_OFFLINE__DELAY_MS=10000``: every
turn takes ten seconds before the model says a word. Each activity is posted with a freshly signed token, then posted
again at +5 s (while the agent runs) and at +15 s (when the Connector gives up on a bot that has not answered).

Printed per round: the acknowledgement latency of every post (median, max), the time from the first post to the
first visible reply (the streamed preview) and to the complete reply (the last edit), both against the 10-second
agent run itself (the baseline: what no gateway can beat), how many messages were answered completely within 15 s,
and duplicates — replies beyond the first in any conversation (must be 0).

    python -m bench.teams_window                  # 20 messages, 10-second runs
    python -m bench.teams_window --messages 50
    python -m bench.teams_window --quick          # 3 messages (figures meaningless)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench._harness import PYTHON, Proc, bench_env, fmt, free_port, median, parser, render_table, start_redis, workdir
from bench._stack import HIGH_LIMITS
from switchboard.channels.teams.fake.platform import FakeTeams, make_activity

APP_ID = "00000000-bench-4000-8000-000000000000"
PASSWORD = "bench-client-secret"
WINDOW_S = 15.0
RESENDS_S = (5.0, 15.0)


@dataclass
class Conversation:
    """One user's chat: when its activity went in, how the posts were answered, what the fake received."""

    conversation: str
    activity: dict[str, object]
    sent_at: float = 0.0
    acks_ms: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)


async def _post(http: aiohttp.ClientSession, url: str, fake: FakeTeams, conv: Conversation) -> None:
    body = json.dumps(conv.activity).encode()
    headers = fake.key.authorization(APP_ID, fake.service_url)  # a fresh token per post, as the Connector signs
    start = time.perf_counter()
    async with http.post(url, data=body, headers=headers) as resp:
        await resp.read()
    conv.acks_ms.append((time.perf_counter() - start) * 1000)
    conv.statuses.append(resp.status)


async def _user(http: aiohttp.ClientSession, url: str, fake: FakeTeams, conv: Conversation) -> None:
    conv.sent_at = time.time()
    await _post(http, url, fake, conv)
    for at in RESENDS_S:
        await asyncio.sleep(max(0.0, conv.sent_at + at - time.time()))
        await _post(http, url, fake, conv)


async def _round(messages: int, delay_ms: int, tmp: Path) -> dict[str, float]:
    server = start_redis(tmp, None)
    fake = FakeTeams(app_id=APP_ID, app_password=PASSWORD)
    await fake.start()
    procs: list[Proc] = []
    try:
        port = free_port()
        env = bench_env(server.url, tmp / "data", port=port) | HIGH_LIMITS
        env.update(
            {
                "SWITCHBOARD_TEAMS__APP_ID": APP_ID,
                "SWITCHBOARD_TEAMS__APP_PASSWORD": PASSWORD,
                "SWITCHBOARD_TEAMS__OPENID_METADATA_URL": fake.metadata_url,
                "SWITCHBOARD_TEAMS__LOGIN_BASE_URL": fake.base_url,
                "SWITCHBOARD_MODEL": "offline",
                "SWITCHBOARD_OFFLINE__DELAY_MS": str(delay_ms),
            }
        )
        web = Proc("web", [PYTHON, "-m", "switchboard", "web"], env=env, log_dir=tmp)
        procs.append(web)
        url = f"http://127.0.0.1:{port}"
        await asyncio.to_thread(web.wait_http, f"{url}/healthz")
        worker = Proc("worker", [PYTHON, "-m", "switchboard", "worker"], env=env, log_dir=tmp)
        procs.append(worker)
        await _wait_worker(url, worker)
        convs = [
            Conversation(
                f"a:1bench-{n:04d}",
                make_activity(
                    f"question number {n:04d}",
                    service_url=fake.service_url,
                    app_id=APP_ID,
                    conversation=f"a:1bench-{n:04d}",
                    activity_id=str(1_764_000_000_000 + n),
                ),
            )
            for n in range(messages)
        ]
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(_user(http, f"{url}/webhooks/teams", fake, c) for c in convs))
            deadline = time.monotonic() + delay_ms / 1000 + 30
            while time.monotonic() < deadline and not all(_complete(fake, c) for c in convs):
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)  # anything late (a duplicate) would arrive now
        return _figures(fake, convs, delay_ms)
    finally:
        for proc in reversed(procs):
            proc.stop()
        await fake.stop()
        server.stop()


async def _wait_worker(url: str, worker: Proc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if worker.popen.poll() is not None:
                raise RuntimeError(f"worker exited:\n{worker.tail()}")
            try:
                async with http.get(f"{url}/healthz") as resp:
                    if resp.status == 200 and (await resp.json()).get("workers", 0) >= 1:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"no live worker:\n{worker.tail()}")


def _token(conv: Conversation) -> str:
    return str(conv.activity["text"]).rsplit(" ", 1)[-1]


def _complete(fake: FakeTeams, conv: Conversation) -> bool:
    texts = [text for (c, _), text in fake.messages.items() if c == conv.conversation]
    return any(_token(conv) in t and t.rstrip().endswith((".", "!", "?")) for t in texts)


def _figures(fake: FakeTeams, convs: list[Conversation], delay_ms: int) -> dict[str, float]:
    first, complete, duplicates, within, answered = [], [], 0, 0, 0
    for conv in convs:
        posts = fake.sent(conv.conversation)
        calls = [c for c in fake.calls if c.conversation == conv.conversation and c.status < 300]
        edits = [c for c in calls if c.method == "PUT" or c.body.get("type") == "message"]
        duplicates += max(0, len(posts) - 1)
        if not posts or not _complete(fake, conv):
            continue
        answered += 1
        first.append(posts[0].time - conv.sent_at)
        done = max(c.time for c in edits) - conv.sent_at
        complete.append(done)
        within += done <= WINDOW_S
    acks = [a for conv in convs for a in conv.acks_ms]
    bad = sum(1 for conv in convs for s in conv.statuses if s != 202)
    return {
        "messages": len(convs),
        "posts": len(acks),
        "non_202": bad,
        "ack_p50_ms": median(acks),
        "ack_max_ms": max(acks),
        "agent_s": delay_ms / 1000,
        "first_p50_s": median(first) if first else float("nan"),
        "first_max_s": max(first) if first else float("nan"),
        "complete_p50_s": median(complete) if complete else float("nan"),
        "complete_max_s": max(complete) if complete else float("nan"),
        "answered": answered,
        "within_15s": within,
        "duplicates": duplicates,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the figures."""
    ap = parser(__doc__ or "")
    ap.add_argument("--messages", type=int, default=20)
    ap.add_argument("--delay-ms", type=int, default=10_000, help="the agent run (offline model delay)")
    ns = ap.parse_args(argv)
    messages = 3 if ns.quick else ns.messages
    rounds = max(1, ns.rounds or 1)
    rows = []
    with workdir("sb-teams-window-") as tmp:
        for n in range(rounds):
            found = asyncio.run(_round(messages, ns.delay_ms, tmp / f"round{n}"))
            rows.append(found)
    headers = [
        "round",
        "msgs",
        "posts",
        "non-202",
        "ack p50 ms",
        "ack max ms",
        "agent s",
        "first p50 s",
        "first max s",
        "done p50 s",
        "done max s",
        "answered",
        "≤15 s",
        "duplicates",
    ]
    table = [
        [n + 1, int(r["messages"]), int(r["posts"]), int(r["non_202"]), fmt(r["ack_p50_ms"], 1),
         fmt(r["ack_max_ms"], 1), fmt(r["agent_s"], 1), fmt(r["first_p50_s"], 2), fmt(r["first_max_s"], 2),
         fmt(r["complete_p50_s"], 2), fmt(r["complete_max_s"], 2), int(r["answered"]), int(r["within_15s"]),
         int(r["duplicates"])]
        for n, r in enumerate(rows)
    ]  # fmt: skip
    print(render_table("Teams: answered within the 15-second window, never twice", headers, table))
    ok = all(r["duplicates"] == 0 and r["within_15s"] == r["messages"] and r["non_202"] == 0 for r in rows)
    print("target (every message answered within 15 s, none twice):", "met" if ok else "NOT met")
    return 0 if ok or ns.quick else 1


if __name__ == "__main__":
    sys.exit(main())
