"""Slack ingest: req/s of ``switchboard web``'s ``POST /webhooks/slack`` against slack-bolt's aiohttp adapter.

Three servers (and a reference row), each alone on the server core, loaded in turn by ``wrk -t1 -c32`` on the
other core (where the embedded Redis-compatible server and the fake Slack Web API run too), as in ``bench.ingest``:

(a) ``switchboard web``, ``POST /webhooks/slack`` — ``message.im`` events of ~1.5 KB, each signed for real
    (v0 HMAC over its own bytes; wrk signs in Lua, see ``bench/_slack_load.py``), distinct ``ts``/``event_id``
    over 1,000 DMs, through the full durable ingest (verify → parse → one Lua script → empty 200);
(b) slack-bolt's ``AsyncApp`` served by its aiohttp adapter (``app.web_app()``) with a no-op ``message``
    listener: signature check, parse, ack (what a user would otherwise run; it stores nothing);
(c) a raw aiohttp handler that reads the body and answers 200 (the ceiling);
(d) for reference, the same ``switchboard web`` process's Telegram webhook under ``bench.ingest``'s load.

Every round measures all three one after another; ratios are taken within a round, the table shows medians over
rounds. ``accepted`` is read back from Redis as a check that what was acknowledged is really stored.

    python -m bench.slack_ingest            # 3 rounds of 10 s per server
    python -m bench.slack_ingest --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass, field

from bench._harness import (
    PYTHON,
    SUMMARY_HEADERS,
    Proc,
    Row,
    bench_env,
    cores,
    fmt,
    free_port,
    median,
    parser,
    pin,
    render_table,
    rounds_of,
    start_redis,
    verdicts,
    workdir,
)
from bench._load import WRK_INSTALL_HINT, LoadResult, PostLoad, telegram_load, wrk_path
from bench._slack_load import SIGNING_SECRET, self_check, slack_load
from bench.ingest import LIMITS, measure_round

TARGET_RATIO = 1.5
CONNECTIONS = 32
BOT_TOKEN = "xoxb-bench-0000000000-slack"


@dataclass
class Target:
    """One server under load."""

    key: str
    label: str
    proc: Proc
    url: str
    path: str
    switchboard: bool
    results: list[LoadResult] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)


def _spec(target: Target, start: int) -> PostLoad:
    """What a target receives: signed Slack events, or Telegram updates for the reference row."""
    if target.key == "telegram":
        return telegram_load(start=start)
    return slack_load(path=target.path, start=start)


def serve_bolt(port: int, api: str) -> None:
    """slack-bolt's AsyncApp on its aiohttp adapter with a no-op ``message`` listener."""
    from aiohttp import web
    from slack_bolt.async_app import AsyncApp
    from slack_sdk.web.async_client import AsyncWebClient

    client = AsyncWebClient(token=BOT_TOKEN, base_url=api)
    app = AsyncApp(signing_secret=SIGNING_SECRET, client=client)

    @app.event("message")
    async def noop() -> None:
        return None

    web.run_app(app.web_app(path="/slack/events"), host="127.0.0.1", port=port, access_log=None, print=None)


