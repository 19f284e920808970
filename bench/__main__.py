"""``python -m bench``: every benchmark in turn, then one summary table against the issues' targets.

    python -m bench                     # everything, full sizes (about 10 minutes on 2 cores)
    python -m bench --quick             # smoke run, tiny sizes (figures meaningless)
    python -m bench --only ingest,e2e   # a subset
    python -m bench --rounds 5          # more rounds per benchmark

Each benchmark also runs alone: ``python -m bench.<name>`` for every name in :data:`ORDER`; ``bench.teams_window``
(a 10-second agent run behind every Teams message) runs only alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from bench import (
    capacity,
    concurrency,
    documents,
    e2e,
    egress,
    fairness,
    footprint,
    ingest,
    ingest_cost,
    mcp_overhead,
    memory_quality,
    parallel_reads,
    recall,
    rest_overhead,
    runtime,
    sandbox,
    sidebyside,
    slack_ingest,
    streams,
    tables,
    whatsapp_ingest,
)
from bench._harness import SUMMARY_HEADERS, Row, pinned, render_table


def _sync(run: Callable[[list[str]], Coroutine[Any, Any, list[Row]]]) -> Callable[[list[str]], list[Row]]:
    return lambda argv: asyncio.run(run(argv))


RUNNERS: dict[str, Callable[[list[str]], list[Row]]] = {
    "footprint": footprint.run,
    "runtime": _sync(runtime.run),
    "parallel_reads": _sync(parallel_reads.run),
    "rest_overhead": _sync(rest_overhead.run),
    "mcp_overhead": _sync(mcp_overhead.run),
    "tables": _sync(tables.run),
    "recall": _sync(recall.run),
    "ingest": _sync(ingest.run),
    "ingest_cost": ingest_cost.run,
    "capacity": capacity.run,
    "slack_ingest": _sync(slack_ingest.run),
    "sidebyside": sidebyside.run,
    "whatsapp_ingest": _sync(whatsapp_ingest.run),
    "e2e": _sync(e2e.run),
    "concurrency": _sync(concurrency.run),
    "fairness": _sync(fairness.run),
    "streams": streams.run,
    "documents": _sync(documents.run),
    "sandbox": _sync(sandbox.run),
    "egress": _sync(egress.run),
    "memory_quality": _sync(memory_quality.run),
}
"""Every benchmark in the order ``python -m bench`` runs them (each takes ``--quick`` / ``--rounds``)."""
ORDER = tuple(RUNNERS)


def machine() -> str:
    """One line about the machine the figures come from."""
    wrk = shutil.which("wrk")
    wrk_version = "not installed (apt-get install -y wrk)"
    if wrk:
        out = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
        wrk_version = (out.stdout or out.stderr).split("\n", 1)[0].split(" [", 1)[0]
    return (
        f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} CPU(s), "
        f"Python {platform.python_version()}, {wrk_version}, load average {os.getloadavg()[0]:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the chosen benchmarks and print the summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="smoke run with tiny sizes")
    p.add_argument("--rounds", type=int, default=None, help="rounds per benchmark (default 3, quick 1)")
    p.add_argument("--only", default=",".join(ORDER), help=f"comma-separated subset of {','.join(ORDER)}")
    ns = p.parse_args(argv)
    chosen = [name.strip() for name in ns.only.split(",") if name.strip()]
    unknown = set(chosen) - set(ORDER)
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}; choose from {', '.join(ORDER)}")
    common = (["--quick"] if ns.quick else []) + (["--rounds", str(ns.rounds)] if ns.rounds else [])
    print(f"# Switchboard benchmarks\n\n{machine()}\n", flush=True)
    rows: list[Row] = []
    began = time.monotonic()
    for name in ORDER:
        if name not in chosen:
            continue
        print(f"\n## {name}\n", flush=True)
        with pinned(None):  # a benchmark narrows this process's CPUs while it runs; the next one gets them back
            rows += RUNNERS[name](common)
    print(f"\n## Summary ({time.monotonic() - began:.0f} s)\n")
    print(render_table("Targets", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
