"""Ingest: req/s and p50/p99 of ``switchboard web`` against a raw aiohttp hello-world and python-telegram-bot.

Four servers (five with uvloop installed), each alone on one core (``taskset``-style affinity), loaded in turn
by ``wrk -t1 -c32`` on the other core, where the embedded Redis-compatible server runs too (performance.md's method):

(a) ``switchboard web``, ``POST /webhooks/telegram`` — signed updates of ~1.5 KB, distinct ``update_id``s over
    1,000 chats, through the full durable ingest (verify → parse → one Lua script → 200);
(b) ``switchboard web``, ``POST /api/chat/messages`` — ~1.5 KB bodies, distinct ``client_id``s, 64 sessions;
(c) a raw aiohttp handler that reads the body and answers 200 (the ceiling; ratios are taken against it on
    asyncio's default loop, and when uvloop is installed — ``switchboard web`` then runs on it — the same handler
    on uvloop is measured too, as a row of its own);
(d) python-telegram-bot's own ``run_webhook`` server with a no-op handler (what a user would otherwise run;
    it needs tornado, ``pip install 'python-telegram-bot[webhooks]'``, and is skipped with a warning without).

The gateway runs with every abuse limit on (``SWITCHBOARD_LIMITS__*``: each message is metered per session and per
sender and its inbox depth checked, inside the ingest script) but set far above what the load sends, so the
figures include the cost of checking the limits and no request is refused; ``--limits off`` sets them to 0, and
``--limits both`` runs a second gateway with them off in the same rounds, for a side-by-side comparison.

Every round measures all four one after another (each after a warm-up, on an emptied Redis); ratios are taken
within a round and the table shows medians over rounds. ``accepted`` is read back from Redis as a check that
what was acknowledged is really stored.

    python -m bench.ingest                 # 3 rounds of 10 s per server
    python -m bench.ingest --quick         # smoke run
    python -m bench.ingest --load python   # without wrk (a weaker generator: figures are floors)
    python -m bench.ingest --limits both   # also a gateway with the abuse limits off, in the same rounds
    python -m bench.ingest before=/path/to/other/tree   # that tree's gateway too, in the same rounds (A/B)
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench._harness import (
    PYTHON,
    SUMMARY_HEADERS,
    Proc,
    Row,
    bench_env,
    cores,
    flushall,
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
from bench._load import WRK_INSTALL_HINT, LoadResult, PostLoad, load, telegram_load, webchat_load, wrk_path
from switchboard.queue.keys import ShardKeys

TARGET_RATIO = 0.35
PTB_HINT = (
    "tornado is not installed, so python-telegram-bot's webhook server cannot run and its baseline is skipped: "
    "pip install 'python-telegram-bot[webhooks]'"
)
CONNECTIONS = 32
WEB_SESSIONS = 64
_LIMIT_NAMES = (
    "SESSIONS_PER_ADDRESS_PER_HOUR",
    "MESSAGES_PER_SESSION_PER_MINUTE",
    "MESSAGES_PER_SENDER_PER_MINUTE",
    "INBOX_DEPTH",
)
LIMITS = {
    "on": {f"SWITCHBOARD_LIMITS__{name}": "1000000000" for name in _LIMIT_NAMES},
    "off": {f"SWITCHBOARD_LIMITS__{name}": "0" for name in _LIMIT_NAMES},
}
"""``on``: checked on every request, never reached by the load; ``off``: not checked at all."""


@dataclass
class Target:
    """One server under load."""

    key: str
    label: str
    proc: Proc
    url: str
    switchboard: bool
    results: list[LoadResult] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    """Server CPU time per answered request (user + system), µs: robust to a noisy machine."""


def generator_label(generator: str) -> str:
    """How the load was generated, for the tables."""
    if generator == "wrk":
        return f"wrk -t1 -c{CONNECTIONS}"
    return f"Python aiohttp client, {CONNECTIONS} connections: figures are floors"


def create_web_sessions(base_url: str, count: int) -> list[str]:
    """Open ``count`` web chat sessions and return their bearer tokens."""
    tokens = []
    for _ in range(count):
        req = urllib.request.Request(f"{base_url}/api/chat/sessions", data=b"{}", method="POST")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=5) as resp:
            tokens.append(json.loads(resp.read())["token"])
    return tokens


def accepted_count(redis_url: str) -> int:
    """Messages the queue has accepted since the last flush (its own counter)."""
    client = redis.Redis.from_url(redis_url)
    try:
        with client.pipeline(transaction=False) as pipe:  # the counter is kept per shard
            for shard in ShardKeys.every():
                pipe.hget(shard.stats, "accepted")
            return sum(int(value or 0) for value in pipe.execute())
    finally:
        client.close()


def spec_for(target: Target, start: int) -> PostLoad:
    """The requests a target receives (a fresh counter range per run)."""
    if target.key.startswith("webchat"):
        return webchat_load(create_web_sessions(target.url, WEB_SESSIONS), start=start)
    return telegram_load(start=start)


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "ingest")
    p.add_argument("--seconds", type=float, default=None, help="load per measurement (default 10, quick 1)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up load before each measurement (default 2)")
    p.add_argument("--load", choices=["auto", "wrk", "python"], default="auto", help="load generator")
    p.add_argument(
        "--limits",
        choices=["on", "off", "both"],
        default="on",
        help="abuse limits checked (set out of reach), off, or both (a second gateway with them off)",
    )
    p.add_argument("trees", nargs="*", metavar="NAME=PATH", help="more source trees' web chat and Telegram rows (A/B)")
    ns = p.parse_args(argv)
    trees: dict[str, Path] = {}
    for tree in ns.trees:
        name, sep, path = tree.partition("=")
        if not sep or not name or name in trees or not (Path(path) / "switchboard").is_dir():
            p.error(f"{tree!r}: expected NAME=PATH, a new NAME and a source tree at PATH")
        trees[name] = Path(path).resolve()
    rounds = rounds_of(ns)
    seconds = ns.seconds or (1.0 if ns.quick else 10.0)
    warmup = ns.warmup if ns.warmup is not None else (0.0 if ns.quick else 2.0)
    generator = ns.load
    if generator == "auto":
        generator = "wrk" if wrk_path() else "python"
        if generator == "python":
            print(f"WARNING: {WRK_INSTALL_HINT}", file=sys.stderr)
    elif generator == "wrk" and not wrk_path():
        raise SystemExit(f"--load wrk: {WRK_INSTALL_HINT.split(';')[0]}")
    server_cpus, load_cpus = cores()
    if server_cpus is None:
        print("WARNING: one CPU only: server, Redis and load share it; ratios still mean something", file=sys.stderr)
    pin(os.getpid(), load_cpus)  # this process, Redis, the fake and the load generator stay off the server's core
    print(
        f"ingest: {rounds} round(s) × {seconds:g} s per server, {generator_label(generator)}; "
        f"server on CPU {sorted(server_cpus or [])}, load + Redis on CPU {sorted(load_cpus or [])}; "
        f"abuse limits {ns.limits}; load average {os.getloadavg()[0]:.2f}"
    )

    with workdir("sb-bench-ingest-") as tmp:
        server = start_redis(tmp, load_cpus)
        procs: list[Proc] = []
        try:
            fake_port = free_port()
            fake = Proc(
                "fake-telegram",
                [PYTHON, "-m", "bench._servers", "fake-telegram", "--port", str(fake_port)],
                cpus=load_cpus,
                log_dir=tmp,
            )
            procs.append(fake)
            fake_url = f"http://127.0.0.1:{fake_port}"
            fake.wait_http(f"{fake_url}/_fake/calls")
            targets = start_targets(tmp, server.url, fake_url, server_cpus, procs, ns.limits, trees)
            for number in range(1, rounds + 1):
                spec = await measure_round(
                    number, targets, spec_for, server.url, warmup=warmup, seconds=seconds, cpus=load_cpus,
                    scratch=tmp, generator=generator,
                )  # fmt: skip
        finally:
            for proc in reversed(procs):
                proc.stop()
            server.stop()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return verdicts(report(targets, rounds, spec.body_bytes), ns.quick)


async def measure_round(
    number: int,
    targets: Sequence[Any],
    spec_for: Callable[[Any, int], PostLoad],
    redis_url: str,
    *,
    warmup: float,
    seconds: float,
    cpus: set[int] | None,
    scratch: Path,
    generator: str,
) -> PostLoad:
    """Round ``number``: warm each target up, then load it alone on an emptied Redis and record its figures.

    A target has ``key``, ``url``, ``proc``, ``switchboard`` and the lists ``results``, ``cpu_us``, ``accepted``
    (:class:`Target` here, the Slack bench's own). Returns the last spec loaded (its body size goes in the report).
    """
    base = number * 10_000_000
    spec = spec_for(targets[0], base)
    for target in targets:
        if warmup > 0:
            await load(
                target.url, spec_for(target, base), connections=CONNECTIONS, seconds=warmup, cpus=cpus,
                scratch=scratch, generator=generator,
            )  # fmt: skip
        flushall(redis_url)
        spec = spec_for(target, base + 5_000_000)
        cpu = target.proc.cpu_s()
        result = await load(
            target.url, spec, connections=CONNECTIONS, seconds=seconds, cpus=cpus, scratch=scratch,
            generator=generator,
        )  # fmt: skip
        target.cpu_us.append((target.proc.cpu_s() - cpu) / max(result.requests, 1) * 1e6)
        target.results.append(result)
        if target.switchboard:
            target.accepted.append(accepted_count(redis_url))
    print(f"  round {number}: " + ", ".join(f"{t.key} {t.results[-1].rps:,.0f} req/s" for t in targets), flush=True)
    return spec


def start_targets(
    tmp: Path,
    redis_url: str,
    fake_url: str,
    cpus: set[int] | None,
    procs: list[Proc],
    limits: str,
    trees: dict[str, Path] | None = None,
) -> list[Target]:
    """Start the four servers (and each tree's gateway), each pinned to the server core, and wait until they answer."""
    targets: list[Target] = []

    def add(
        key: str,
        label: str,
        args: list[str],
        health: str,
        port: int,
        *,
        env: dict[str, str] | None = None,
        switchboard: bool = False,
        ok: int | None = 200,
        cwd: Path | None = None,
    ) -> None:
        proc = Proc(key, args, env=env, cpus=cpus, log_dir=tmp, cwd=cwd)
        procs.append(proc)
        proc.wait_http(f"http://127.0.0.1:{port}{health}", ok=ok)
        targets.append(Target(key, label, proc, f"http://127.0.0.1:{port}", switchboard))

    aio_port = free_port()
    add(
        "aiohttp",
        "raw aiohttp hello-world (baseline)",
        [PYTHON, "-m", "bench._servers", "aiohttp", "--port", str(aio_port)],
        "/healthz",
        aio_port,
    )
    if importlib.util.find_spec("uvloop") is not None:
        uv_port = free_port()
        add(
            "aiohttp_uvloop",
            "raw aiohttp hello-world on uvloop (baseline)",
            [PYTHON, "-m", "bench._servers", "aiohttp-uvloop", "--port", str(uv_port)],
            "/healthz",
            uv_port,
        )
    web_port = free_port()
    env = bench_env(
        redis_url, tmp / "data", port=web_port, telegram_url=fake_url, **LIMITS["off" if limits == "off" else "on"]
    )
    web_args = [PYTHON, "-m", "switchboard", "web"]
    add("telegram", "switchboard web: Telegram webhook", web_args, "/healthz", web_port, env=env, switchboard=True)
    web = targets[-1]
    targets.append(Target("webchat", "switchboard web: POST /api/chat/messages", web.proc, web.url, True))
    if limits == "both":
        off_port = free_port()
        off_env = bench_env(redis_url, tmp / "data-off", port=off_port, telegram_url=fake_url, **LIMITS["off"])
        add(
            "telegram_nolimits",
            "switchboard web, abuse limits off: Telegram webhook",
            web_args,
            "/healthz",
            off_port,
            env=off_env,
            switchboard=True,
        )
        off = targets[-1]
        targets.append(
            Target(
                "webchat_nolimits",
                "switchboard web, abuse limits off: POST /api/chat/messages",
                off.proc,
                off.url,
                True,
            )
        )
    for name, root in (trees or {}).items():
        tree_port = free_port()
        tree_env = bench_env(
            redis_url,
            tmp / f"data-{name}",
            port=tree_port,
            telegram_url=fake_url,
            **LIMITS["off" if limits == "off" else "on"],
        )
        tree_env["PYTHONPATH"] = str(root)
        add(f"telegram@{name}", f"switchboard web of {root}: Telegram webhook", web_args, "/healthz", tree_port,
            env=tree_env, switchboard=True, cwd=root)  # fmt: skip
        tree = targets[-1]
        targets.append(
            Target(f"webchat@{name}", f"switchboard web of {root}: POST /api/chat/messages", tree.proc, tree.url, True)
        )
    if importlib.util.find_spec("tornado") is None:
        print(f"WARNING: {PTB_HINT}", file=sys.stderr)
        return targets
    ptb_port = free_port()
    add(
        "ptb",
        "python-telegram-bot run_webhook (baseline)",
        [PYTHON, "-m", "bench._servers", "ptb", "--port", str(ptb_port), "--api", fake_url],
        "/webhooks/telegram",
        ptb_port,
        ok=None,
    )
    return targets


def report(targets: list[Target], rounds: int, body_bytes: int) -> list[Row]:
    """Print the per-round and summary tables; return the summary rows."""
    by = {t.key: t for t in targets}
    aio, ptb = by["aiohttp"], by.get("ptb")
    per_round = []
    for i in range(rounds):
        for t in targets:
            r = t.results[i]
            accepted = str(t.accepted[i]) if t.switchboard else "—"
            per_round.append(
                [
                    i + 1,
                    t.key,
                    fmt(r.rps, 0),
                    fmt(r.p50_ms, 2),
                    fmt(r.p99_ms, 2),
                    fmt(t.cpu_us[i], 0),
                    r.requests,
                    accepted,
                    r.errors,
                ]
            )
    print()
    print(
        render_table(
            "Ingest, every round",
            [
                "round",
                "server",
                "req/s",
                "p50 ms",
                "p99 ms",
                "server CPU µs/req",
                "answered",
                "accepted in Redis",
                "errors",
            ],
            per_round,
        )
    )

    def ratio(t: Target, base: Target) -> float:
        return median([a.rps / b.rps for a, b in zip(t.results, base.results, strict=True) if b.rps])

    def cpu_ratio(t: Target, base: Target) -> float:
        return median([b / a for a, b in zip(t.cpu_us, base.cpu_us, strict=True) if a])

    rows = []
    for t in targets:
        rows.append(
            [
                t.label,
                fmt(median([r.rps for r in t.results]), 0),
                fmt(median([r.p50_ms for r in t.results]), 2),
                fmt(median([r.p99_ms for r in t.results]), 2),
                f"{ratio(t, aio):.2f}",
                f"{ratio(t, ptb):.2f}" if ptb else "— (not run)",
                fmt(median(t.cpu_us), 0),
                f"{cpu_ratio(t, aio):.2f}",
                sum(r.errors for r in t.results),
            ]
        )
    gen = targets[0].results[0].generator
    print(
        render_table(
            f"Ingest on one server core ({generator_label(gen)}, ~{body_bytes} B bodies, median of {rounds} round(s))",
            [
                "server",
                "req/s",
                "p50 ms",
                "p99 ms",
                "req/s vs raw aiohttp",
                "req/s vs python-telegram-bot",
                "server CPU µs/req",
                "CPU-cost ratio vs raw aiohttp",
                "errors",
            ],
            rows,
        )
    )
    print(
        "CPU-cost ratio = raw aiohttp's CPU per request / this server's: what the req/s ratio would be if each "
        "server had its core to itself (the machine is shared; the req/s ratio is the one the target names).\n"
    )
    summary = []
    for key, name in (("telegram", "Telegram webhook"), ("webchat", "web chat messages")):
        value = ratio(by[key], aio)
        summary.append(
            Row("ingest", f"{name} req/s vs raw aiohttp", f"{value:.2f}×", f"≥ {TARGET_RATIO}×", value >= TARGET_RATIO)
        )
    for key, name in (("telegram", "Telegram webhook"), ("webchat", "web chat messages")):
        value = cpu_ratio(by[key], aio)
        summary.append(
            Row(
                "ingest",
                f"{name} CPU-cost ratio vs raw aiohttp",
                f"{value:.2f}×",
                f"(≥ {TARGET_RATIO}× if CPU-bound)",
                None,
            )
        )
    for key, name in (("telegram", "Telegram webhook"), ("webchat", "web chat messages")):
        if f"{key}_nolimits" in by:
            value = ratio(by[key], by[f"{key}_nolimits"])
            summary.append(Row("ingest", f"{name} req/s, limits on vs off", f"{value:.2f}×", "(report)", None))
            value = cpu_ratio(by[key], by[f"{key}_nolimits"])
            summary.append(Row("ingest", f"{name} CPU-cost, limits on vs off", f"{value:.2f}×", "(report)", None))
    for t in targets:
        if "@" in t.key:
            value = ratio(t, aio)
            summary.append(Row("ingest", f"{t.key} req/s vs raw aiohttp", f"{value:.2f}×", "(A/B)", None))
            value = cpu_ratio(t, aio)
            summary.append(Row("ingest", f"{t.key} CPU-cost ratio vs raw aiohttp", f"{value:.2f}×", "(A/B)", None))
    uv = by.get("aiohttp_uvloop")
    if uv is not None:
        for key, name in (("telegram", "Telegram webhook"), ("webchat", "web chat messages")):
            value = ratio(by[key], uv)
            summary.append(Row("ingest", f"{name} req/s vs raw aiohttp on uvloop", f"{value:.2f}×", "(report)", None))
    tg_ptb = f"{ratio(by['telegram'], ptb):.2f}×" if ptb else "not run (no tornado)"
    summary.append(Row("ingest", "Telegram webhook req/s vs python-telegram-bot", tg_ptb, "≈ 3× (report)", None))
    summary.append(
        Row(
            "ingest",
            "Telegram webhook p50 / p99",
            f"{fmt(median([r.p50_ms for r in by['telegram'].results]), 2)}"
            f" / {fmt(median([r.p99_ms for r in by['telegram'].results]), 2)} ms",
            "(report)",
            None,
        )
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.ingest``."""
    rows = asyncio.run(run(argv))
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