def serve_fake(port: int) -> None:
    """The fake Slack Web API until SIGTERM."""
    from switchboard.channels.slack.fake.platform import FakeSlack

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        fake = FakeSlack(bot_token=BOT_TOKEN)
        await fake.start(port=port)
        try:
            await stop.wait()
        finally:
            await fake.stop()

    asyncio.run(main())


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "slack ingest")
    p.add_argument("--seconds", type=float, default=None, help="load per measurement (default 10, quick 1)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up load before each measurement (default 2)")
    p.add_argument("--load", choices=["auto", "wrk", "python"], default="auto", help="load generator")
    ns = p.parse_args(argv)
    rounds = rounds_of(ns)
    seconds = ns.seconds or (1.0 if ns.quick else 10.0)
    warmup = ns.warmup if ns.warmup is not None else (0.0 if ns.quick else 2.0)
    generator = ns.load
    if generator == "auto":
        generator = "wrk" if wrk_path() else "python"
        if generator == "python":
            print(f"WARNING: {WRK_INSTALL_HINT}", file=sys.stderr)
    self_check()
    server_cpus, load_cpus = cores()
    pin(os.getpid(), load_cpus)
    print(
        f"slack ingest: {rounds} round(s) × {seconds:g} s per server, {generator}, {CONNECTIONS} connections; "
        f"server on CPU {sorted(server_cpus or [])}, load + Redis + fake Slack on CPU {sorted(load_cpus or [])}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    with workdir("sb-bench-slack-") as tmp:
        server = start_redis(tmp, load_cpus)
        procs: list[Proc] = []
        try:
            fake_port = free_port()
            fake = Proc(
                "fake-slack",
                [PYTHON, "-m", "bench.slack_ingest", "serve-fake", "--port", str(fake_port)],
                cpus=load_cpus,
                log_dir=tmp,
            )
            procs.append(fake)
            api = f"http://127.0.0.1:{fake_port}/api/"
            fake.wait_http(f"http://127.0.0.1:{fake_port}/_fake/calls")
            targets = _start(tmp, server.url, api, server_cpus, procs)
            for number in range(1, rounds + 1):
                spec = await measure_round(
                    number, targets, _spec, server.url, warmup=warmup, seconds=seconds, cpus=load_cpus,
                    scratch=tmp, generator=generator,
                )  # fmt: skip
        finally:
            for proc in reversed(procs):
                proc.stop()
            server.stop()
    return verdicts(report(targets, rounds, spec.body_bytes), ns.quick)


def _start(tmp: os.PathLike[str], redis_url: str, api: str, cpus: set[int] | None, procs: list[Proc]) -> list[Target]:
    from pathlib import Path

    root = Path(tmp)
    targets: list[Target] = []
    port = free_port()
    env = bench_env(
        redis_url,
        root / "data",
        port=port,
        telegram_url="http://127.0.0.1:9",  # the reference row; getMe fails fast and is only logged
        SWITCHBOARD_SLACK__BOT_TOKEN=BOT_TOKEN,
        SWITCHBOARD_SLACK__SIGNING_SECRET=SIGNING_SECRET,
        SWITCHBOARD_SLACK__API_BASE_URL=api,
        **LIMITS["on"],
    )
    proc = Proc("switchboard", [PYTHON, "-m", "switchboard", "web"], env=env, cpus=cpus, log_dir=root)
    procs.append(proc)
    proc.wait_http(f"http://127.0.0.1:{port}/healthz")
    targets.append(
        Target("slack", "switchboard web: Slack Events API", proc, f"http://127.0.0.1:{port}", "/webhooks/slack", True)
    )
    reference = "switchboard web: Telegram webhook (same process, reference)"
    targets.append(Target("telegram", reference, proc, f"http://127.0.0.1:{port}", "/webhooks/telegram", True))
    port = free_port()
    proc = Proc(
        "bolt",
        [PYTHON, "-m", "bench.slack_ingest", "serve-bolt", "--port", str(port), "--api", api],
        cpus=cpus,
        log_dir=root,
    )
    procs.append(proc)
    proc.wait_http(f"http://127.0.0.1:{port}/slack/events", ok=None)
    targets.append(
        Target(
            "bolt",
            "slack-bolt AsyncApp, aiohttp adapter, no-op listener (baseline)",
            proc,
            f"http://127.0.0.1:{port}",
            "/slack/events",
            False,
        )
    )
    port = free_port()
    proc = Proc("aiohttp", [PYTHON, "-m", "bench._servers", "aiohttp", "--port", str(port)], cpus=cpus, log_dir=root)
    procs.append(proc)
    proc.wait_http(f"http://127.0.0.1:{port}/healthz")
    targets.append(
        Target(
            "aiohttp", "raw aiohttp hello-world (ceiling)", proc, f"http://127.0.0.1:{port}", "/webhooks/slack", False
        )
    )
    return targets


def report(targets: list[Target], rounds: int, body_bytes: int) -> list[Row]:
    """Print the per-round and summary tables; return the summary rows."""
    by = {t.key: t for t in targets}
    per_round = [
        [
            i + 1,
            t.key,
            fmt(t.results[i].rps, 0),
            fmt(t.results[i].p50_ms, 2),
            fmt(t.results[i].p99_ms, 2),
            fmt(t.cpu_us[i], 0),
            t.results[i].requests,
            str(t.accepted[i]) if t.switchboard else "—",
            t.results[i].errors,
        ]
        for i in range(rounds)
        for t in targets
    ]
    headers = ["round", "server", "req/s", "p50 ms", "p99 ms", "server CPU µs/req", "answered", "accepted", "errors"]
    print()
    print(render_table("Slack ingest, every round", headers, per_round))

    def ratio(t: Target, base: Target) -> float:
        return median([a.rps / b.rps for a, b in zip(t.results, base.results, strict=True) if b.rps])

    bolt, ceiling = by["bolt"], by["aiohttp"]
    rows = [
        [
            t.label,
            fmt(median([r.rps for r in t.results]), 0),
            fmt(median([r.p50_ms for r in t.results]), 2),
            fmt(median([r.p99_ms for r in t.results]), 2),
            f"{ratio(t, bolt):.2f}",
            f"{ratio(t, ceiling):.2f}",
            fmt(median(t.cpu_us), 0),
            sum(r.errors for r in t.results),
        ]
        for t in targets
    ]
    gen = targets[0].results[0].generator
    print(
        render_table(
            f"Slack ingest on one server core ({gen}, {CONNECTIONS} connections, ~{body_bytes} B signed bodies, "
            f"median of {rounds} round(s))",
            [
                "server",
                "req/s",
                "p50 ms",
                "p99 ms",
                "req/s vs slack-bolt",
                "req/s vs raw aiohttp",
                "CPU µs/req",
                "errors",
            ],
            rows,
        )
    )
    value = ratio(by["slack"], bolt)
    cpu = median([b / a for a, b in zip(by["slack"].cpu_us, bolt.cpu_us, strict=True) if a])
    stored = all(a >= r.requests - r.errors for a, r in zip(by["slack"].accepted, by["slack"].results, strict=True))
    return [
        Row(
            "slack_ingest",
            "Slack webhook req/s vs slack-bolt",
            f"{value:.2f}×",
            f"≥ {TARGET_RATIO}×",
            value >= TARGET_RATIO,
        ),
        Row("slack_ingest", "Slack webhook CPU-cost ratio vs slack-bolt", f"{cpu:.2f}×", "(report)", None),
        Row("slack_ingest", "every acknowledged event stored", "yes" if stored else "NO", "yes", stored),
        Row(
            "slack_ingest",
            "Slack webhook req/s vs Telegram's (same process)",
            f"{ratio(by['slack'], by['telegram']):.2f}×",
            "(report)",
            None,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.slack_ingest`` (and the ``serve-bolt`` / ``serve-fake`` helpers it starts)."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("serve-bolt", "serve-fake"):
        logging.basicConfig(level=logging.WARNING)
        p = argparse.ArgumentParser()
        p.add_argument("server")
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--api", default="")
        ns = p.parse_args(args)
        if ns.server == "serve-bolt":
            serve_bolt(ns.port, ns.api)
        else:
            serve_fake(ns.port)
        return 0
    rows = asyncio.run(run(args))
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
