"""The sandbox benchmark runs (its figures are printed, not asserted)."""

from __future__ import annotations

import pytest

from bench import sandbox as bench_sandbox
from switchboard.sandbox.runner import Sandbox


async def test_the_sandbox_bench_runs(bwrap: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    rows = await bench_sandbox.run(["--quick"])
    out = capsys.readouterr().out
    assert "Sandbox start to first output" in out and "bwrap+seccomp" in out
    assert [row.met for row in rows] == [None] * len(rows)  # a quick run passes no verdicts
