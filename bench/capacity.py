"""Capacity of one Redis primary: commands, bytes and server CPU per message, and what they allow per second.

A whole gateway runs as an operator runs it (the embedded valkey, the fake Telegram Bot API, ``python -m switchboard
web`` and ``python -m switchboard worker``, the offline model), and signed Telegram updates go the real way: webhook
→ ingest → drain → reply delivered to the fake. The server's own counters are read around each window:

- commands: ``INFO commandstats`` calls (commands inside scripts count, ``EVALSHA`` too), without this benchmark's
  own ``INFO``/``CLIENT`` reads and the worker's idle ``LMPOP`` (safety pass)/``PING`` (as
  ``tests/perf/test_command_counts.py``);
- bytes: ``INFO stats`` ``total_net_input_bytes`` / ``total_net_output_bytes``, less what one read of the counters
  costs (two reads back to back) and the idle background (the worker's safety pass, timed over an idle window);
- server CPU: ``INFO cpu`` ``used_cpu_user + used_cpu_sys``, less the idle background likewise.

Scenarios: "one at a time" (each message answered before the next, round robin over a few chats, so each chat's
streaming edit budget of one a second has refilled, as in a human-paced chat) and "burst" (many chats posting at
once; the worker drains what queued together). Then the primary's own rate under a pipeline-free load (several
processes, one command per round trip, ``SET``/``GET``/``INCR``) gives its commands/s on this machine, and per
server CPU-second (the load generators share the cores, so the server may not reach a full core); messages/s per
primary follow by dividing by each scenario's commands per message, and by its server CPU per message.

    python -m bench.capacity            # 40 + 200 messages, 4 x 50,000 commands of load (about 90 s)
    python -m bench.capacity --quick    # 8 + 20 messages, 4 x 5,000 (figures meaningless)
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench._harness import (
    PYTHON,
    SECRET_TOKEN,
    SUMMARY_HEADERS,
    Proc,
    Row,
    bench_env,
    fmt,
    free_port,
    parser,
    render_table,
    start_redis,
    verdicts,
    workdir,
)
from switchboard.channels.telegram.fake.platform import make_update
from switchboard.queue.embedded import EmbeddedRedis, find_server_binary

QUIET_TIMERS = {
    "SWITCHBOARD_QUEUE__LEASE_MS": "600000",
    "SWITCHBOARD_QUEUE__WORKER_HEARTBEAT_MS": "200000",
    "SWITCHBOARD_QUEUE__REAPER_INTERVAL_S": "6000",
    "SWITCHBOARD_QUEUE__SCHEDULE_POLL_S": "6000",
}
"""Timers that would tick at random times in a window (heartbeat, takeover, reaper, scheduler), made too long to."""
LIMITS_OFF = {
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SESSION_PER_MINUTE": "0",
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE": "0",
    "SWITCHBOARD_LIMITS__INBOX_DEPTH": "0",
    "SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR": "0",
}
NOT_COUNTED = frozenset({"info", "client", "lmpop", "ping", "hello", "config"})
"""Commands left out of the count: this benchmark's reads, the idle dequeue, connection handshakes."""
ROUND_ROBIN_CHATS = 8
BURST_CHATS = 50
IDLE_S = 3.0
"""The idle window the background (the worker's safety pass, its heartbeat) is timed over."""


@dataclass
class Reading:
    """The server's counters at one moment."""

    at: float
    commands: dict[str, int]
    net_in: int
    net_out: int
    cpu_s: float

    def __sub__(self, other: Reading) -> Reading:
        names = set(self.commands) | set(other.commands)
        return Reading(
            self.at - other.at,
            {n: self.commands.get(n, 0) - other.commands.get(n, 0) for n in names},
            self.net_in - other.net_in,
            self.net_out - other.net_out,
            self.cpu_s - other.cpu_s,
        )

    @property
    def counted(self) -> int:
        """Commands, without those of :data:`NOT_COUNTED`."""
        return sum(v for n, v in self.commands.items() if n.split("|", 1)[0] not in NOT_COUNTED)


