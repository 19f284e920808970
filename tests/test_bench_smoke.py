"""The benchmarks run (``--quick``, tiny sizes) and their helpers compute what they claim. No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench._harness import percentile
from bench._load import parse_wrk, telegram_load, webchat_load
from bench.concurrency import peak_overlap

REPO = Path(__file__).resolve().parent.parent
WRK_OUTPUT = """\
Running 10s test @ http://127.0.0.1:8080/webhooks/telegram
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     4.10ms    1.20ms  38.50ms   91.00%
    Req/Sec     7.90k   400.00     8.50k    70.00%
  Latency Distribution
     50%    3.90ms
     75%    4.30ms
     90%    5.00ms
     99%  850.00us
  78650 requests in 10.01s, 11.30MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:   7857.14
Transfer/sec:      1.13MB
"""


def run_bench(module: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))}
    proc = subprocess.run(
        [sys.executable, "-m", module, "--quick", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, f"{module} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "| bench | metric | measured | target | met |" in proc.stdout
    return proc.stdout


# ---------------------------------------------------------------- helpers


def test_wrk_report_is_read_with_units_and_errors() -> None:
    result = parse_wrk(WRK_OUTPUT)
    assert (result.requests, result.rps, result.seconds) == (78650, 7857.14, 10.01)
    assert (result.p50_ms, result.p99_ms) == (3.9, 0.85)
    assert result.errors == 4 + 3


def test_telegram_bodies_are_signed_json_with_distinct_update_ids_and_the_lua_script_builds_the_same() -> None:
    spec = telegram_load(start=100, chats=7)
    first, headers = spec.request(0)
    second, _ = spec.request(1)
    a, b = json.loads(first), json.loads(second)
    assert (a["update_id"], b["update_id"]) == (100, 101)
    assert a["message"]["chat"]["id"] == 1_000_000 + 100 % 7 == a["message"]["from"]["id"]
    assert 1300 <= len(first) <= 1500
    assert headers["X-Telegram-Bot-Api-Secret-Token"]
    lua = spec.lua()
    assert "counter = counter + 1" in lua and "local counter = 99" in lua
    assert lua.count("parts[") == len(spec.parts) and "chat" in lua


def test_webchat_bodies_rotate_tokens_and_client_ids() -> None:
    spec = webchat_load(["t1", "t2"], start=5)
    body, headers = spec.request(0)
    body2, headers2 = spec.request(1)
    assert json.loads(body)["client_id"] != json.loads(body2)["client_id"]
    assert {headers["Authorization"], headers2["Authorization"]} == {"Bearer t1", "Bearer t2"}


def test_peak_overlap_counts_runs_open_at_once() -> None:
    assert peak_overlap([(0, 2), (1, 3), (2.5, 4), (5, 6)]) == 2
    assert peak_overlap([(0, 1), (1, 2)]) == 1  # an end closes before a start at the same instant
    assert peak_overlap([]) == 0


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50, 99, 100)


# ---------------------------------------------------------------- each benchmark runs


def test_runtime_bench_runs() -> None:
    out = run_bench("bench.runtime")
    assert "runtime overhead per step" in out and "Monty program runs" in out


def test_parallel_reads_bench_runs() -> None:
    out = run_bench("bench.parallel_reads")
    assert "| sequential (`SWITCHBOARD_TOOLS__PARALLEL_READS=1`) |" in out and "| parallel (default bound 4) |" in out


def test_mcp_overhead_bench_runs() -> None:
    out = run_bench("bench.mcp_overhead")
    assert "| stdio |" in out and "| streamable HTTP |" in out and "MCP call, stdio: Switchboard ÷ SDK" in out


def test_memory_quality_bench_measures_recall_of_each_mode() -> None:
    out = run_bench("bench.memory_quality")
    assert "| queries | lexical recall@5 | vector recall@5 | hybrid recall@5 |" in out
    assert "| memory_quality | recall@5, hybrid (labelled set) |" in out


def test_recall_at_k_and_reciprocal_rank() -> None:
    from bench.memory_quality import load, recall_at, reciprocal_rank

    assert recall_at(["a", "b", "c", "d", "e", "f"], ["b", "f"]) == 0.5
    assert reciprocal_rank(["a", "b", "c"], ["c", "b"]) == 0.5 and reciprocal_rank(["a"], ["z"]) == 0.0
    facts, queries = load()
    assert len(facts) >= 60 and len(queries) >= 30 and {q["kind"] for q in queries} == {"words", "forms", "paraphrase"}


def test_footprint_bench_runs() -> None:
    out = run_bench("bench.footprint")
    assert "`switchboard run` in a fresh data dir" in out and "switchboard web (/healthz 200)" in out


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install -y wrk)")
def test_ingest_bench_runs() -> None:
    out = run_bench("bench.ingest")
    assert "switchboard web: Telegram webhook" in out and "python-telegram-bot run_webhook" in out


def test_capacity_bench_counts_the_pinned_commands_per_message() -> None:
    from tests.perf.test_command_counts import PINNED

    out = run_bench("bench.capacity")
    row = next(
        line for line in out.splitlines() if line.startswith("| capacity | commands per message (one at a time)")
    )
    measured = float(row.split("|")[3].replace(",", ""))
    # the same Telegram path as the pinned "plain" scenario, counted from INFO commandstats instead of MONITOR
    assert abs(measured - PINNED["plain"]["total"]) < 1.5, row
    assert "| one at a time |" in out and "| burst over 50 chats |" in out
    assert "commands per server CPU-second" in out


def test_ingest_cost_bench_counts_commands_and_bytes() -> None:
    out = run_bench("bench.ingest_cost")
    assert "| ingest_cost | Redis commands per message, web chat, limits on |" in out
    assert "web chat: " in out and "bytes of used_memory per message" in out


def test_whatsapp_ingest_bench_runs() -> None:
    out = run_bench("bench.whatsapp_ingest")
    assert "switchboard web: WhatsApp webhook" in out and "raw aiohttp hello-world (ceiling)" in out
    assert "| whatsapp_ingest | every acknowledged message stored | yes |" in out


def test_e2e_bench_runs() -> None:
    out = run_bench("bench.e2e")
    assert "End to end, medians" in out and "| missing / duplicate replies (all rounds) | 0 / 0 |" in out


def test_concurrency_bench_runs() -> None:
    out = run_bench("bench.concurrency")
    assert "Concurrency inside one worker" in out


def test_streams_bench_runs() -> None:
    out = run_bench("bench.streams")
    assert "open SSE streams on one process" in out and "baseline: raw aiohttp SSE server" in out
    assert "| streams | streams held open (of 200) | 200 |" in out


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install -y wrk)")
def test_sidebyside_bench_runs() -> None:
    out = run_bench("bench.sidebyside")
    assert "switchboard web (ours): Telegram webhook" in out and "python-telegram-bot run_webhook" in out
    assert "switchboard web (ours): Slack Events API" in out and "slack-bolt AsyncApp" in out
    assert "| sidebyside | Slack Events API (ours): baseline CPU ÷ ours, side by side |" in out


def test_sidebyside_whatsapp_bench_runs_against_raw_aiohttp() -> None:
    out = run_bench("bench.sidebyside", "--channel", "whatsapp")
    assert "switchboard web (ours): WhatsApp webhook" in out and "raw aiohttp handler" in out
    assert "| sidebyside | WhatsApp webhook (ours): baseline CPU ÷ ours, side by side |" in out


def test_schedules_bench_runs_and_every_occurrence_is_accepted() -> None:
    out = run_bench("bench.schedules")
    assert "Scheduling precision" in out and "baseline: sleep loop" in out
    assert "| switchboard (2 schedulers, poll 1 s) | 300/300 |" in out and "| 300/300 |" in out.split("sleep loop")[1]


def test_recall_bench_runs_both_stores_side_by_side() -> None:
    out = run_bench("bench.recall")
    assert "| SQLite |" in out and "facts/s" in out
    if importlib.util.find_spec("pgserver") is not None:
        assert "| PostgreSQL |" in out and "PostgreSQL / SQLite p50" in out
    for mode in ("lexical", "vector", "hybrid"):
        assert f"| {mode} |" in out
