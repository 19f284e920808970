"""Streams: thousands of open web chat SSE streams on one ``switchboard web``, and what the rest of it still does.

One ``switchboard web`` process (one core) holds N open ``GET /api/chat/stream`` connections — many sessions, five
streams each (the default per-session cap; the per-address cap is lifted, since every stream comes from
127.0.0.1). With them open, the bench measures ``GET /healthz`` and ``POST /api/chat/messages`` latency (p50/p99,
one request at a time) and the web process's RSS and Redis connections. Side by side, in the same run and with the
same client, a **baseline**: a raw aiohttp server holding the same number of SSE connections, answering the same
two routes without doing anything (the floor for an aiohttp process holding that many streams; on uvloop, as
``switchboard web`` is).

    python -m bench.streams             # 5,000 streams, 3 rounds
    python -m bench.streams --quick     # 200 streams, 1 round (figures meaningless)
    python -m bench.streams --serve-baseline --port P   # the baseline server alone

Every client runs in this process on the other core, with its file limit raised to hold the sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import redis
from aiohttp import web

from bench._harness import (
    PYTHON,
    Proc,
    Row,
    bench_env,
    cores,
    fmt,
    free_port,
    median,
    parser,
    percentile,
    pinned,
    render_table,
    rounds_of,
    start_redis,
    verdicts,
    workdir,
)

STREAMS = 5_000
STREAMS_QUICK = 200
PER_SESSION = 5
REQUESTS = 300
REQUESTS_QUICK = 30
TARGET_P99_MS = 50.0
TARGET_RSS_MIB = 150.0
_CONNECT_AT_ONCE = 100
_OPEN_ATTEMPTS = 5
_GUARD_S = 120.0
_NO_LIMITS = {
    "SWITCHBOARD_LIMITS__STREAMS_PER_ADDRESS": "0",  # every stream of the bench comes from 127.0.0.1
    "SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR": "0",
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SESSION_PER_MINUTE": "0",
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE": "0",
    "SWITCHBOARD_LIMITS__INBOX_DEPTH": "0",
}


# ---------------------------------------------------------------- the baseline server


def serve_baseline(port: int) -> None:
    """A raw aiohttp server: SSE streams that only keep alive, ``/healthz``, and a message post that reads its body."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(b"retry: 2000\n\n")
        with contextlib.suppress(ConnectionResetError):
            while True:
                await asyncio.sleep(15)
                await response.write(b": ping\n\n")
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def sessions(request: web.Request) -> web.Response:
        return web.json_response({"session": "s", "token": "t"}, status=201)

    async def post(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"message_id": "m"}, status=202)

    app = web.Application()
    app.router.add_get("/api/chat/stream", stream)
    app.router.add_get("/healthz", health)
    app.router.add_post("/api/chat/sessions", sessions)
    app.router.add_post("/api/chat/messages", post)
    loop = None
    with contextlib.suppress(ImportError):  # the event loop ``switchboard web`` runs on when it is installed
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=loop)


# ---------------------------------------------------------------- the client


