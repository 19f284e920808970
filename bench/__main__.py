"""``python -m bench``: every benchmark in turn, then one summary table against the issues' targets.

    python -m bench                     # everything, full sizes (about 6 minutes on 2 cores)
    python -m bench --quick             # smoke run, tiny sizes (figures meaningless)
    python -m bench --only ingest,e2e   # a subset
    python -m bench --rounds 5          # more rounds per benchmark

Each benchmark also runs alone: ``python -m bench.ingest`` (``e2e``, ``concurrency``, ``fairness``, ``footprint``,
``runtime``, ``streams``, ``documents``).
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

from bench import concurrency, documents, e2e, fairness, footprint, ingest, runtime, slack_ingest, streams
from bench._harness import SUMMARY_HEADERS, Row, pinned, render_table

ORDER = ("footprint", "runtime", "ingest", "slack_ingest", "e2e", "concurrency", "fairness", "streams", "documents")


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
            if name == "footprint":
                rows += footprint.run(common)
            elif name == "runtime":
                rows += asyncio.run(runtime.run(common))
            elif name == "ingest":
                rows += asyncio.run(ingest.run(common))
            elif name == "slack_ingest":
                rows += asyncio.run(slack_ingest.run(common))
            elif name == "e2e":
                rows += asyncio.run(e2e.run(common))
            elif name == "fairness":
                rows += asyncio.run(fairness.run(common))
            elif name == "streams":
                rows += streams.run(common)
            elif name == "documents":
                rows += asyncio.run(documents.run(common))
            else:
                rows += asyncio.run(concurrency.run(common))
    print(f"\n## Summary ({time.monotonic() - began:.0f} s)\n")
    print(render_table("Targets of issues #2 and #3", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
