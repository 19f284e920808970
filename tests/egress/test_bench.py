"""``python -m bench.egress --quick`` runs end to end (figures are not checked: tiny sizes say nothing)."""

from __future__ import annotations

from tests.test_bench_smoke import run_bench


def test_egress_bench_runs() -> None:
    out = run_bench("bench.egress")
    assert "| proxied https |" in out and "| direct http |" in out
    assert "| egress | https proxy CPU per request (µs) |" in out