def raise_file_limit(needed: int) -> int:
    """Raise this process's open-file limit (children inherit it) to hold ``needed`` sockets; returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(needed, soft)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


async def _drain(resp: aiohttp.ClientResponse) -> None:
    with contextlib.suppress(aiohttp.ClientError, asyncio.CancelledError, ConnectionError):
        async for _ in resp.content.iter_any():
            pass


@contextlib.asynccontextmanager
async def open_streams(
    http: aiohttp.ClientSession, base: str, tokens: list[str], per_session: int
) -> AsyncIterator[int]:
    """Open ``per_session`` streams for each token (a bounded number connecting at once); yields how many opened."""
    gate = asyncio.Semaphore(_CONNECT_AT_ONCE)
    responses: list[aiohttp.ClientResponse] = []
    readers: list[asyncio.Task[None]] = []
    failed: Counter[str] = Counter()

    async def one(token: str) -> None:
        for attempt in range(_OPEN_ATTEMPTS):  # as a browser would: a refused stream is tried again, later
            if attempt:
                await asyncio.sleep(0.5 * attempt)
            async with gate:
                try:
                    resp = await http.get(f"{base}/api/chat/stream?token={token}")
                except aiohttp.ClientError as exc:
                    failed[type(exc).__name__] += 1
                    continue
                if resp.status != 200:
                    failed[f"{resp.status} {(await resp.json())['error']['code']}"] += 1
                    resp.release()
                    continue
                await resp.content.readline()  # "retry: …": the stream is open
                responses.append(resp)
                readers.append(asyncio.create_task(_drain(resp)))
                return

    try:
        async with asyncio.timeout(_GUARD_S):
            await asyncio.gather(*(one(t) for t in tokens for _ in range(per_session)))
        if failed:
            print(f"  refused while opening (then tried again): {dict(failed)}", flush=True)
        yield len(responses)
    finally:
        for resp in responses:
            resp.close()
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def _timed(call: Any) -> tuple[float, int]:
    started = time.perf_counter()
    async with call as resp:
        await resp.read()
        return (time.perf_counter() - started) * 1000, resp.status


async def latencies(http: aiohttp.ClientSession, base: str, tokens: list[str], requests: int) -> dict[str, float]:
    """``/healthz`` and message posts, one at a time (interleaved): p50/p99 in ms and the share of non-2xx."""
    health: list[float] = []
    posts: list[float] = []
    bad = 0
    for n in range(requests):
        ms, status = await _timed(http.get(f"{base}/healthz"))
        health.append(ms)
        bad += status != 200
        token = tokens[n % len(tokens)]
        body = json.dumps({"text": f"bench message {n}", "client_id": f"bench-{n}"})
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        ms, status = await _timed(http.post(f"{base}/api/chat/messages", data=body, headers=headers))
        posts.append(ms)
        bad += status != 202
    return {
        "health_p50": percentile(health, 50),
        "health_p99": percentile(health, 99),
        "post_p50": percentile(posts, 50),
        "post_p99": percentile(posts, 99),
        "errors": float(bad),
    }


async def _sessions(http: aiohttp.ClientSession, base: str, count: int) -> list[str]:
    gate = asyncio.Semaphore(32)

    async def one() -> str:
        async with gate, http.post(f"{base}/api/chat/sessions") as resp:
            if resp.status != 201:
                raise RuntimeError(f"POST /api/chat/sessions: {resp.status} {await resp.text()}")
            return str((await resp.json())["token"])

    return list(await asyncio.gather(*(one() for _ in range(count))))


def _redis_clients(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return len(client.client_list())
    finally:
        client.close()


async def measure(proc: Proc, base: str, streams: int, requests: int, redis_url: str | None) -> dict[str, float]:
    """Idle figures, then the same with ``streams`` open: latency, RSS, Redis connections."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        tokens = await _sessions(http, base, max(streams // PER_SESSION, 1))
        out = {f"idle_{k}": v for k, v in (await latencies(http, base, tokens, requests)).items()}
        out["idle_rss"] = proc.rss_mib()
        redis_before = _redis_clients(redis_url) if redis_url else 0.0
        async with open_streams(http, base, tokens, PER_SESSION) as opened:
            out["opened"] = float(opened)
            await asyncio.sleep(1.0)  # settle
            out.update(await latencies(http, base, tokens, requests))
            out["rss"] = proc.rss_mib()
            out["redis_conns"] = float(_redis_clients(redis_url) - redis_before) if redis_url else float("nan")
    return out


# ---------------------------------------------------------------- rounds


def one_round(tmp: Path, redis_url: str, streams: int, requests: int, server_cpus: set[int] | None) -> dict[str, Any]:
    """Switchboard, then the baseline, with the same client and sizes."""
    results: dict[str, Any] = {}
    port = free_port()
    env = bench_env(redis_url, tmp / "data", port=port, **_NO_LIMITS)
    web_proc = Proc("web", [PYTHON, "-m", "switchboard", "web"], env=env, cpus=server_cpus, log_dir=tmp)
    try:
        web_proc.wait_http(f"http://127.0.0.1:{port}/healthz")
        results["switchboard"] = asyncio.run(
            measure(web_proc, f"http://127.0.0.1:{port}", streams, requests, redis_url)
        )
    finally:
        web_proc.stop()
    port = free_port()
    base = Proc(
        "baseline",
        [PYTHON, "-m", "bench.streams", "--serve-baseline", "--port", str(port)],
        cpus=server_cpus,
        log_dir=tmp,
    )
    try:
        base.wait_http(f"http://127.0.0.1:{port}/healthz")
        results["baseline"] = asyncio.run(measure(base, f"http://127.0.0.1:{port}", streams, requests, None))
    finally:
        base.stop()
    return results