def read(control: redis.Redis) -> Reading:
    """One reading (one ``INFO`` of the three sections, in one round trip)."""
    info = control.info("all")
    commands = {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in info.items()
        if name.startswith("cmdstat_") and isinstance(v, dict)
    }
    return Reading(
        time.monotonic(),
        commands,
        int(info["total_net_input_bytes"]),
        int(info["total_net_output_bytes"]),
        float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
    )


@dataclass
class Cost:
    """One scenario's cost per message at the server."""

    scenario: str
    messages: int
    commands: float
    commands_by_name: dict[str, float]
    bytes_in: float
    bytes_out: float
    cpu_us: float


class Background:
    """What the server does with nobody talking to it but an idle gateway, per second, and what a reading costs."""

    def __init__(self, control: redis.Redis) -> None:
        a = read(control)
        b = read(control)
        self.read_cost = b - a  # one reading's own traffic
        start = read(control)
        time.sleep(IDLE_S)
        idle = read(control) - start
        span = idle.at
        self.in_per_s = max(0.0, (idle.net_in - self.read_cost.net_in) / span)
        self.out_per_s = max(0.0, (idle.net_out - self.read_cost.net_out) / span)
        self.cpu_per_s = max(0.0, (idle.cpu_s - self.read_cost.cpu_s) / span)
        self.commands_per_s = max(0.0, (idle.counted - self.read_cost.counted) / span)

    def cost(self, scenario: str, window: Reading, messages: int) -> Cost:
        """The window's cost per message once a reading's own cost and the idle background are taken off."""
        span = window.at
        by_name = {
            n: v / messages for n, v in sorted(window.commands.items()) if v and n.split("|", 1)[0] not in NOT_COUNTED
        }
        return Cost(
            scenario,
            messages,
            (window.counted - self.read_cost.counted - self.commands_per_s * span) / messages,
            by_name,
            (window.net_in - self.read_cost.net_in - self.in_per_s * span) / messages,
            (window.net_out - self.read_cost.net_out - self.out_per_s * span) / messages,
            (window.cpu_s - self.read_cost.cpu_s - self.cpu_per_s * span) / messages * 1e6,
        )


