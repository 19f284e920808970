"""Footprint: idle RSS of ``switchboard web`` and ``worker``, and how fast ``switchboard run`` is ready.

- **idle RSS**: ``switchboard web`` (and ``switchboard worker``) started against the embedded server, left idle
  for a moment after ``/healthz`` answers, RSS read with psutil; side by side, the raw aiohttp hello-world
  started the same way (the floor for an aiohttp process).
- **time to ready**: ``switchboard run`` in a fresh data directory (embedded server, web, one worker, simulated
  Telegram), from process start to both ``/healthz`` → 200 and the printed ``Web chat:`` URL; then Ctrl-C
  (SIGINT) and the time to a clean exit.

    python -m bench.footprint
    python -m bench.footprint --quick
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from bench._harness import (
    PYTHON,
    REPO,
    SUMMARY_HEADERS,
    Proc,
    Row,
    bench_env,
    fmt,
    free_port,
    http_status,
    median,
    parser,
    render_table,
    rounds_of,
    start_redis,
    verdicts,
    workdir,
)

TARGET_WEB_RSS_MIB = 80.0
TARGET_READY_S = 3.0


def idle_rss(tmp: Path, redis_url: str, settle_s: float) -> dict[str, float]:
    """Start web, worker and the aiohttp baseline one after another; their start-up time and idle RSS."""
    out: dict[str, float] = {}
    port = free_port()
    env = bench_env(redis_url, tmp / "data", port=port)
    web = Proc("web", [PYTHON, "-m", "switchboard", "web"], env=env, log_dir=tmp)
    try:
        out["web_ready_s"] = web.wait_http(f"http://127.0.0.1:{port}/healthz")
        time.sleep(settle_s)
        out["web_rss"] = web.rss_mib()
        worker = Proc("worker", [PYTHON, "-m", "switchboard", "worker"], env=env, log_dir=tmp)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and b'"workers":1' not in _get(f"http://127.0.0.1:{port}/healthz"):
                time.sleep(0.02)
            out["worker_ready_s"] = time.monotonic() - worker.started
            time.sleep(settle_s)
            out["worker_rss"] = worker.rss_mib()
        finally:
            worker.stop()
    finally:
        web.stop()
    aio_port = free_port()
    aio = Proc("aiohttp", [PYTHON, "-m", "bench._servers", "aiohttp", "--port", str(aio_port)], log_dir=tmp)
    try:
        out["aio_ready_s"] = aio.wait_http(f"http://127.0.0.1:{aio_port}/healthz")
        time.sleep(settle_s)
        out["aio_rss"] = aio.rss_mib()
    finally:
        aio.stop()
    return out


def _get(url: str) -> bytes:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bytes(resp.read()).replace(b" ", b"")
    except OSError:
        return b""


def run_ready(tmp: Path, round_no: int) -> dict[str, float]:
    """``switchboard run`` in a fresh data dir: seconds to the printed URL, to ``/healthz`` 200, and to stop."""
    data = tmp / f"fresh-{round_no}"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update({"SWITCHBOARD_DATA_DIR": str(data), "SWITCHBOARD_PORT": str(port), "SWITCHBOARD_LOG_LEVEL": "WARNING"})
    script = Path(PYTHON).with_name("switchboard")
    command = [str(script), "run"] if script.exists() else [PYTHON, "-m", "switchboard", "run"]
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    printed: list[float] = []
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            lines.append(line)
            if re.search(r"Web chat:\s+http://", line) and not printed:
                printed.append(time.monotonic() - started)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    healthy = float("nan")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if healthy != healthy and http_status(f"http://127.0.0.1:{port}/healthz", timeout=0.5) == 200:
                healthy = time.monotonic() - started
            if printed and healthy == healthy:
                break
            time.sleep(0.005)
        if not printed or healthy != healthy:
            raise RuntimeError("`switchboard run` did not get ready within 30 s:\n" + "".join(lines)[-2000:])
        ps = psutil.Process(proc.pid)
        rss = ps.memory_info().rss / 2**20
        children = sum(c.memory_info().rss for c in ps.children(recursive=True)) / 2**20
        stop_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(15)
        stopped = time.monotonic() - stop_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(2)
        if proc.stdout:
            proc.stdout.close()
    return {
        "printed_s": printed[0],
        "healthz_s": healthy,
        "ready_s": max(printed[0], healthy),
        "stop_s": stopped,
        "exit": float(code),
        "rss": rss,
        "children_rss": children,
    }


def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "footprint")
    ns = p.parse_args(argv)
    rounds = rounds_of(ns)
    settle = 0.3 if ns.quick else 2.0
    print(f"footprint: {rounds} round(s); load average {os.getloadavg()[0]:.2f}", flush=True)
    idle: list[dict[str, float]] = []
    ready: list[dict[str, float]] = []
    with workdir("sb-bench-footprint-") as tmp:
        server = start_redis(tmp, None)
        try:
            for _ in range(rounds):
                idle.append(idle_rss(tmp, server.url, settle))
        finally:
            server.stop()
        for r in range(rounds):
            ready.append(run_ready(tmp, r))
    return verdicts(report(idle, ready), ns.quick)


def report(idle: list[dict[str, float]], ready: list[dict[str, float]]) -> list[Row]:
    """Print the tables; return the summary rows."""

    def m(rows: list[dict[str, float]], key: str) -> float:
        return median([r[key] for r in rows])

    print()
    print(
        render_table(
            f"Idle processes (median of {len(idle)} round(s))",
            ["process", "RSS MiB", "start → ready s"],
            [
                ["switchboard web (/healthz 200)", fmt(m(idle, "web_rss")), fmt(m(idle, "web_ready_s"), 2)],
                [
                    "switchboard worker (counted live by /healthz)",
                    fmt(m(idle, "worker_rss")),
                    fmt(m(idle, "worker_ready_s"), 2),
                ],
                ["baseline: raw aiohttp hello-world", fmt(m(idle, "aio_rss")), fmt(m(idle, "aio_ready_s"), 2)],
            ],
        )
    )
    rows = [
        [
            i,
            fmt(r["printed_s"], 2),
            fmt(r["healthz_s"], 2),
            fmt(r["ready_s"], 2),
            fmt(r["rss"]),
            fmt(r["children_rss"]),
            fmt(r["stop_s"], 2),
            int(r["exit"]),
        ]
        for i, r in enumerate(ready, start=1)
    ]
    print(
        render_table(
            "`switchboard run` in a fresh data dir",
            [
                "round",
                "URL printed s",
                "/healthz 200 s",
                "ready s",
                "RSS MiB (web + worker)",
                "embedded server RSS MiB",
                "Ctrl-C → exit s",
                "exit code",
            ],
            rows,
        )
    )
    web_rss = m(idle, "web_rss")
    ready_s = m(ready, "ready_s")
    clean = all(r["exit"] == 0 for r in ready)
    return [
        Row(
            "footprint",
            "idle `switchboard web` RSS",
            f"{web_rss:.0f} MiB",
            f"≤ {TARGET_WEB_RSS_MIB:.0f} MiB",
            web_rss <= TARGET_WEB_RSS_MIB,
        ),
        Row(
            "footprint",
            "`switchboard run` start → ready (fresh data dir)",
            f"{ready_s:.2f} s",
            f"≤ {TARGET_READY_S:.0f} s",
            ready_s <= TARGET_READY_S,
        ),
        Row(
            "footprint",
            "`switchboard run` Ctrl-C → clean exit",
            f"{m(ready, 'stop_s'):.2f} s, exit {'0' if clean else 'non-zero'}",
            "exit 0",
            clean,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.footprint``."""
    rows = run(argv)
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
