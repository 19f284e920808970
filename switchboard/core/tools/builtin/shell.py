"""``shell``: run commands in a fresh sandbox over the session workspace (the Responses API's shell tool, locally).

Arguments and result are those of OpenAI's hosted shell tool, so models trained on it drive this one unchanged. The
result names the isolation that applied; a long call shows the user one status message kept up to date
(:mod:`switchboard.core.tools.builtin.progress`). Network is none unless the worker runs an egress proxy: then each
call gets a grant for its agent's allowlist, revoked when the call ends and shown as ``<egress-grant>`` wherever a
command prints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.events import SandboxUsed
from switchboard.core.tools.builtin.progress import Progress, ProgressOptions
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.workspaces.disk import Snapshot, Workspaces, make_private_dir
from switchboard.errors import ToolError
from switchboard.sandbox.runner import CommandResult, EgressAccess, Sandbox

__all__ = [
    "MAX_COMMANDS",
    "PROXIED",
    "EgressGate",
    "SandboxSource",
    "ShellInput",
    "ShellOptions",
    "detect_on_first_use",
    "shell_tools",
]

MAX_COMMANDS = 16
"""Most commands one call may run."""

SandboxSource = Callable[[], Awaitable[Sandbox | None]]
"""Where the tool finds its sandbox: a fixed one, or detection on first use."""

PROXIED = "HTTP(S) through the egress proxy: only the hosts allowlisted for this agent"
"""The result's ``network`` when the commands could reach the egress proxy."""

WATCH_S = 0.1
"""How often the workspace is measured while commands run (less often where one measurement takes long)."""


class EgressGate(Protocol):
    """The worker's egress proxy, as one ``shell`` call sees it (:class:`switchboard.egress.gate.SandboxEgress`)."""

    def access(self, agent: str, session: str) -> contextlib.AbstractAsyncContextManager[EgressAccess | str]:
        """The call's way out (a grant, revoked when the block ends), or why it has no network."""
        ...

    def reaches(self, agent: str) -> bool:
        """Whether ``agent``'s commands get a way out at all (an allowlist, and a proxy the sandbox can reach)."""
        ...


@dataclass(frozen=True, slots=True)
class ShellOptions:
    """How the tool treats the model's arguments (``SWITCHBOARD_SANDBOX__*``)."""

    default_timeout_s: float = 60.0
    max_timeout_s: float = 600.0
    """The gateway's deadline for the call is this plus a margin (the sandbox caps each command at it)."""
    max_output_chars: int = 20_000
    """Default and largest ``max_output_length``."""
    progress_after_s: float = 5.0
    """A call running longer than this shows its progress to the user (0: never)."""
    progress_every_s: float = 5.0
    """How often the status message is updated where the channel edits (the chat's edit budget may skip one)."""
    progress_notices: int = 2
    """Most progress messages of one call where the channel cannot edit."""

    @property
    def progress(self) -> ProgressOptions:
        """The progress policy these options ask for."""
        return ProgressOptions(self.progress_after_s, self.progress_every_s, self.progress_notices)


class ShellInput(BaseModel):
    """Arguments of ``shell`` (those of the Responses API's shell tool)."""

    model_config = ConfigDict(extra="forbid")

    commands: list[str] = Field(
        min_length=1,
        max_length=MAX_COMMANDS,
        description="Shell commands to run, each in its own fresh sandbox, concurrently. The working directory "
        "is your workspace (/workspace); /tmp is private; the network is reachable only as the tool's description "
        "says.",
    )
    timeout_ms: int | None = Field(None, ge=100, description="Deadline of each command in milliseconds.")
    max_output_length: int | None = Field(
        None, ge=100, description="Characters kept of each command's stdout and of its stderr (head and tail)."
    )


_DETECTED: list[Sandbox | None] = []


