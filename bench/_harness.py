"""Shared machinery of the benchmarks: numbers and tables, options, cores, child processes, Redis, environments.

Method (``/work/shared/reference/performance.md``): the server under test runs alone on one core, the load
generator and Redis on the other; every figure is compared with a baseline measured in the same run, and
several rounds are summarised by their median. Nothing here asserts on a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from switchboard.queue.embedded import EmbeddedRedis

__all__ = [
    "BOT_TOKEN",
    "PYTHON",
    "REPO",
    "SECRET_TOKEN",
    "SUMMARY_HEADERS",
    "Proc",
    "Row",
    "bench_env",
    "cores",
    "flushall",
    "fmt",
    "free_port",
    "http_status",
    "median",
    "parser",
    "percentile",
    "pin",
    "pinned",
    "render_table",
    "rounds_of",
    "start_redis",
    "verdicts",
    "workdir",
]

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MINIMAL_CONFIG = """\
tenant: default
default_agent: assistant
agents:
  assistant:
    profile: {name: Assistant, description: Benchmark agent}
    instructions: You are a helpful assistant. Answer briefly.
    tools: [current_time]
channels:
  web: {agent: assistant}
  telegram: {agent: assistant, send_rate: 0, chat_send_rate: 0}
"""
"""``send_rate: 0``: the fake Bot API has no flood limits, so the figures are the gateway's own, not Telegram's 30 sends
a second (which a real bot is held to, and the gateway paces by default)."""
BOT_TOKEN = "123456:bench-token-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
SECRET_TOKEN = "bench-secret-0123456789"
BOT_USERNAME = "switchboard_bench_bot"


# ---------------------------------------------------------------- numbers and tables


def median(values: Sequence[float]) -> float:
    """The median, or NaN for no values."""
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100, nearest rank), or NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return float(ordered[rank])


def fmt(value: float, digits: int = 1) -> str:
    """A number for a table: thousands separated, NaN as a dash."""
    if value != value:  # NaN
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def render_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table under a bold title (what docs/benchmarks.md shows)."""
    lines = [f"**{title}**", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


@dataclass(slots=True)
class Row:
    """One line of the summary table that ``python -m bench`` prints."""

    bench: str
    metric: str
    value: str
    target: str
    met: bool | None

    def cells(self) -> list[str]:
        """The row's cells."""
        verdict = "—" if self.met is None else ("yes" if self.met else "NO")
        return [self.bench, self.metric, self.value, self.target, verdict]


SUMMARY_HEADERS = ("bench", "metric", "measured", "target", "met")


def verdicts(rows: list[Row], quick: bool) -> list[Row]:
    """The rows, with no verdicts for a ``--quick`` run (its tiny sizes say nothing about the targets)."""
    if quick:
        for row in rows:
            row.met = None
    return rows


# ---------------------------------------------------------------- arguments


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the common ``--quick`` and ``--rounds``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a short smoke run with tiny sizes (figures meaningless)")
    p.add_argument("--rounds", type=int, default=None, help="rounds to take the median of (default 3, quick 1)")
    return p


def rounds_of(ns: argparse.Namespace) -> int:
    """The number of rounds the options ask for."""
    return int(ns.rounds) if ns.rounds else (1 if ns.quick else 3)


# ---------------------------------------------------------------- cores, ports, processes


_ALL_CPUS = frozenset(os.sched_getaffinity(0))
"""The CPUs this process could use when it started (a benchmark narrows its own affinity while it runs)."""


def cores() -> tuple[set[int] | None, set[int] | None]:
    """``(server_cores, load_cores)``: one core for the server, the rest for load and Redis; ``None`` on one core."""
    available = sorted(_ALL_CPUS)
    if len(available) < 2:
        return None, None
    return {available[0]}, set(available[1:])


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """Run this process (and the children it starts meanwhile) on ``cpus``; restore the affinity after."""
    before = os.sched_getaffinity(0)
    pin(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pin(pid: int, cpus: set[int] | None) -> None:
    """Pin a process (and so the children it starts later) to ``cpus``; no-op for ``None``."""
    if cpus:
        os.sched_setaffinity(pid, cpus)


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_status(url: str, timeout: float = 1.0) -> int | None:
    """The status of a GET, or ``None`` when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (OSError, ValueError):
        return None


class Proc:
    """A child process the benchmark started (stopped by its own pid, never by name)."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cpus: set[int] | None = None,
        cwd: Path | None = None,
        log_dir: Path,
        capture_stdout: bool = False,
    ) -> None:
        self.name = name
        self.started = time.monotonic()
        self.log = log_dir / f"{name}.log"
        self._log = self.log.open("wb")
        self.popen = subprocess.Popen(
            list(args),
            env=env,
            cwd=cwd or REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture_stdout else self._log,
            stderr=self._log,
            start_new_session=True,
        )
        pin(self.popen.pid, cpus)
        self.ps = psutil.Process(self.popen.pid)

    @property
    def pid(self) -> int:
        """The child's pid."""
        return self.popen.pid

    def cpu_s(self) -> float:
        """CPU time (user + system) the process has used so far, in seconds."""
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def rss_mib(self) -> float:
        """Resident set size in MiB."""
        return float(self.ps.memory_info().rss) / 2**20

    def wait_http(self, url: str, timeout: float = 30.0, *, ok: int | None = 200) -> float:
        """Poll ``url`` until it answers ``ok`` (any status for ``None``); returns the seconds since the start.

        Raises:
            RuntimeError: the process died or did not answer in time (with its log's tail).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")
            status = http_status(url, timeout=0.5)
            if status is not None and (ok is None or status == ok):
                return time.monotonic() - self.started
            time.sleep(0.01)
        raise RuntimeError(f"{self.name} did not answer {url} within {timeout:.0f} s:\n{self.tail()}")

    def tail(self, chars: int = 2000) -> str:
        """The end of the process's log."""
        if not self._log.closed:
            self._log.flush()
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        """Signal the process, wait, and kill it if it does not go; returns its exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.popen.kill()
                self.popen.wait(timeout)
        if self.popen.stdout:
            self.popen.stdout.close()
        self._log.close()
        return self.popen.returncode


def start_redis(root: Path, cpus: set[int] | None) -> EmbeddedRedis:
    """The Redis-compatible server the benchmarks use: the embedded valkey, AOF on, loopback TCP, pinned."""
    server = EmbeddedRedis(root / "redis", port=0)
    server.start()
    assert server.process is not None
    pin(server.process.pid, cpus)
    return server


def flushall(url: str) -> None:
    """Empty the server between measurements (the Lua script cache survives)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushall()
    finally:
        client.close()


def bench_env(
    redis_url: str, data_dir: Path, *, port: int, telegram_url: str | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a gateway process under test: nothing inherited from the caller's Switchboard."""
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir / "switchboard.yaml"
    config.write_text(MINIMAL_CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update(
        {
            "SWITCHBOARD_REDIS_URL": redis_url,
            "SWITCHBOARD_DATA_DIR": str(data_dir),
            "SWITCHBOARD_CONFIG": str(config),
            "SWITCHBOARD_HOST": "127.0.0.1",
            "SWITCHBOARD_PORT": str(port),
            "SWITCHBOARD_LOG_LEVEL": "WARNING",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    if telegram_url:
        env.update(
            {
                "SWITCHBOARD_TELEGRAM__BOT_TOKEN": BOT_TOKEN,
                "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET_TOKEN,
                "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram_url,
                "SWITCHBOARD_TELEGRAM__BOT_USERNAME": BOT_USERNAME,
            }
        )
    env.update(extra)
    return env


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    """A temporary directory for one benchmark's data and logs."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
