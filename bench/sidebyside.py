"""Side by side: ``switchboard web``'s webhooks against the platform SDK's own server, loaded at the same moment.

``bench.ingest`` and ``bench.slack_ingest`` load their servers one after another, so on a shared machine the load
of other processes changes between them and their ratios drift by ±25 % from round to round. Here every server of
a channel runs at once, all pinned to the server core, each loaded by its own ``wrk -t1 -c32`` on the other core
(where the embedded Redis-compatible server and the fake platform API run too); the figure is each server's own
CPU time per answered request (user + system), and the ratio baseline CPU ÷ ours is taken within a round.

- Telegram: ``switchboard web``'s ``POST /webhooks/telegram`` (full durable ingest, abuse limits on but never
  reached) against python-telegram-bot's ``Application.run_webhook`` with a no-op handler (``bench._servers ptb``);
  target ≥ 3×.
- Slack: ``POST /webhooks/slack`` with signed ``message.im`` events (``bench._slack_load``) against slack-bolt's
  ``AsyncApp`` on its aiohttp adapter with a no-op listener (``bench.slack_ingest serve-bolt``); target ≥ 1.5×.
- WhatsApp (``--channel whatsapp``, not in ``both``): ``POST /webhooks/whatsapp`` with ``bench.whatsapp_ingest``'s
  signed multi-message deliveries against a raw aiohttp handler that reads the body and answers 200 (the ceiling
  issue #9's ≥ 0.35× is set against); the same figures as ``bench.whatsapp_ingest``, but loaded at the same moment.

    python -m bench.sidebyside                               # both channels, 3 rounds of 8 s
    python -m bench.sidebyside --channel slack --rounds 5
    python -m bench.sidebyside --channel whatsapp base=/tmp/base   # WhatsApp vs raw aiohttp, and an A/B
    python -m bench.sidebyside --quick                       # smoke run (figures meaningless)
    python -m bench.sidebyside before=../switchboard-old     # also an older source tree (A/B)

A ``name=PATH`` argument adds ``switchboard web`` run from the source tree at ``PATH`` (cwd and PYTHONPATH) as one
more server loaded at the same moment; ``ours`` is always the tree this module lives in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench._harness import (
    PYTHON,
    REPO,
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
from bench._load import WRK_INSTALL_HINT, PostLoad, parse_wrk, telegram_load, wrk_path
from bench._slack_load import SIGNING_SECRET, self_check, slack_load
from bench.ingest import LIMITS
from bench.slack_ingest import BOT_TOKEN as SLACK_BOT_TOKEN
from bench.whatsapp_ingest import APP_SECRET as WHATSAPP_APP_SECRET
from bench.whatsapp_ingest import PHONE_NUMBER_ID, whatsapp_load

__all__ = ["CHANNELS", "Channel", "main", "run"]

CONNECTIONS = 32


@dataclass(frozen=True, slots=True)
class Channel:
    """One platform: its webhook path, its SDK baseline and the target ratio (baseline CPU ÷ ours)."""

    name: str
    title: str
    path: str
    baseline: str
    baseline_path: str
    target: float
    load: Callable[[str, int], PostLoad]


CHANNELS = {
    "telegram": Channel(
        "telegram",
        "Telegram webhook",
        "/webhooks/telegram",
        "python-telegram-bot run_webhook, no-op handler",
        "/webhooks/telegram",
        3.0,
        lambda path, start: telegram_load(path=path, start=start),
    ),
    "slack": Channel(
        "slack",
        "Slack Events API",
        "/webhooks/slack",
        "slack-bolt AsyncApp + aiohttp adapter, no-op listener",
        "/slack/events",
        1.5,
        lambda path, start: slack_load(path=path, start=start),
    ),
    "whatsapp": Channel(
        "whatsapp",
        "WhatsApp webhook",
        "/webhooks/whatsapp",
        "raw aiohttp handler reading the body (the ceiling)",
        "/webhooks/whatsapp",
        0.35,
        lambda path, start: whatsapp_load(path=path, start=start),
    ),
}


@dataclass
class Server:
    """One server under load, and its figures per measured round."""

    name: str
    proc: Proc
    url: str
    path: str
    cpu_us: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)


def _start_servers(
    channel: Channel,
    trees: dict[str, Path],
    tmp: Path,
    redis_url: str,
    cpus: tuple[set[int] | None, set[int] | None],
    procs: list[Proc],
) -> list[Server]:
    """The fake platform API on the load core, then every server under test on the server core; baseline first."""
    server_cpus, load_cpus = cpus
    fake_port = free_port()
    if channel.name in ("telegram", "whatsapp"):  # WhatsApp's ingest calls no platform API
        fake_args = [PYTHON, "-m", "bench._servers", "fake-telegram", "--port", str(fake_port)]
    else:
        fake_args = [PYTHON, "-m", "bench.slack_ingest", "serve-fake", "--port", str(fake_port)]
    fake = Proc(f"fake-{channel.name}", fake_args, cpus=load_cpus, log_dir=tmp)
    procs.append(fake)
    fake_url = f"http://127.0.0.1:{fake_port}"
    fake.wait_http(f"{fake_url}/_fake/calls")
    servers: list[Server] = []
    port = free_port()
    if channel.name == "whatsapp":
        args = [PYTHON, "-m", "bench._servers", "aiohttp", "--port", str(port)]
    elif channel.name == "telegram":
        args = [PYTHON, "-m", "bench._servers", "ptb", "--port", str(port), "--api", fake_url]
    else:
        args = [PYTHON, "-m", "bench.slack_ingest", "serve-bolt", "--port", str(port), "--api", f"{fake_url}/api/"]
    proc = Proc("baseline", args, cpus=server_cpus, log_dir=tmp)
    procs.append(proc)
    proc.wait_http(f"http://127.0.0.1:{port}{channel.baseline_path}", ok=None)
    servers.append(Server("baseline", proc, f"http://127.0.0.1:{port}", channel.baseline_path))
    for name, root in trees.items():
        port = free_port()
        extra = dict(LIMITS["on"])
        if channel.name == "slack":
            extra |= {
                "SWITCHBOARD_SLACK__BOT_TOKEN": SLACK_BOT_TOKEN,
                "SWITCHBOARD_SLACK__SIGNING_SECRET": SIGNING_SECRET,
                "SWITCHBOARD_SLACK__API_BASE_URL": f"{fake_url}/api/",
            }
        if channel.name == "whatsapp":
            extra |= {
                "SWITCHBOARD_WHATSAPP__ACCESS_TOKEN": "EAAbench",
                "SWITCHBOARD_WHATSAPP__APP_SECRET": WHATSAPP_APP_SECRET,
                "SWITCHBOARD_WHATSAPP__VERIFY_TOKEN": "bench-verify",
                "SWITCHBOARD_WHATSAPP__PHONE_NUMBER_ID": PHONE_NUMBER_ID,
                "SWITCHBOARD_WHATSAPP__GRAPH_BASE_URL": f"{fake_url}/v23.0",
            }
        telegram_url = fake_url if channel.name == "telegram" else "http://127.0.0.1:9"  # Slack: getMe fails fast
        env = bench_env(redis_url, tmp / f"data-{channel.name}-{name}", port=port, telegram_url=telegram_url, **extra)
        env["PYTHONPATH"] = str(root)
        proc = Proc(
            f"{channel.name}-{name}",
            [PYTHON, "-m", "switchboard", "web"],
            env=env,
            cpus=server_cpus,
            cwd=root,
            log_dir=tmp,
        )
        procs.append(proc)
        proc.wait_http(f"http://127.0.0.1:{port}/healthz")
        servers.append(Server(name, proc, f"http://127.0.0.1:{port}", channel.path))
    return servers


def _load_round(
    servers: list[Server],
    load_cpus: set[int] | None,
    seconds: int,
    start: int,
    tmp: Path,
    channel: Channel,
    *,
    record: bool,
) -> None:
    """Load every server at once, each with its own wrk; record CPU µs per answered request and req/s."""
    binary = wrk_path()
    assert binary is not None
    taskset = ["taskset", "-c", ",".join(str(c) for c in sorted(load_cpus))] if load_cpus else []
    running: dict[str, subprocess.Popen[str]] = {}
    cpu_before: dict[str, float] = {}
    for i, server in enumerate(servers):
        spec = channel.load(server.path, start + i * 10_000_000)
        script = tmp / f"{channel.name}-{server.name}-{start}.lua"
        script.write_text(spec.lua())
        cpu_before[server.name] = server.proc.cpu_s()
        args = [*taskset, binary, "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency", "-s", str(script)]
        running[server.name] = subprocess.Popen([*args, server.url + server.path], stdout=subprocess.PIPE, text=True)
    outputs = {name: wrk.communicate()[0] for name, wrk in running.items()}
    for server in servers:
        result = parse_wrk(outputs[server.name])
        if result.errors:
            raise SystemExit(f"{server.name}: {result.errors} failed requests:\n{server.proc.tail()}")
        if record:
            server.cpu_us.append((server.proc.cpu_s() - cpu_before[server.name]) / max(1, result.requests) * 1e6)
            server.rps.append(result.rps)


def measure(channel: Channel, trees: dict[str, Path], rounds: int, seconds: int, warmup: int) -> list[Row]:
    """Start one channel's servers, load them side by side for ``rounds`` rounds, print the table, return rows."""
    server_cpus, load_cpus = cores()
    with workdir(f"sb-bench-sidebyside-{channel.name}-") as tmp:
        redis = start_redis(tmp, load_cpus)
        procs: list[Proc] = []
        try:
            servers = _start_servers(channel, trees, tmp, redis.url, (server_cpus, load_cpus), procs)
            start = 1
            if warmup:
                _load_round(servers, load_cpus, warmup, start, tmp, channel, record=False)
                flushall(redis.url)
            for r in range(1, rounds + 1):
                start += 100_000_000
                _load_round(servers, load_cpus, seconds, start, tmp, channel, record=True)
                flushall(redis.url)
                print(
                    f"{channel.name} round {r}: "
                    + "  ".join(f"{s.name} {s.cpu_us[-1]:.0f} µs/req {s.rps[-1]:.0f} req/s" for s in servers),
                    flush=True,
                )
        finally:
            for proc in reversed(procs):
                proc.stop()
            redis.stop()
    return _report(channel, servers, rounds, seconds)