async def detect_on_first_use() -> Sandbox | None:
    """The strongest sandbox of this host under the default limits, detected once (never the weak floor)."""
    if not _DETECTED:
        from switchboard.sandbox.detect import choose

        found = (await choose()).sandbox
        if not _DETECTED:
            _DETECTED.append(found)
    return _DETECTED[0]


def _shown(command: str) -> str:
    """One line of ``command`` for the status message (no backticks: it is shown as code)."""
    line = " ".join(command.replace("`", "'").split())
    return line if len(line) <= 60 else line[:59] + "…"


def _outcome(done: CommandResult) -> str:
    return "timed out" if done.timed_out else f"exit {done.exit_code}"


def _access(
    egress: EgressGate | None, box: Sandbox, ctx: ToolContext
) -> contextlib.AbstractAsyncContextManager[EgressAccess | str | None]:
    """The call's way out through ``egress`` (``None``: the worker has no proxy; a string: why there is none)."""
    if egress is None:
        return contextlib.nullcontext(None)
    if box.kind != "bwrap":
        return contextlib.nullcontext(f"none: a {box.label} sandbox cannot reach the egress proxy")
    if not ctx.agent:
        return contextlib.nullcontext("none: the call serves no agent")
    return egress.access(ctx.agent, ctx.session_key)


async def _watch(workspace: Path, before: Snapshot, stop: asyncio.Event) -> None:
    """Set ``stop`` as soon as the workspace holds more than ``before`` says it may.

    A measurement walks the workspace: the pause after one is at least ten times what it took (and
    :data:`WATCH_S`), so a workspace of many files costs at most a tenth of a thread while commands run. In the
    pause the file system's used space is read every :data:`WATCH_S` / 4 (one ``statvfs``): when it grew by more
    than the workspace has left, the next walk comes at once.
    """
    while True:
        started = time.monotonic()
        used, entries = await asyncio.to_thread(Workspaces.usage, workspace)
        if before.exceeded(used, entries):
            stop.set()
            return
        left = max(before.most_bytes, before.used) - used
        disk = await asyncio.to_thread(_disk_used, workspace)
        until = time.monotonic() + max(WATCH_S, 10 * (time.monotonic() - started))
        while time.monotonic() < until:
            await asyncio.sleep(WATCH_S / 4)
            if await asyncio.to_thread(_disk_used, workspace) - disk > left:
                break


def _disk_used(path: Path) -> int:
    """Bytes in use on the file system holding ``path`` (``0`` if it cannot be read)."""
    try:
        found = os.statvfs(path)
    except OSError:
        return 0
    return (found.f_blocks - found.f_bfree) * found.f_frsize


def _entry(done: CommandResult) -> dict[str, Any]:
    return {"stdout": done.stdout, "stderr": done.stderr, "outcome": done.outcome()}


_NO_NETWORK = " There is no network."
_PROXY_NOTE = (
    " HTTP(S) goes through a proxy (already set in HTTP_PROXY/HTTPS_PROXY; curl, python and pip use it) that "
    "allows only the hosts your operator allowlisted; other hosts are refused with 403. Where a request needs a "
    "credential, write the placeholder {{secret:NAME}} in a header (e.g. -H 'Authorization: Bearer "
    "{{secret:NAME}}'): the proxy puts the real value in, for that secret's hosts only. The result's network "
    "field says what this call had."
)


