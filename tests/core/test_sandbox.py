"""The sandbox child runner: limits hold, the deadline kills the whole process group, nothing secret leaks in."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from switchboard.core.tools.child import SandboxLimits, run_callable

HERE = __name__


# ---------------------------------------------------------------- functions the child runs


def echo(args: Any) -> Any:
    return {"got": args, "cwd": os.getcwd()}


def fail(args: Any) -> Any:
    raise ValueError(f"bad input {args}")


def allocate(args: Any) -> Any:
    return len(bytearray(int(args)))


def spin(args: Any) -> Any:
    while True:
        pass


def shout(args: Any) -> Any:
    return "x" * int(args)


def environment(args: Any) -> Any:
    return dict(os.environ)


def spawn_and_sleep(args: Any) -> Any:
    helper = subprocess.Popen(["sleep", "60"])
    Path(args).write_text(f"{os.getpid()} {helper.pid}")
    time.sleep(60)


def write_file(args: Any) -> Any:
    Path(args).write_bytes(b"y" * 10_000)
    return "written"


# ---------------------------------------------------------------- tests


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def killed(*pids: int) -> bool:
    """Whether every process is gone: SIGKILL to the group is delivered at once, but a busy machine may take a
    moment to schedule a member's exit, so this waits (up to 10 s) rather than reading one instant."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):
            while any(alive(pid) for pid in pids):
                await asyncio.sleep(0.05)
    return not any(alive(pid) for pid in pids)


async def test_a_function_runs_in_the_child_and_its_value_comes_back(tmp_path: Path) -> None:
    result = await run_callable(f"{HERE}:echo", {"a": [1, 2]}, SandboxLimits(), cwd=str(tmp_path))
    assert result.status == "ok" and result.value == {"got": {"a": [1, 2]}, "cwd": str(tmp_path)}
    failed = await run_callable(f"{HERE}:fail", 7, SandboxLimits())
    assert (failed.status, failed.error, failed.error_type) == ("error", "bad input 7", "ValueError")


async def test_memory_past_the_limit_is_a_memory_status_not_a_crash() -> None:
    result = await run_callable(f"{HERE}:allocate", 400 * 2**20, SandboxLimits(memory_bytes=200 * 2**20))
    assert result.status == "memory" and "200 MiB" in result.error
    fits = await run_callable(f"{HERE}:allocate", 10 * 2**20, SandboxLimits(memory_bytes=200 * 2**20))
    assert fits.status == "ok" and fits.value == 10 * 2**20


async def test_cpu_time_is_capped() -> None:
    result = await run_callable(f"{HERE}:spin", None, SandboxLimits(cpu_s=1, wall_s=30))
    assert result.status == "cpu"


async def test_output_past_the_cap_kills_the_child() -> None:
    # a generous deadline: a loaded machine can take seconds to start the child, and the cap, not time, must stop it
    result = await run_callable(f"{HERE}:shout", 5_000_000, SandboxLimits(output_bytes=100_000, wall_s=120))
    assert result.status == "output"


async def test_the_deadline_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    limits = SandboxLimits(wall_s=3.0, file_bytes=1000)
    task = asyncio.create_task(run_callable(f"{HERE}:spawn_and_sleep", str(pids), limits))
    result = await task
    assert result.status == "timeout"
    child, helper = (int(p) for p in pids.read_text().split())
    assert await killed(child, helper)


async def test_cancelling_the_call_kills_the_child(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    task = asyncio.create_task(
        run_callable(f"{HERE}:spawn_and_sleep", str(pids), SandboxLimits(wall_s=60, file_bytes=1000))
    )
    async with asyncio.timeout(30):
        while not pids.exists() or not pids.read_text():
            await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    child, helper = (int(p) for p in pids.read_text().split())
    assert await killed(child, helper)


async def test_the_child_gets_no_credentials_and_writes_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("SWITCHBOARD_TELEGRAM__BOT_TOKEN", "123:secret")
    env = await run_callable(f"{HERE}:environment", None, SandboxLimits())
    assert env.status == "ok"
    assert not [k for k in env.value if "KEY" in k or "TOKEN" in k or k.startswith("SWITCHBOARD")]
    written = await run_callable(f"{HERE}:write_file", str(tmp_path / "out.bin"), SandboxLimits())
    assert written.status == "error" and "File too large" in written.error
