"""Run a Python callable in a child process with resource limits, and get its JSON result back.

Untrusted data is handled in a fresh interpreter (not a fork of the worker) that caps its own resources before it
reads a byte of input. The parent reads a bounded answer and kills the whole process group at the deadline, on
overflow or on cancellation: no child outlives its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import signal
import sys
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["SandboxLimits", "SandboxResult", "Status", "run_callable"]

logger = logging.getLogger(__name__)

Status = Literal["ok", "error", "timeout", "memory", "cpu", "output", "crashed"]
"""How a child ended: its function returned (``ok``) or raised (``error``), or a limit stopped it."""

_MEMORY_EXIT = 86
"""Exit status of a child whose function ran out of memory (``MemoryError`` under ``RLIMIT_AS``)."""
_ENV_KEPT = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")
"""Environment variables a child inherits; everything else (credentials included) is dropped."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits of one child process."""

    memory_bytes: int = 512 * 2**20
    """Address-space cap (``RLIMIT_AS``): allocations past it raise ``MemoryError`` in the child."""
    wall_s: float = 20.0
    """Deadline; the process group is killed when it passes."""
    cpu_s: int | None = None
    """CPU seconds (``RLIMIT_CPU``); default: the wall deadline rounded up, plus one."""
    file_bytes: int = 0
    """Largest file the child may write (``RLIMIT_FSIZE``); 0: none at all."""
    open_files: int = 64
    """``RLIMIT_NOFILE``."""
    processes: int | None = None
    """``RLIMIT_NPROC`` (counted per user, so only safe under a dedicated uid); ``None`` leaves it alone."""
    output_bytes: int = 8 * 2**20
    """Most of the child's stdout read; more kills it."""


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What a child produced."""

    status: Status
    value: Any = None
    """The function's return value (``status == "ok"``)."""
    error: str = ""
    """What went wrong, in words fit for the model (never a host path from the parent's side)."""
    error_type: str = ""
    """The exception class the function raised (``status == "error"``)."""


def _child_env() -> dict[str, str]:
    env = {name: os.environ[name] for name in _ENV_KEPT if name in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    env.setdefault("LC_ALL", "C.UTF-8")
    return env


async def _read_capped(stream: asyncio.StreamReader, cap: int, proc: asyncio.subprocess.Process) -> tuple[bytes, bool]:
    """Up to ``cap`` bytes of ``stream`` and whether it held more (then the child is killed at once)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return b"".join(chunks), False
        size += len(chunk)
        if size > cap:
            _kill_group(proc)
            return b"".join(chunks), True
        chunks.append(chunk)


async def _feed(stdin: asyncio.StreamWriter, payload: bytes) -> None:
    try:
        stdin.write(payload)
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):  # the child died before reading it all: its status says why
        pass


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


async def run_callable(target: str, args: Any, limits: SandboxLimits, *, cwd: str | None = None) -> SandboxResult:
    """Call ``target`` (``"package.module:function"``) with ``args`` in a limited child process.

    The function receives ``args`` (JSON-decoded) as its one argument and must return JSON-able data.
    Cancelling the awaiting task kills the child.
    """
    cpu_s = limits.cpu_s if limits.cpu_s is not None else int(limits.wall_s) + 1
    argv = [
        sys.executable,
        "-s",
        "-m",
        __name__,
        str(limits.memory_bytes),
        str(cpu_s),
        str(limits.file_bytes),
        str(limits.open_files),
        str(limits.processes if limits.processes is not None else -1),
    ]
    payload = json.dumps({"target": target, "args": args}).encode()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env=_child_env(),
        cwd=cwd,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    overflow = False
    out = b""
    err = b""
    try:
        async with asyncio.timeout(limits.wall_s):
            (out, overflow), (err, _), _ = await asyncio.gather(
                _read_capped(proc.stdout, limits.output_bytes, proc),
                _read_capped(proc.stderr, 65536, proc),
                _feed(proc.stdin, payload),
            )
            await proc.wait()
    except TimeoutError:
        _kill_group(proc)
        await proc.wait()
        return SandboxResult("timeout", error=f"it did not finish within {limits.wall_s:g}s")
    finally:
        _kill_group(proc)
        if proc.returncode is None:
            await asyncio.shield(proc.wait())
    return _result(proc.returncode, out, err, overflow, limits, cpu_s)


def _result(
    code: int | None, out: bytes, err: bytes, overflow: bool, limits: SandboxLimits, cpu_s: int
) -> SandboxResult:
    if overflow:
        return SandboxResult("output", error=f"its output passed {limits.output_bytes} bytes")
    if code == _MEMORY_EXIT:
        return SandboxResult("memory", error=f"it needed more than {limits.memory_bytes // 2**20} MiB of memory")
    if code in (-signal.SIGXCPU, -signal.SIGKILL):  # past RLIMIT_CPU's soft, then its hard limit
        return SandboxResult("cpu", error=f"it used more than {cpu_s}s of CPU time")
    if code == 0:
        try:
            reply = json.loads(out)
        except ValueError:
            reply = None
        if isinstance(reply, dict) and reply.get("ok") is True:
            return SandboxResult("ok", value=reply.get("value"))
        if isinstance(reply, dict) and reply.get("ok") is False:
            return SandboxResult("error", error=str(reply.get("error", "")), error_type=str(reply.get("type", "")))
    logger.debug("sandbox child ended with status %s: %s", code, err[-2000:].decode("utf-8", "replace"))
    return SandboxResult("crashed", error=f"the reader stopped unexpectedly (exit status {code})")


# ---------------------------------------------------------------- the child side


def _limit_self(memory: int, cpu: int, fsize: int, nofile: int, nproc: int) -> None:
    def cap(which: int, value: int, hard_extra: int = 0) -> None:
        _soft, hard = resource.getrlimit(which)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (soft, soft + hard_extra if hard == resource.RLIM_INFINITY else hard))

    cap(resource.RLIMIT_AS, memory)
    cap(resource.RLIMIT_CPU, cpu, hard_extra=1)  # SIGXCPU at the soft limit, SIGKILL a second later
    cap(resource.RLIMIT_FSIZE, fsize)
    cap(resource.RLIMIT_NOFILE, nofile)
    cap(resource.RLIMIT_CORE, 0)
    if nproc >= 0:
        cap(resource.RLIMIT_NPROC, nproc)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write raises OSError instead of killing


def _child_main(argv: list[str]) -> int:
    memory, cpu, fsize, nofile, nproc = (int(v) for v in argv[:5])
    _limit_self(memory, cpu, fsize, nofile, nproc)
    import importlib

    try:
        request = json.loads(sys.stdin.buffer.read())
        module_name, _, function_name = str(request["target"]).partition(":")
        function = getattr(importlib.import_module(module_name), function_name)
        value = function(request["args"])
        reply = json.dumps({"ok": True, "value": value}, ensure_ascii=False, default=str)
    except MemoryError:
        return _MEMORY_EXIT
    except Exception as exc:  # the function's failure is the parent's answer, not a crash
        try:
            reply = json.dumps({"ok": False, "error": str(exc)[:2000], "type": type(exc).__name__})
        except MemoryError:
            return _MEMORY_EXIT
    sys.stdout.write(reply)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover - runs in the child
    sys.exit(_child_main(sys.argv[1:]))
