"""Worker pools running ``python -m tests.chaos.toolworker`` (the real worker plus the test tools), and helpers.

:class:`ToolWorkerPool` is :class:`~tests.chaos.harness.WorkerPool` with that command; the ``tool_pools`` fixture
starts them and kills every process at teardown, as the ``pools`` fixture does for plain workers.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from .harness import ROOT, WorkerPool, _die_with_parent, _Slot

__all__ = ["ToolWorkerPool", "agent_yaml", "tool_env", "tool_pools"]


class ToolWorkerPool(WorkerPool):
    """Workers with the test tools of :mod:`tests.chaos.toolworker`."""

    def _spawn(self, slot: _Slot) -> None:
        slot.generation += 1
        slot.worker_id = None
        slot.stopped = False
        with slot.log.open("ab") as log:
            log.write(f"--- start {slot.generation} at {time.time():.3f}\n".encode())
            log.flush()
            slot.process = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.toolworker"],
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )


def agent_yaml(tools: list[str], *, codeact: bool = False, policy: str = "", extra: str = "") -> str:
    """A whole config file: one agent ``assistant`` with ``tools`` (and a ``policy`` block, YAML, indented 4)."""
    lines = [
        "default_agent: assistant",
        "agents:",
        "  assistant:",
        "    profile: {name: Assistant}",
        "    instructions: You are a test assistant.",
        f"    tools: [{', '.join(tools)}]",
        f"    codeact: {'true' if codeact else 'false'}",
        "    limits: {max_steps: 8, deadline_s: 60, max_tool_calls: 16}",
    ]
    if policy:
        lines += ["    policy:", *("      " + line for line in policy.strip("\n").splitlines())]
    return "\n".join(lines) + "\n" + extra


def tool_env(env: dict[str, str], config: str, tmp_path: Path, **settings: str) -> dict[str, str]:
    """``env`` (from ``chaos_env``) with its YAML replaced by ``config`` plus the unpaced Telegram block, and
    ``SWITCHBOARD_<name>=value`` for each of ``settings``."""
    from .harness import UNPACED

    path = tmp_path / "switchboard-tools.yaml"
    path.write_text(config + UNPACED)
    return env | {"SWITCHBOARD_CONFIG": str(path)} | {f"SWITCHBOARD_{k}": v for k, v in settings.items()}


@pytest.fixture
async def tool_pools(tmp_path: Path) -> AsyncIterator[Callable[[dict[str, str], int], ToolWorkerPool]]:
    """Start pools of tool workers; every process is killed at teardown, whatever happened."""
    started: list[ToolWorkerPool] = []

    def start(env: dict[str, str], count: int) -> ToolWorkerPool:
        pool = ToolWorkerPool(env, count, tmp_path / f"tool-logs-{len(started)}")
        started.append(pool)
        pool.start()
        return pool

    yield start
    for pool in started:
        await pool.close()