def _report(channel: Channel, servers: list[Server], rounds: int, seconds: int) -> list[Row]:
    baseline, ours = servers[0], servers[1:]
    rows: list[list[object]] = [
        [f"{channel.baseline} (baseline)", fmt(median(baseline.cpu_us), 0), fmt(median(baseline.rps), 0), "—", "—", "—"]
    ]
    summary: list[Row] = []
    for server in ours:
        ratios = [b / s for b, s in zip(baseline.cpu_us, server.cpu_us, strict=True)]
        rps_ratio = median([s / b for b, s in zip(baseline.rps, server.rps, strict=True)])
        ratio = median(ratios)
        rows.append(
            [
                f"switchboard web ({server.name}): {channel.title}",
                fmt(median(server.cpu_us), 0),
                fmt(median(server.rps), 0),
                ", ".join(f"{x:.2f}" for x in ratios),
                f"**{ratio:.2f}×** (req/s {rps_ratio:.2f}×)",
                f"≥ {channel.target:g}×",
            ]
        )
        metric = f"{channel.title} ({server.name}): baseline CPU ÷ ours, side by side"
        summary.append(Row("sidebyside", metric, f"{ratio:.2f}×", f"≥ {channel.target:g}×", ratio >= channel.target))
    headers = (
        "server",
        "CPU µs/req",
        "req/s",
        "baseline CPU ÷ ours, per round",
        "median (req/s: ours ÷ baseline)",
        "target",
    )
    title = f"{channel.title} side by side, medians of {rounds} round(s) × {seconds} s, wrk -t1 -c{CONNECTIONS}"
    print("\n" + render_table(title, headers, rows))
    return summary


