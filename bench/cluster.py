"""Throughput on one node and on a 3-primary Redis Cluster in the same run, and the projection to N primaries.

The same whole gateway twice (``python -m switchboard web``, ``WORKERS`` × ``python -m switchboard worker``, the fake
Telegram Bot API, the offline model, signed updates through the webhook): first on one embedded valkey, then with
``SWITCHBOARD_REDIS_URL=redis+cluster://…`` on a cluster of 3 primaries started from the same binary
(:class:`tests.cluster.servers.LocalCluster`, no replicas: they would take CPU from the two halves unevenly). Each
half posts the same burst (``CHATS`` chats, 8 posting threads) and reads every primary's counters around it
(:mod:`bench.capacity`: ``INFO commandstats`` / ``stats`` / ``cpu``, less the idle background and a reading's own
cost): messages/s end to end, then per primary its share of the commands, bytes and server CPU per message.

The projection to N primaries (Redis side only) rests on these assumptions, each stated with the run:

1. the hot path is per shard: every command of a message's ingest, drain and reply goes to its session's shard,
   so a primary's load is the messages of the sessions whose shards it holds (what the cluster half measures as
   each primary's share of the commands);
2. the spread is even: shards are split into N contiguous slot ranges (as ``valkey-cli --cluster create``), and
   sessions fall into shards by CRC-32 (:func:`switchboard.queue.shards.shard_of`); the busiest primary's share of
   100,000 session keys is measured for each N and caps the cluster at ``rate / (commands per message × share)``;
3. a primary's rate is the one-node ``valkey-cli`` pipeline-free rate of :mod:`bench.capacity` (commands/s), the
   same per primary (one primary per machine, or per core);
4. the web and worker tiers are not the limit (they scale out by adding processes; on this 2-core machine they are
   what limits the end-to-end figure, so the measured 1-node vs 3-primary messages/s says little about Redis);
5. readers that merge the 1,024 shards (``/metrics``, the console) are off the hot path and not counted.

    python -m bench.cluster            # 300 messages per half (about a minute)
    python -m bench.cluster --quick    # 40 messages per half (figures meaningless)
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

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
from bench.capacity import LIMITS_OFF, QUIET_TIMERS, Background, Cost, Rate, Reading, _get_json, primary_rate, read
from switchboard.channels.telegram.fake.platform import make_update
from switchboard.queue.shards import SLOTS_PER_SHARD, shard_of
from tests.cluster.servers import LocalCluster

CHATS = 60
WORKERS = 2
PROJECTED = (1, 3, 6, 12, 24, 48)
SPREAD_SESSIONS = 100_000
CROSS_SLOT = ("same key slot", "CROSSSLOT")


class CannotRun(RuntimeError):
    """A half that cannot run on this build (say why, do not fail the run)."""


@dataclass
class Half:
    """One half's figures."""

    name: str
    messages: int = 0
    seconds: float = 0.0
    per_node: dict[str, Cost] = field(default_factory=dict)
    skipped: str = ""

    @property
    def per_s(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    def total(self, attr: str) -> float:
        return sum(float(getattr(c, attr)) for c in self.per_node.values())


class Stack:
    """The fake Bot API, ``switchboard web`` and ``WORKERS`` workers on ``url``; ``nodes``: each primary's client."""

    def __init__(self, tmp: Path, url: str, nodes: dict[str, redis.Redis]) -> None:
        self.tmp, self.nodes, self.procs = tmp, nodes, list[Proc]()
        fake_port = free_port()
        self.fake_url = f"http://127.0.0.1:{fake_port}"
        fake = self._proc("fake", [PYTHON, "-m", "bench._servers", "fake-telegram", "--port", str(fake_port)])
        fake.wait_http(f"{self.fake_url}/_fake/calls")
        port = free_port()
        env = bench_env(url, tmp / "data", port=port, telegram_url=self.fake_url) | QUIET_TIMERS | LIMITS_OFF
        self.web_url = f"http://127.0.0.1:{port}"
        self.web = self._proc("web", [PYTHON, "-m", "switchboard", "web"], env=env)
        self.web.wait_http(f"{self.web_url}/healthz")
        self.workers = [
            self._proc(f"worker{i}", [PYTHON, "-m", "switchboard", "worker"], env=env) for i in range(WORKERS)
        ]
        deadline = time.monotonic() + 40
        while _get_json(f"{self.web_url}/healthz").get("workers", 0) < WORKERS:
            dead = [w for w in self.workers if w.popen.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise CannotRun(f"no live workers: {self._said(dead or self.workers)}")
            time.sleep(0.1)
        self.since = 0
        self.update = random.randrange(10**6, 10**8)
        self._lock = threading.Lock()

    def _proc(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        self.procs.append(Proc(name, args, env=env, log_dir=self.tmp))
        return self.procs[-1]

    @staticmethod
    def _said(procs: list[Proc]) -> str:
        lines = [ln.strip() for p in procs for ln in p.tail(20_000).splitlines() if any(s in ln for s in CROSS_SLOT)]
        return "; ".join(sorted(set(lines))[:3]) or procs[0].tail(600)

    def post(self, chat_id: int) -> None:
        with self._lock:
            self.update += 1
            update_id = self.update
        body = json.dumps(make_update("hello there", chat_id=chat_id, update_id=update_id)).encode()
        headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": SECRET_TOKEN}
        request = urllib.request.Request(f"{self.web_url}/webhooks/telegram", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                status = resp.status
        except urllib.error.HTTPError as err:
            status = err.code
        if status != 200:
            raise CannotRun(f"the webhook answered {status}: {self._said([self.web])}")

    def answered(self, chats: set[int], timeout: float = 120.0) -> float:
        """Until every chat in ``chats`` got a reply and none came for 2 s; the time of the last reply."""
        waiting, last = set(chats), time.monotonic()
        deadline = last + timeout
        while waiting or time.monotonic() - last < 2.0:
            if time.monotonic() > deadline:
                raise CannotRun(f"{len(waiting)} chats got no reply: {self._said(self.workers)}")
            url = f"{self.fake_url}/_fake/calls?since={self.since}&method=sendMessage&wait=1"
            with urllib.request.urlopen(url, timeout=5) as resp:
                calls = json.loads(resp.read())
            if calls:
                self.since = max(self.since, *(int(c["seq"]) for c in calls))
                waiting -= {int(str(c.get("params", {}).get("chat_id", 0))) for c in calls}
                last = time.monotonic()
        return last

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def burst(stack: Stack, half: Half, n: int) -> None:
    """Open ``CHATS`` sessions (uncounted), then post ``n`` messages over them from 8 threads, counters around it."""
    chats = [9000 + i for i in range(CHATS)]
    for chat in chats:
        stack.post(chat)
    stack.answered(set(chats))
    time.sleep(1.0)
    backgrounds = {name: Background(c) for name, c in stack.nodes.items()}
    start: dict[str, Reading] = {name: read(c) for name, c in stack.nodes.items()}
    began = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: stack.post(chats[i % CHATS]), range(n)))
    last = stack.answered({chats[i % CHATS] for i in range(n)})
    time.sleep(1.0)  # the last turn's acknowledgement follows its send
    half.messages, half.seconds = n, last - began
    for name, c in stack.nodes.items():
        half.per_node[name] = backgrounds[name].cost(half.name, read(c) - start[name], n)


def one_node(tmp: Path, n: int) -> tuple[Half, Rate]:
    half = Half("1 node")
    server = start_redis(tmp / "single", None)
    control = redis.Redis.from_url(server.url)
    stack: Stack | None = None
    try:
        stack = Stack(tmp / "single", server.url, {f"127.0.0.1:{server.port}": control})
        burst(stack, half, n)
    finally:
        if stack is not None:
            stack.close()
    rate = primary_rate(server, 5_000 if n < 100 else 50_000)
    control.close()
    server.stop()
    return half, rate


def three_primaries(tmp: Path, n: int) -> Half:
    half = Half("3 primaries")
    cluster = LocalCluster(tmp / "cluster", primaries=3, replicas=0).start()
    nodes = {n.address: n.client() for n in cluster.nodes}
    url = "redis+cluster://" + ",".join(nodes)
    stack: Stack | None = None
    try:
        stack = Stack(tmp / "cluster", url, nodes)
        burst(stack, half, n)
    except CannotRun as err:
        half.skipped = str(err)[:600]
    finally:
        if stack is not None:
            stack.close()
        for c in nodes.values():
            c.close()
        cluster.stop()
    return half


def busiest_share(primaries: int, sessions: int = SPREAD_SESSIONS) -> float:
    """The largest share of ``sessions`` random session keys any one of ``primaries`` primaries holds, the 16,384
    slots split into contiguous ranges as ``valkey-cli --cluster create`` splits them."""
    rng = random.Random(26)
    per_slot = 16384 / primaries
    counts = [0] * primaries
    for _ in range(sessions):
        key = f"default/assistant/telegram/default/{rng.randrange(10**12)}"
        counts[min(primaries - 1, int(SLOTS_PER_SHARD * shard_of(key) / per_slot))] += 1
    return max(counts) / sessions


def run(argv: list[str] | None = None) -> list[Row]:
    ns = parser(__doc__.splitlines()[0] if __doc__ else "").parse_args(argv)
    n = 40 if ns.quick else 300
    with workdir("sb-cluster-") as tmp:
        single, rate = one_node(tmp, n)
        cluster = three_primaries(tmp, n)
    print(f"Load average at the end: {os.getloadavg()[0]:.2f} on {len(os.sched_getaffinity(0))} CPU(s).\n")
    headers = ("setup", "node", "messages", "msg/s end to end", "commands/msg", "bytes in+out/msg", "server CPU µs/msg")
    table: list[list[object]] = []
    for half in (single, cluster):
        if half.skipped:
            table.append([half.name, "—", "—", "cannot run yet", "—", "—", "—"])
            continue
        for node, c in half.per_node.items():
            table.append([half.name, node, c.messages, fmt(half.per_s, 1), fmt(c.commands),
                          fmt(c.bytes_in + c.bytes_out, 0), fmt(c.cpu_us, 0)])  # fmt: skip
        if len(half.per_node) > 1:
            both = half.total("bytes_in") + half.total("bytes_out")
            table.append([half.name, "all", half.messages, fmt(half.per_s, 1), fmt(half.total("commands")),
                          fmt(both, 0), fmt(half.total("cpu_us"), 0)])  # fmt: skip
    print(
        render_table(
            f"The same burst ({CHATS} chats, {WORKERS} workers, 1 web) on 1 node and on 3 primaries", headers, table
        )
    )
    if cluster.skipped:
        print(f"The 3-primary half cannot run on this build yet: {cluster.skipped}\n")
    commands = cluster.total("commands") if not cluster.skipped else single.total("commands")
    source = "the cluster half" if not cluster.skipped else "the 1-node half (the cluster's not measured yet)"
    print(
        f"Projection (Redis side): a primary's rate {rate.ops_per_s:,.0f} commands/s (valkey-cli, pipeline-free, "
        f"this machine), {fmt(commands)} commands per message from {source}; N primaries carry "
        f"rate / (commands per message × the busiest primary's share of sessions). Assumptions in `bench/cluster.py`."
    )
    projection = []
    for primaries in PROJECTED:
        share = busiest_share(primaries)
        projection.append([primaries, f"{100 * share:.2f} %", f"{share * primaries:.3f}",
                           fmt(rate.ops_per_s / (commands * share), 0)])  # fmt: skip
    print(
        render_table(
            "Messages/s projected to N primaries", ("primaries", "busiest share", "vs even", "msg/s"), projection
        )
    )
    three = "cannot run yet" if cluster.skipped else fmt(cluster.per_s, 1)
    rows = [
        Row("cluster", "msg/s end to end, 1 node", fmt(single.per_s, 1), "—", None),
        Row("cluster", "msg/s end to end, 3 primaries", three, "—", None),
        Row("cluster", f"projected msg/s at {PROJECTED[-2]} primaries", str(projection[-2][3]), "—", None),
    ]  # fmt: skip
    print(render_table("Targets", SUMMARY_HEADERS, [r.cells() for r in verdicts(rows, ns.quick)]))
    return rows


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run()
