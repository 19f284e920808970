"""Shared machinery of the benchmarks: processes pinned to cores, the Redis server, load generators, tables.

Method (``/work/shared/reference/performance.md``): the server under test runs alone on one core, the load
generator and Redis on the other; every figure is compared with a baseline measured in the same run, and
several rounds are summarised by their median. Nothing here asserts on a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from switchboard.fakes.telegram import make_update
from switchboard.queue.embedded import EmbeddedRedis

__all__ = [
    "WRK_INSTALL_HINT",
    "BenchArgs",
    "LoadResult",
    "PostLoad",
    "Proc",
    "Row",
    "bench_env",
    "cores",
    "free_port",
    "load",
    "median",
    "percentile",
    "render_table",
    "start_redis",
    "telegram_load",
    "verdicts",
    "webchat_load",
    "wrk_path",
]

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
WRK_INSTALL_HINT = (
    "wrk is not installed: `apt-get install -y wrk` (Debian/Ubuntu package `wrk`) gives the figures of "
    "performance.md; falling back to a Python aiohttp load generator, which saturates before the server "
    "does, so the req/s below are a floor, not the server's capacity"
)
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
  telegram: {agent: assistant}
"""
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
    """A Markdown table under a bold title (what the README shows)."""
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


@dataclass(slots=True)
class BenchArgs:
    """Options every benchmark takes."""

    quick: bool = False
    rounds: int = 3
    extra: dict[str, Any] = field(default_factory=dict)


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


def cores() -> tuple[set[int] | None, set[int] | None]:
    """``(server_cores, load_cores)``: one core for the server, the rest for load and Redis; ``None`` on one core."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return {available[0]}, set(available[1:])


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


# ---------------------------------------------------------------- request bodies


@dataclass
class PostLoad:
    """POST requests whose bodies differ per request: ``parts`` interleaved with per-request values.

    ``fields[i]`` names the value after ``parts[i]``: ``"n"`` (a counter, distinct per request) or
    ``"chat"`` (``chat_base + n % chats``). ``rotate`` gives one header whose value cycles with ``n``.
    The same description renders as a wrk Lua script and as Python bodies, so both generators send the same.
    """

    path: str
    parts: list[str]
    fields: list[str]
    headers: dict[str, str]
    start: int = 1
    chats: int = 1000
    chat_base: int = 1_000_000
    rotate: tuple[str, list[str]] | None = None

    def request(self, n: int) -> tuple[bytes, dict[str, str]]:
        """Body and headers of the ``n``-th request."""
        counter = self.start + n
        values = {"n": str(counter), "chat": str(self.chat_base + counter % self.chats)}
        pieces = [self.parts[0]]
        for name, part in zip(self.fields, self.parts[1:], strict=True):
            pieces += [values[name], part]
        body = "".join(pieces)
        headers = dict(self.headers)
        if self.rotate:
            name, options = self.rotate
            headers[name] = options[counter % len(options)]
        return body.encode(), headers

    @property
    def body_bytes(self) -> int:
        """Size of a typical body."""
        return len(self.request(0)[0])

    def lua(self) -> str:
        """A wrk script sending these requests (one wrk thread: the counter is global to it)."""
        out = ["-- generated by bench/_load.py", f"local counter = {self.start - 1}", 'wrk.method = "POST"']
        for name, value in self.headers.items():
            out.append(f"wrk.headers[{_lua_str(name)}] = {_lua_str(value)}")
        out.append("local parts = {" + ", ".join(_lua_str(p) for p in self.parts) + "}")
        if self.rotate:
            out.append("local rotate = {" + ", ".join(_lua_str(v) for v in self.rotate[1]) + "}")
        out.append("request = function()")
        out.append("  counter = counter + 1")
        out.append(f"  local chat = {self.chat_base} + (counter % {self.chats})")
        pieces = []
        for i in range(len(self.parts)):
            pieces.append(f"parts[{i + 1}]")
            if i < len(self.fields):
                pieces.append("counter" if self.fields[i] == "n" else "chat")
        out.append("  local body = " + " .. ".join(pieces))
        if self.rotate:
            out.append(f"  wrk.headers[{_lua_str(self.rotate[0])}] = rotate[(counter % #rotate) + 1]")
        out.append(f"  return wrk.format(nil, {_lua_str(self.path)}, nil, body)")
        out.append("end")
        return "\n".join(out) + "\n"


def _lua_str(text: str) -> str:
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\{ord(ch):03d}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_UID = 987_654_321_001
_CHAT = 987_654_321_002


def telegram_load(*, path: str = "/webhooks/telegram", start: int = 1, chats: int = 1000, size: int = 1500) -> PostLoad:
    """Signed Telegram updates of about ``size`` bytes, distinct ``update_id``s, spread over ``chats`` chats."""
    text = "benchmark " + "lorem ipsum dolor sit amet " * 80
    update = make_update(text, chat_id=_CHAT, update_id=_UID, first_name="Bench", username="bench_user")
    raw = json.dumps(update, ensure_ascii=False)
    over = len(raw) - size
    if over > 0:
        update = make_update(text[:-over], chat_id=_CHAT, update_id=_UID, first_name="Bench", username="bench_user")
        raw = json.dumps(update, ensure_ascii=False)
    pieces = re.split(f"({_UID}|{_CHAT})", raw)
    parts, fields = pieces[0::2], ["n" if p == str(_UID) else "chat" for p in pieces[1::2]]
    headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": SECRET_TOKEN}
    return PostLoad(path=path, parts=parts, fields=fields, headers=headers, start=start, chats=chats)


def webchat_load(tokens: list[str], *, start: int = 1, size: int = 1500) -> PostLoad:
    """``POST /api/chat/messages`` bodies of about ``size`` bytes with distinct ``client_id``s, tokens rotating."""
    prefix = '{"client_id": "bench-'
    middle = '", "text": "benchmark '
    filler = "lorem ipsum dolor sit amet " * 80
    room = max(10, size - len(prefix) - len(middle) - 12)
    parts = [prefix, middle + filler[:room] + '"}']
    return PostLoad(
        path="/api/chat/messages",
        parts=parts,
        fields=["n"],
        headers={"Content-Type": "application/json"},
        start=start,
        rotate=("Authorization", [f"Bearer {t}" for t in tokens]),
    )


# ---------------------------------------------------------------- load generators


@dataclass(slots=True)
class LoadResult:
    """What one load run measured."""

    generator: str
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    """Non-2xx answers plus socket errors."""


def wrk_path() -> str | None:
    """The ``wrk`` binary, if installed."""
    return shutil.which("wrk")


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not match:
        return float("nan")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(output: str) -> LoadResult:
    """Read wrk's ``--latency`` report."""
    requests = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", output)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    p50 = re.search(r"^\s+50%\s+(\S+)", output, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", output, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    if not (requests and rps):
        raise RuntimeError(f"could not read wrk's output:\n{output}")
    errors = int(non2xx.group(1)) if non2xx else 0
    if sock:
        errors += sum(int(g) for g in sock.groups())
    return LoadResult(
        generator="wrk",
        requests=int(requests.group(1)),
        seconds=_ms(requests.group(2) + requests.group(3)) / 1000,
        rps=float(rps.group(1)),
        p50_ms=_ms(p50.group(1)) if p50 else float("nan"),
        p99_ms=_ms(p99.group(1)) if p99 else float("nan"),
        errors=errors,
    )


