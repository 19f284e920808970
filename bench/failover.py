"""Failover: the cost of ``SWITCHBOARD_QUEUE__ACK_REPLICAS`` on ingest, and the loss window without it.

A primary, one replica and three Sentinels on this machine (the embedded server's binary, as the failover tests run
them), reached through a ``redis+sentinel://`` URL.

1. **Cost**: ``switchboard web`` with ``ACK_REPLICAS=0`` then ``1`` (``ACK_TIMEOUT_MS=500``), in the same rounds,
   each loaded for ``--seconds`` by ``--connections`` clients posting signed Telegram updates (distinct update ids
   over 1,000 chats); throughput and latency p50/p95 of the 2xx answers, medians over rounds.
2. **Loss window**: the failover test's run (:func:`tests.failover.test_failover.run_failover`: steady signed
   Telegram and web chat load, SIGKILL of the primary, promotion, a real worker) ``--runs`` times per case; per case
   the acknowledged messages (both kinds) never answered (lost) and answered twice (duplicated). Cases: no wait with
   the replica caught up (a quiet machine), no wait with the replica 0.5 s behind (SIGSTOPped and its link closed
   before the kill), and ``ACK_REPLICAS=1`` with it 0.5 s behind; the lagging cases also with 0.3 s turns, so that
   acknowledged messages are still waiting when the primary dies.

    python -m bench.failover                # 3 rounds of 5 s per mode, 3 failover runs per case
    python -m bench.failover --quick        # smoke run
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from bench._harness import (
    PYTHON,
    Proc,
    Row,
    bench_env,
    fmt,
    free_port,
    median,
    parser,
    percentile,
    render_table,
    rounds_of,
    workdir,
)
from bench._load import telegram_load
from switchboard.channels.telegram.fake.platform import FakeTelegram
from tests.chaos.harness import BOT_TOKEN, WorkerPool
from tests.conftest import MINIMAL_CONFIG
from tests.failover.servers import ReplicatedRedis
from tests.failover.test_failover import run_failover

MODES = (0, 1)
ACK = {"QUEUE__ACK_REPLICAS": "1", "QUEUE__ACK_TIMEOUT_MS": "300"}
SLOW = {"OFFLINE__DELAY_MS": "300"}
"""Turns of 0.3 s: a backlog is waiting when the primary dies (with 30 ms turns nearly every message acknowledged is
answered at once, and what the promoted replica lacks shows as replies sent again, not as messages lost)."""


async def _load(url: str, seconds: float, connections: int, start: int) -> tuple[float, float, float, int]:
    """Requests/s, p50 and p95 (ms) of the 2xx answers, and the count of other answers."""
    spec = telegram_load(start=start)
    latencies: list[float] = []
    errors = 0
    counter = 0
    deadline = time.perf_counter() + seconds

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal counter, errors
        while time.perf_counter() < deadline:
            body, headers = spec.request(counter)
            counter += 1
            sent = time.perf_counter()
            try:
                async with http.post(url + spec.path, data=body, headers=headers) as resp:
                    await resp.read()
                    ok = resp.status < 300
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies.append((time.perf_counter() - sent) * 1000)
            else:
                errors += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as http:
        began = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(connections)))
        took = time.perf_counter() - began
    return len(latencies) / took, percentile(latencies, 50), percentile(latencies, 95), errors


async def cost(root: Path, rounds: int, seconds: float, connections: int) -> dict[int, list[tuple[float, ...]]]:
    """Per mode, one ``(rps, p50, p95, errors)`` per round."""
    results: dict[int, list[tuple[float, ...]]] = {m: [] for m in MODES}
    with ReplicatedRedis(root / "servers") as servers:
        for r in range(rounds):
            for mode in MODES:
                port = free_port()
                env = bench_env(
                    servers.url,
                    root / f"data-{r}-{mode}",
                    port=port,
                    telegram_url="http://127.0.0.1:9",
                    SWITCHBOARD_QUEUE__ACK_REPLICAS=str(mode),
                    SWITCHBOARD_QUEUE__ACK_TIMEOUT_MS="500",
                )
                web = Proc(f"web-{r}-{mode}", [PYTHON, "-m", "switchboard", "web"], env=env, log_dir=root)
                try:
                    url = f"http://127.0.0.1:{port}"
                    web.wait_http(f"{url}/healthz")
                    await _load(url, 1.0, connections, start=10_000_000 * (2 * r + mode + 1))  # warm-up
                    results[mode].append(
                        await _load(url, seconds, connections, start=10_000_000 * (2 * r + mode + 1) + 5_000_000)
                    )
                finally:
                    web.stop()
                with servers.primary().client() as client:
                    client.flushall()
    return results


async def loss(root: Path, runs: int) -> dict[str, list[tuple[int, int, int]]]:
    """Per case, ``(acknowledged, lost, duplicated)`` per run."""
    cases: dict[str, tuple[float, dict[str, str]]] = {
        "ACK_REPLICAS=0, replica caught up": (0.0, {}),
        "ACK_REPLICAS=0, replica 0.5 s behind": (0.5, {}),
        "ACK_REPLICAS=0, replica 0.5 s behind, 0.3 s turns": (0.5, SLOW),
        "ACK_REPLICAS=1, replica 0.5 s behind": (0.5, ACK),
        "ACK_REPLICAS=1, replica 0.5 s behind, 0.3 s turns": (0.5, ACK | SLOW),
    }
    logging.getLogger("switchboard").setLevel(logging.ERROR)  # the web tier runs in this process: its 503 warnings
    out: dict[str, list[tuple[int, int, int]]] = {name: [] for name in cases}
    for name, (lagging_s, queue) in cases.items():
        for i in range(runs):
            run_root = root / f"loss-{len(out[name])}-{abs(hash(name))}"
            run_root.mkdir(parents=True)
            config = run_root / "switchboard.yaml"
            config.write_text(MINIMAL_CONFIG)
            base = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))}
            base |= {"SWITCHBOARD_DATA_DIR": str(run_root / "data"), "SWITCHBOARD_CONFIG": str(config)}
            fake = FakeTelegram(token=BOT_TOKEN)
            await fake.start()
            started: list[WorkerPool] = []

            def pools(
                env: dict[str, str], count: int, _dir: Path = run_root, _started: list[WorkerPool] = started
            ) -> WorkerPool:
                pool = WorkerPool(env, count, _dir / f"logs-{len(_started)}")
                _started.append(pool)
                pool.start()
                return pool

            try:
                outcome = await run_failover(run_root / "servers", base, fake, pools, lagging_s=lagging_s, **queue)
            finally:
                for pool in started:
                    await pool.close()
                await fake.stop()
            report, web = outcome.report, outcome.web
            dup_web = sum(n - 1 for n in web.duplicates.values())
            out[name].append(
                (report.acked + web.acked, len(report.lost) + len(web.lost), report.duplicate_replies + dup_web)
            )
            print(f"  {name}, run {i + 1}: Telegram acked {report.acked}, lost {len(report.lost)}, duplicated "
                  f"{report.duplicate_replies} (send window {report.counters.get('send_window_duplicates', 0)}); "
                  f"web chat acked {web.acked}, lost {len(web.lost)}, duplicated {dup_web}; "
                  f"failover {outcome.failover_s:.2f} s", file=sys.stderr)  # fmt: skip
    return out


async def run(argv: list[str]) -> list[Row]:
    p = parser(__doc__ or "")
    p.add_argument("--seconds", type=float, default=5.0, help="load per mode and round")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--runs", type=int, default=None, help="failover runs per case (default 3, quick 1)")
    ns = p.parse_args(argv)
    rounds = rounds_of(ns)
    seconds = 1.0 if ns.quick else ns.seconds
    runs = ns.runs or (1 if ns.quick else 3)
    with workdir("bench-failover-") as root:
        measured = await cost(root, rounds, seconds, ns.connections)
        rows = []
        for mode in MODES:
            r = measured[mode]
            col: Callable[[int], float] = lambda i, r=r: median([x[i] for x in r])  # noqa: E731
            rows.append(
                [f"ACK_REPLICAS={mode}", fmt(col(0), 0), fmt(col(1), 2), fmt(col(2), 2), int(sum(x[3] for x in r))]
            )
        print(render_table(
            f"Ingest through Sentinel, primary + 1 replica ({rounds} rounds × {seconds:g} s, {ns.connections} clients)",
            ["mode", "req/s", "p50 ms", "p95 ms", "non-2xx"], rows,
        ))  # fmt: skip
        losses = await loss(root, runs)
        loss_rows = [
            [name, sum(a for a, _, _ in v), " ".join(str(x) for _, x, _ in v), " ".join(str(d) for _, _, d in v)]
            for name, v in losses.items()
        ]
        print(render_table(
            f"Primary SIGKILLed under load, {runs} runs per case (lost / duplicated per run)",
            ["case", "acknowledged", "lost", "duplicated"], loss_rows,
        ))  # fmt: skip
    zero, one = (median([x[0] for x in measured[m]]) for m in MODES)
    return [Row("failover", "ingest req/s with ACK_REPLICAS=1 vs 0", f"{one / zero:.2f}×" if zero else "—", "—", None)]


def main() -> None:
    asyncio.run(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
