"""Shell sandbox (issue #10): sandbox start to first output, and concurrent commands per worker.

For every sandbox kind this host runs (bubblewrap + seccomp, Landlock + seccomp), side by side in the same run
with the same command started without any sandbox (``/bin/sh -c`` as a plain child):

- start to first output: from spawning to the first byte of ``echo ready`` (and of ``python3 -c 'print(1)'``, the
  same interpreter inside and out) reaching the bench, median and p95 over many runs, one at a time — the
  sandboxed command writes into a FIFO in its workspace, so its first byte is seen before the sandbox tears down;
  without a sandbox also ``python3 -I -S -c 'print(1)'``, the floor of the Landlock launcher (an interpreter that
  starts without ``site``: what the launcher is before it forks the command);
- concurrent commands per worker: ``echo`` commands completed per second with 16 in flight, and the wall time of
  16 concurrent ``sleep 1`` (1 s when they really overlap).

Each round measures every kind in turn (rounds outermost), so a load that comes and goes on a shared machine weighs
on all of them; the Landlock rows are also given against bubblewrap's.

    python -m bench.sandbox
    python -m bench.sandbox --quick
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench._harness import SUMMARY_HEADERS, Row, fmt, median, parser, percentile, render_table, rounds_of, verdicts
from switchboard.sandbox.bwrap import python_prefixes
from switchboard.sandbox.detect import choose
from switchboard.sandbox.limits import CommandLimits
from switchboard.sandbox.runner import Sandbox

TARGET_FIRST_OUTPUT_MS = 50.0
Runner = Callable[[str, Path], Awaitable[float]]
"""Runs a command over a workspace; returns the seconds from spawn to its first output byte."""


LAUNCHER_FLOOR = "python3 -I -S -c 'print(1)'"
"""The interpreter start the Landlock launcher cannot avoid (no ``site``, nothing imported)."""

BUBBLEWRAP = "bwrap+seccomp"
"""The label of the bubblewrap rows, which the other sandboxes are compared with too."""

PLAIN_ENV = {"PATH": ":".join([*(f"{p}/bin" for p in python_prefixes()), "/usr/bin:/bin"]), "LANG": "C.UTF-8"}
"""The sandbox's ``PATH`` (the same ``python3``), for the commands run without a sandbox."""


