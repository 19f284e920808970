"""Switchboard's benchmarks: figures printed side by side with baselines measured in the same run.

``python -m bench`` runs them all and prints a summary against the targets of issues #2 and #3; each module
also runs alone (``python -m bench.ingest --quick``). Method and reference figures:
``/work/shared/reference/performance.md``. No benchmark asserts on a timing; the test suite only checks that
each one runs (``tests/test_bench_smoke.py``).

==================== ======================================================================================
``bench.ingest``      req/s, p50/p99 of ``switchboard web`` vs raw aiohttp and python-telegram-bot (wrk)
``bench.e2e``         messages/s through one worker and accepted → delivered latency, full and half load
``bench.concurrency`` turns running at once in one worker with a 2 s model; the worker's peak RSS
``bench.footprint``   idle RSS of ``web`` and ``worker``; ``switchboard run`` time to ready
``bench.runtime``     agent-runtime overhead per step; Monty program runs
==================== ======================================================================================
"""