class Gateway:
    """Redis, the fake Bot API, ``switchboard web`` and ``switchboard worker``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.server = start_redis(tmp, None)
        self.control = redis.Redis.from_url(self.server.url)
        fake_port = free_port()
        self.fake_url = f"http://127.0.0.1:{fake_port}"
        self.procs: list[Proc] = []
        self.fake = self._proc("fake", [PYTHON, "-m", "bench._servers", "fake-telegram", "--port", str(fake_port)])
        self.fake.wait_http(f"{self.fake_url}/_fake/calls")
        port = free_port()
        env = {**bench_env(self.server.url, tmp / "data", port=port, telegram_url=self.fake_url)}
        env.update(QUIET_TIMERS | LIMITS_OFF)
        self.web_url = f"http://127.0.0.1:{port}"
        web = self._proc("web", [PYTHON, "-m", "switchboard", "web"], env=env)
        web.wait_http(f"{self.web_url}/healthz")
        self.worker = self._proc("worker", [PYTHON, "-m", "switchboard", "worker"], env=env)
        deadline = time.monotonic() + 30
        while _get_json(f"{self.web_url}/healthz").get("workers", 0) < 1:
            if self.worker.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no live worker:\n{self.worker.tail()}")
            time.sleep(0.05)
        self.since = 0
        self.update = 1000
        self._lock = threading.Lock()

    def _proc(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, args, env=env, log_dir=self.tmp)
        self.procs.append(proc)
        return proc

    def post(self, chat_id: int, text: str = "hello there") -> None:
        """One signed Telegram update; it must be accepted."""
        with self._lock:
            self.update += 1
            update_id = self.update
        update = make_update(text, chat_id=chat_id, update_id=update_id, first_name="Cap", username="cap_user")
        body = json.dumps(update).encode()
        headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": SECRET_TOKEN}
        request = urllib.request.Request(f"{self.web_url}/webhooks/telegram", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 200, resp.status

    def wait_replies(self, count: int, timeout: float = 60.0) -> None:
        """Until the fake has recorded ``count`` more ``sendMessage`` calls."""
        got = 0
        deadline = time.monotonic() + timeout
        while got < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{got} of {count} replies arrived:\n{self.worker.tail()}")
            url = f"{self.fake_url}/_fake/calls?since={self.since}&method=sendMessage&wait=1"
            with urllib.request.urlopen(url, timeout=5) as resp:
                calls = json.loads(resp.read())
            if calls:
                self.since = max(self.since, *(int(c["seq"]) for c in calls))
                got += len(calls)

    def wait_quiet(self, chats: list[int], quiet_s: float = 2.0, timeout: float = 60.0) -> None:
        """Until every chat in ``chats`` got a reply and no ``sendMessage`` came for ``quiet_s``."""
        waiting = set(chats)
        last = time.monotonic()
        deadline = last + timeout
        while waiting or time.monotonic() - last < quiet_s:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(waiting)} chats got no reply:\n{self.worker.tail()}")
            url = f"{self.fake_url}/_fake/calls?since={self.since}&method=sendMessage&wait=1"
            with urllib.request.urlopen(url, timeout=5) as resp:
                calls = json.loads(resp.read())
            if calls:
                self.since = max(self.since, *(int(c["seq"]) for c in calls))
                waiting -= {int(str(c.get("params", {}).get("chat_id", 0))) for c in calls}
                last = time.monotonic()

    def settle(self) -> None:
        """Let the worker finish the turn whose reply arrived last (its ack follows the send)."""
        time.sleep(1.0)

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.control.close()
        self.server.stop()


def _get_json(url: str) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=2) as resp:
        return dict(json.loads(resp.read()))
    return {}


@contextlib.contextmanager
def window(gw: Gateway) -> Iterator[list[Reading]]:
    """The counters' difference over the block (a list that holds it afterwards)."""
    out: list[Reading] = []
    start = read(gw.control)
    yield out
    out.append(read(gw.control) - start)


def one_at_a_time(gw: Gateway, background: Background, n: int) -> Cost:
    chats = [7000 + i for i in range(ROUND_ROBIN_CHATS)]
    for chat in chats:  # each session opened first (uncounted)
        gw.post(chat)
        gw.wait_replies(1)
    gw.settle()
    with window(gw) as w:
        for i in range(n):
            gw.post(chats[i % len(chats)])
            gw.wait_replies(1)
        gw.settle()
    return background.cost("one at a time", w[0], n)


def burst(gw: Gateway, background: Background, n: int) -> Cost:
    chats = [9000 + i for i in range(BURST_CHATS)]
    for chat in chats:
        gw.post(chat)
    gw.wait_replies(len(chats))
    gw.settle()

    def post(i: int) -> None:
        gw.post(chats[i % len(chats)])

    with window(gw) as w:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(post, range(n)))
        # a drain folds what waits into one turn (fewer replies than messages): done once every chat was answered
        # and nothing more came for two seconds (asked of the fake, so no Redis command of this benchmark counts)
        gw.wait_quiet(sorted({chats[i % len(chats)] for i in range(n)}))
        gw.settle()
    return background.cost(f"burst over {BURST_CHATS} chats", w[0], n)


# ---------------------------------------------------------------- the primary's rate


LOAD_COMMANDS = (("SET", "cap:s", "v"), ("GET", "cap:s"), ("INCR", "cap:n"), ("HSET", "cap:h", "f", "v"))
"""One ``valkey-cli -r`` process per command: each sends its command, waits for the answer, and sends the next."""


@dataclass
class Rate:
    """The primary under a pipeline-free load."""

    clients: int
    seconds: float
    ops_per_s: float
    server_cpu: float
    """Server CPU-seconds per second of the load (1.0 = a full core)."""

    @property
    def ops_per_cpu_s(self) -> float:
        return self.ops_per_s / self.server_cpu if self.server_cpu else 0.0