def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "side by side")
    p.add_argument("--channel", choices=["telegram", "slack", "whatsapp", "both"], default="both")
    p.add_argument("--seconds", type=int, default=None, help="load per round (default 8, quick 1)")
    p.add_argument("trees", nargs="*", metavar="NAME=PATH", help="more source trees to load alongside (A/B)")
    ns = p.parse_args(argv)
    if wrk_path() is None:
        p.error(WRK_INSTALL_HINT.split(";")[0])
    trees: dict[str, Path] = {"ours": REPO}
    for spec in ns.trees:
        name, sep, path = spec.partition("=")
        if not sep or not name or name in trees or not (Path(path) / "switchboard").is_dir():
            p.error(f"{spec!r}: expected NAME=PATH, a new NAME and a source tree at PATH")
        trees[name] = Path(path).resolve()
    rounds = rounds_of(ns)
    seconds = max(1, ns.seconds or (1 if ns.quick else 8))
    warmup = 1 if ns.quick else 3
    self_check()
    server_cpus, load_cpus = cores()
    pin(os.getpid(), load_cpus)
    print(
        f"side by side: {rounds} round(s) × {seconds} s after {warmup} s warm-up, every server at once on CPU "
        f"{sorted(server_cpus or [])}, wrk + Redis + fake API on CPU {sorted(load_cpus or [])}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    chosen = ["telegram", "slack"] if ns.channel == "both" else [ns.channel]
    rows: list[Row] = []
    for name in chosen:
        rows += measure(CHANNELS[name], trees, rounds, seconds, warmup)
    return verdicts(rows, ns.quick)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.sidebyside``."""
    rows = run(sys.argv[1:] if argv is None else argv)
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