def shell_tools(
    source: Sandbox | SandboxSource, options: ShellOptions | None = None, egress: EgressGate | None = None
) -> list[Tool]:
    """The ``shell`` tool over ``source`` (the worker passes the sandbox it chose at start-up).

    ``egress``: the worker's egress proxy; ``None``: commands have no network.
    """
    options = options or ShellOptions()

    async def sandbox() -> Sandbox | None:
        return source if isinstance(source, Sandbox) else await source()

    async def shell(args: ShellInput, ctx: ToolContext) -> dict[str, Any]:
        box = await sandbox()
        if box is None:
            raise ToolError("the shell is not available on this host (no sandbox)", error_class="permanent")
        workspace = make_private_dir(ctx.workspace)
        timeout_s = args.timeout_ms / 1000 if args.timeout_ms is not None else options.default_timeout_s
        limit = min(args.max_output_length or options.max_output_chars, options.max_output_chars)
        started = time.monotonic()
        status = ctx.status.open(f"status:{ctx.idempotency_key}") if ctx.status is not None else None
        progress = Progress(status, [_shown(c) for c in args.commands], options.progress)
        network: str | None = None
        spaces = ctx.workspaces or Workspaces(None)
        before = await asyncio.to_thread(spaces.snapshot, workspace)  # what the commands write may be taken back
        # over a quota already: the commands may write no file (only read and delete), and what they add goes
        file_bytes = 0 if before.over is not None else None
        stop = asyncio.Event()  # set by the watch when the commands write past the quotas: they are killed
        watch = asyncio.create_task(_watch(workspace, before, stop))

        async def run(index: int, command: str, way_out: EgressAccess | None) -> CommandResult:
            done = await box.run(
                command,
                workspace,
                timeout_s=timeout_s,
                max_output=limit,
                egress=way_out,
                stop=stop,
                file_bytes=file_bytes,
            )
            progress.finished(index, _outcome(done))
            return done

        try:
            # the status message takes its final state when the block ends, however it ends
            async with progress:
                async with _access(egress, box, ctx) as access:  # the grant is revoked here, however the call ends
                    way_out = access if isinstance(access, EgressAccess) else None
                    network = None if egress is None else PROXIED if way_out is not None else str(access)
                    results = await asyncio.gather(*(run(i, c, way_out) for i, c in enumerate(args.commands)))
                progress.end("timed_out" if any(r.timed_out for r in results) else "done")
        finally:
            watch.cancel()
            await asyncio.wait([watch])
            over_quota = await asyncio.to_thread(spaces.settle, workspace, before, stopped=stop.is_set())
        if ctx.record is not None:
            await ctx.record(
                SandboxUsed(
                    isolation=box.label,
                    commands=len(results),
                    timed_out=sum(r.timed_out for r in results),
                    duration_ms=round((time.monotonic() - started) * 1000, 3),
                )
            )
        result: dict[str, Any] = {
            "output": [_entry(r) for r in results],
            "max_output_length": limit,
            "isolation": box.label,
        }
        if network is not None:
            result["network"] = network
        if over_quota is not None:
            result["error"] = over_quota
        return result

    def networked(network: bool) -> Tool:
        return Tool(
            name="shell",
            description="Run shell commands (coreutils, grep, sed, awk, curl, python3 with data libraries, sqlite3) "
            "in a fresh sandbox over your workspace; several commands run concurrently. Each result has stdout, "
            "stderr and an outcome (exit code, or timeout). Files you write in the working directory stay in the "
            "workspace." + (_PROXY_NOTE if network else _NO_NETWORK),
            input=ShellInput,
            fn=shell,
            side_effect="write",
            # Without network a command's effects stay in the session's own workspace: low risk, so untrusted
            # content in the turn (a document, an earlier command's output) does not gate the next command. With
            # the egress proxy it can reach the agent's allowlisted hosts with their secrets: gated like a send.
            risk="medium" if network else "low",
            reversible=True,  # the workspace is the session's; an operator gates network use with a policy rule
            resources=lambda args: tuple(f"command: {command[:200]}" for command in args.commands),
            timeout_s=options.max_timeout_s + 30.0,
            cost=5,
            connector="sandbox",
            retry_on=frozenset(),
            output_trust="data",
            per_agent=None if egress is None else of_agent,
        )

    variants: dict[bool, Tool] = {}

    def of_agent(agent: str) -> Tool:
        """The tool as ``agent`` has it: network (and its risk) only when that agent's own commands get a way out."""
        network = egress is not None and egress.reaches(agent)
        if network not in variants:
            variants[network] = networked(network)
        return variants[network]

    return [networked(egress is not None)]  # the tool for a call serving no agent: the worker's proxy counts