def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "streams")
    p.add_argument("--streams", type=int, default=None, help=f"open streams (default {STREAMS}, quick {STREAMS_QUICK})")
    ns = p.parse_args(argv)
    rounds = rounds_of(ns)
    streams = ns.streams or (STREAMS_QUICK if ns.quick else STREAMS)
    requests = REQUESTS_QUICK if ns.quick else REQUESTS
    limit = raise_file_limit(streams * 2 + 1024)
    server_cpus, load_cpus = cores()
    print(
        f"streams: {streams} open streams ({PER_SESSION} per session), {requests} requests of each kind, "
        f"{rounds} round(s); open-file limit {limit}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    with workdir("sb-bench-streams-") as tmp, pinned(load_cpus):
        server = start_redis(tmp, load_cpus)
        try:
            for _ in range(rounds):
                rows.append(one_round(tmp, server.url, streams, requests, server_cpus))
        finally:
            server.stop()
    return verdicts(report(rows, streams), ns.quick)


def report(rounds: list[dict[str, Any]], streams: int) -> list[Row]:
    """Print the table; return the summary rows."""

    def m(side: str, key: str) -> float:
        return median([r[side][key] for r in rounds])

    table = []
    for side, label in (("switchboard", "switchboard web"), ("baseline", "baseline: raw aiohttp SSE server")):
        table.append(
            [
                label,
                fmt(m(side, "opened"), 0),
                f"{fmt(m(side, 'idle_health_p50'), 2)} / {fmt(m(side, 'idle_health_p99'), 2)}",
                f"{fmt(m(side, 'health_p50'), 2)} / {fmt(m(side, 'health_p99'), 2)}",
                f"{fmt(m(side, 'idle_post_p50'), 2)} / {fmt(m(side, 'idle_post_p99'), 2)}",
                f"{fmt(m(side, 'post_p50'), 2)} / {fmt(m(side, 'post_p99'), 2)}",
                f"{fmt(m(side, 'idle_rss'))} → {fmt(m(side, 'rss'))}",
                fmt(m(side, "redis_conns"), 0) if side == "switchboard" else "—",
                fmt(m(side, "errors") + m(side, "idle_errors"), 0),
            ]
        )
    print()
    print(
        render_table(
            f"{streams} open SSE streams on one process (median of {len(rounds)} round(s); latencies in ms, "
            "p50 / p99, with no streams then with them open)",
            [
                "server",
                "streams open",
                "/healthz idle",
                "/healthz with streams",
                "post idle",
                "post with streams",
                "RSS MiB idle → with streams",
                "extra Redis connections",
                "non-2xx",
            ],
            table,
        )
    )
    health = m("switchboard", "health_p99")
    post = m("switchboard", "post_p99")
    rss = m("switchboard", "rss")
    opened = m("switchboard", "opened")
    return [
        Row("streams", f"streams held open (of {streams})", fmt(opened, 0), f"{streams}", opened >= streams),
        Row(
            "streams",
            "/healthz p99 with streams open",
            f"{fmt(health, 2)} ms",
            f"≤ {TARGET_P99_MS:.0f} ms",
            health <= TARGET_P99_MS,
        ),
        Row(
            "streams",
            "message post p99 with streams open",
            f"{fmt(post, 2)} ms",
            f"≤ {TARGET_P99_MS:.0f} ms",
            post <= TARGET_P99_MS,
        ),
        Row(
            "streams",
            "web RSS with streams open",
            f"{fmt(rss)} MiB",
            f"≤ {TARGET_RSS_MIB:.0f} MiB",
            rss <= TARGET_RSS_MIB,
        ),
        Row("streams", "RSS vs raw aiohttp SSE server", f"{fmt(rss / m('baseline', 'rss'), 2)}×", "(report)", None),
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.streams``, or ``--serve-baseline --port P`` for the baseline server alone."""
    args = sys.argv[1:] if argv is None else argv
    if "--serve-baseline" in args:
        p = argparse.ArgumentParser()
        p.add_argument("--serve-baseline", action="store_true")
        p.add_argument("--port", type=int, required=True)
        serve_baseline(p.parse_args(args).port)
        return 0
    rows = run(args)
    print(render_table("Summary", ("bench", "metric", "measured", "target", "met"), [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