def primary_rate(server: EmbeddedRedis, repeat: int) -> Rate:
    """``len(LOAD_COMMANDS)`` ``valkey-cli`` clients, ``repeat`` commands each, one per round trip (C, not Python)."""
    cli = str(Path(find_server_binary()).with_name("valkey-cli"))
    control = redis.Redis.from_url(server.url)
    info0 = control.info("all")
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [cli, "-h", "127.0.0.1", "-p", str(server.port), "-r", str(repeat), *command],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for command in LOAD_COMMANDS
    ]
    for p in procs:
        p.wait(300)
    elapsed = time.monotonic() - t0
    info1 = control.info("all")
    control.close()
    ops = int(info1["total_commands_processed"]) - int(info0["total_commands_processed"]) - 1
    cpu = sum(float(info1[k]) - float(info0[k]) for k in ("used_cpu_user", "used_cpu_sys"))
    return Rate(len(procs), elapsed, ops / elapsed, cpu / elapsed)


# ---------------------------------------------------------------- the run


def run(argv: list[str] | None = None) -> list[Row]:
    ns = parser(__doc__.splitlines()[0] if __doc__ else "").parse_args(argv)
    n_one, n_burst, repeat = (8, 20, 5_000) if ns.quick else (40, 200, 50_000)
    with workdir("sb-capacity-") as tmp:
        gw = Gateway(tmp)
        try:
            background = Background(gw.control)
            costs = [one_at_a_time(gw, background, n_one), burst(gw, background, n_burst)]
            rate = primary_rate(gw.server, repeat)
        finally:
            gw.close()
    print(f"Load average at the end: {os.getloadavg()[0]:.2f} on {len(os.sched_getaffinity(0))} CPU(s).")
    print(
        f"Background while idle: {background.commands_per_s:.1f} commands/s, "
        f"{background.in_per_s + background.out_per_s:.0f} B/s, {background.cpu_per_s * 1e3:.1f} ms CPU/s (taken off)."
    )
    print(
        f"Primary under a pipeline-free load ({rate.clients} valkey-cli clients, SET/GET/INCR/HSET, "
        f"{rate.seconds:.1f} s): "
        f"{rate.ops_per_s:,.0f} commands/s at {rate.server_cpu:.2f} server CPU-s/s "
        f"= {rate.ops_per_cpu_s:,.0f} commands per server CPU-second.\n"
    )
    headers = (
        "scenario", "messages", "commands/msg", "bytes in/msg", "bytes out/msg", "server CPU µs/msg",
        "msg/s at measured cmd/s", "msg/s per CPU-s (cmd)", "msg/s per CPU-s (measured CPU)",
    )  # fmt: skip
    table = [
        [
            c.scenario,
            c.messages,
            fmt(c.commands),
            fmt(c.bytes_in, 0),
            fmt(c.bytes_out, 0),
            fmt(c.cpu_us, 0),
            fmt(rate.ops_per_s / c.commands, 0),
            fmt(rate.ops_per_cpu_s / c.commands, 0),
            fmt(1e6 / c.cpu_us, 0) if c.cpu_us > 0 else "—",
        ]
        for c in costs
    ]
    print(render_table("Cost of one message at one primary", headers, table))
    top = sorted(costs[0].commands_by_name.items(), key=lambda kv: -kv[1])
    print("Commands per message, one at a time: " + ", ".join(f"{n} {v:.2f}" for n, v in top) + "\n")
    one = costs[0]
    rows = [
        Row("capacity", "commands per message (one at a time)", fmt(one.commands), "≤ 100 (issue #26)", None),
        Row("capacity", "bytes per message in + out (one at a time)", fmt(one.bytes_in + one.bytes_out, 0), "—", None),
        Row("capacity", "primary commands/s, pipeline-free load", fmt(rate.ops_per_s, 0), "—", None),
        Row("capacity", "messages/s per primary at that rate", fmt(rate.ops_per_s / one.commands, 0), "—", None),
    ]
    print(render_table("Targets", SUMMARY_HEADERS, [r.cells() for r in verdicts(rows, ns.quick)]))
    return rows


if __name__ == "__main__":
    run()