async def run_wrk(
    base_url: str, spec: PostLoad, *, connections: int, seconds: float, cpus: set[int] | None, scratch: Path
) -> LoadResult:
    """``wrk -t1 -c<connections> -d<seconds>s --latency -s script.lua`` pinned to ``cpus``."""
    binary = wrk_path()
    assert binary is not None
    script = scratch / f"load-{spec.start}.lua"
    script.write_text(spec.lua())
    args = [binary, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script)]
    args.append(base_url.rstrip("/") + spec.path)
    if cpus:
        args = ["taskset", "-c", ",".join(str(c) for c in sorted(cpus)), *args]
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}):\n{out.decode(errors='replace')}")
    return parse_wrk(out.decode(errors="replace"))


async def run_python_load(
    base_url: str, spec: PostLoad, *, connections: int, seconds: float, cpus: set[int] | None
) -> LoadResult:
    """The fallback: ``connections`` aiohttp clients in this process (pinned to ``cpus`` while it runs)."""
    import aiohttp

    previous = os.sched_getaffinity(0)
    pin(0, cpus)
    latencies: list[float] = []
    errors = 0
    counter = 0
    url = base_url.rstrip("/") + spec.path
    deadline = time.perf_counter() + seconds

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal counter, errors
        while time.perf_counter() < deadline:
            body, headers = spec.request(counter)
            counter += 1
            sent = time.perf_counter()
            try:
                async with http.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status >= 300:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
                continue
            latencies.append((time.perf_counter() - sent) * 1000)

    try:
        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector) as http:
            began = time.perf_counter()
            await asyncio.gather(*(client(http) for _ in range(connections)))
            took = time.perf_counter() - began
    finally:
        os.sched_setaffinity(0, previous)
    return LoadResult(
        generator="python",
        requests=len(latencies),
        seconds=took,
        rps=len(latencies) / took if took else 0.0,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        errors=errors,
    )


async def load(
    base_url: str,
    spec: PostLoad,
    *,
    connections: int,
    seconds: float,
    cpus: set[int] | None,
    scratch: Path,
    generator: str,
) -> LoadResult:
    """Run the chosen generator (``wrk`` or ``python``) against ``base_url``."""
    if generator == "wrk":
        return await run_wrk(base_url, spec, connections=connections, seconds=seconds, cpus=cpus, scratch=scratch)
    return await run_python_load(base_url, spec, connections=connections, seconds=seconds, cpus=cpus)