async def plain(command: str, workspace: Path) -> float:
    """The command with no sandbox: ``/bin/sh -c`` as a child of this process."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=workspace,
        env=PLAIN_ENV,
    )
    assert proc.stdout is not None
    await proc.stdout.read(1)
    first = time.perf_counter() - started
    await proc.communicate()
    return first


def sandboxed(sandbox: Sandbox) -> Runner:
    """Time to first output in ``sandbox``: the command writes its first byte to a FIFO the bench reads."""

    async def run(command: str, workspace: Path) -> float:
        fifo = workspace / "first.fifo"
        if not fifo.exists():
            os.mkfifo(fifo)
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        task = asyncio.create_task(sandbox.run(f"{command} > first.fifo", workspace, timeout_s=30, max_output=1000))
        first = await loop.run_in_executor(None, _first_byte, fifo, started)
        await task
        return first

    return run


def _first_byte(fifo: Path, started: float) -> float:
    with fifo.open("rb") as stream:
        stream.read(1)
        first = time.perf_counter() - started
        stream.read()
    return first


async def first_output(runner: Runner, command: str, workspace: Path, count: int) -> list[float]:
    """Milliseconds to first output of ``count`` runs, one after another (after two warm-up runs)."""
    for _ in range(2):
        await runner(command, workspace)
    return [1000 * await runner(command, workspace) for _ in range(count)]


async def throughput(sandbox: Sandbox | None, workspace: Path, total: int, in_flight: int) -> float:
    """Commands completed per second, ``in_flight`` at a time."""
    slots = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with slots:
            if sandbox is None:
                await plain("echo ok", workspace)
            else:
                await sandbox.run("echo ok", workspace, timeout_s=30, max_output=1000)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return total / (time.perf_counter() - started)


async def overlap(sandbox: Sandbox | None, workspace: Path, width: int) -> float:
    """Wall seconds of ``width`` concurrent ``sleep 1``."""
    started = time.perf_counter()
    if sandbox is None:
        await asyncio.gather(*(plain("sleep 1; echo ok", workspace) for _ in range(width)))
    else:
        await asyncio.gather(
            *(sandbox.run("sleep 1; echo ok", workspace, timeout_s=30, max_output=100) for _ in range(width))
        )
    return time.perf_counter() - started


def _commands(sandbox: Sandbox | None) -> list[str]:
    """The commands timed in ``sandbox`` (``None``: without one, where the launcher's floor is timed too)."""
    return ["echo ready", "python3 -c 'print(1)'", *([LAUNCHER_FLOOR] if sandbox is None else [])]


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run and print the figures; the summary rows."""
    ns = parser(__doc__.splitlines()[0] if __doc__ else "").parse_args(argv)
    rounds = rounds_of(ns)
    count, total = (5, 32) if ns.quick else (60, 400)
    limits = CommandLimits(processes=256)
    kinds: list[tuple[str, Sandbox | None]] = [("none (plain /bin/sh)", None)]
    for kind in ("bwrap", "landlock"):
        found = (await choose(kind, limits=limits, concurrency=16)).sandbox
        if found is not None:
            kinds.append((found.label, found))
    latency_rows, load_rows, rows = [], [], []
    with tempfile.TemporaryDirectory(prefix="sb-bench-sandbox-") as tmp:
        workspace = Path(tmp)
        samples: dict[tuple[str, str], list[float]] = {}
        rates: dict[str, list[float]] = {}
        walls: dict[str, list[float]] = {}
        for _ in range(rounds):  # every kind in every round: a load that comes and goes weighs on all of them
            for label, sandbox in kinds:
                runner = plain if sandbox is None else sandboxed(sandbox)
                for command in _commands(sandbox):
                    taken = await first_output(runner, command, workspace, count)
                    samples.setdefault((label, command), []).extend(taken)
                rates.setdefault(label, []).append(await throughput(sandbox, workspace, total, 16))
                walls.setdefault(label, []).append(await overlap(sandbox, workspace, 16))
    for label, sandbox in kinds:
        for command in _commands(sandbox):
            mid = median(samples[(label, command)])
            ratio = mid / median(samples[(kinds[0][0], command)])
            against = samples.get((BUBBLEWRAP, command))
            bwrap_ratio = fmt(mid / median(against), 2) if sandbox is not None and against else "—"
            p95 = fmt(percentile(samples[(label, command)], 95), 1)
            latency_rows.append([label, f"`{command}`", fmt(mid, 1), p95, fmt(ratio), bwrap_ratio])
            if sandbox is not None and command == "echo ready":
                rows.append(
                    Row(
                        "sandbox",
                        f"{label} start to first output, median (ms)",
                        fmt(mid, 1),
                        f"≤ {TARGET_FIRST_OUTPUT_MS:.0f}",
                        mid <= TARGET_FIRST_OUTPUT_MS,
                    )
                )
        rate, wall = median(rates[label]), median(walls[label])
        load_rows.append([label, fmt(rate, 0), fmt(rate / median(rates[kinds[0][0]]), 2), fmt(wall, 2)])
        if sandbox is not None:
            rows.append(Row("sandbox", f"{label} commands/s, 16 in flight", fmt(rate, 0), "—", None))
    print(
        render_table(
            "Sandbox start to first output (ms)",
            ["sandbox", "command", "median", "p95", "× no sandbox", "× bubblewrap"],
            latency_rows,
        )
    )
    print(
        render_table(
            "Concurrent commands per worker",
            ["sandbox", "`echo` commands/s (16 in flight)", "× no sandbox", "16 × `sleep 1`, wall (s)"],
            load_rows,
        )
    )
    return verdicts(rows, ns.quick)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.sandbox``."""
    rows = asyncio.run(run(argv))
    print(render_table("Targets of issue #10", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
