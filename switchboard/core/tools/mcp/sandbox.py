"""Stdio MCP servers in the session's sandbox (``sandbox: true``): one process per server, agent and session.

The server starts under the bubblewrap sandbox the ``shell`` tool uses, over the session's workspace (``/workspace``
inside), with the sandbox's own environment and the server's ``env`` (never the worker's), and the network of a
``shell`` command: none, or the egress proxy with a grant for the agent's allowlist, held while the process lives.
Its program file and the files its command names, when they lie outside what the sandbox shows anyway (the system
and the Python environment), are bound read-only at their own paths. A host that cannot run it so refuses it: it is
never started unsandboxed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.shared.message import SessionMessage

from switchboard.core.tools.mcp.config import StdioServer, program_file
from switchboard.sandbox.bwrap import python_prefixes
from switchboard.sandbox.runner import GRANT_SHOWN_AS, EgressAccess, Sandbox

__all__ = ["Scope", "sandboxed_command", "sandboxed_stdio"]

logger = logging.getLogger(__name__)

_SHOWN = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Trees every sandbox shows read-only (besides the Python prefixes): a program there needs no bind of its own."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Whom a sandboxed server serves: its process belongs to one agent's session and works in its workspace."""

    agent: str
    """Whose egress allowlist its network follows (empty: no network)."""
    session: str
    workspace: Path


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def sandboxed_command(server: StdioServer) -> tuple[list[str], list[str]]:
    """The command as the sandbox runs it, and the bubblewrap options binding its files read-only.

    The files are the program (the digest's file, or ``command[0]`` as found on ``PATH``) and every argument that
    names an existing file: each is bound read-only at its real path, and named by that path in the command (the
    configuration often names them relative to the worker's directory). Files under what every sandbox shows
    anyway (the system, the Python environment) are left as they are.
    """
    shown = [*_SHOWN, *python_prefixes()]
    command = list(server.command)
    binds: list[str] = []
    found = program_file(server)
    if found is not None and server.digest_file is None and not _inside(os.path.realpath(found), shown):
        command[0] = found  # the program as found on the worker's PATH, which the sandbox does not have
    for index, arg in enumerate(command):
        if not os.path.isfile(arg):
            continue
        real = os.path.realpath(arg)
        if _inside(real, shown):
            continue
        command[index] = real
        if real not in binds:
            binds += ["--ro-bind", real, real]
    if found is not None and (real := os.path.realpath(found)) not in binds and not _inside(real, shown):
        binds += ["--ro-bind", real, real]
    return command, binds


@contextlib.asynccontextmanager
async def sandboxed_stdio(
    sandbox: Sandbox,
    server: StdioServer,
    workspace: Path,
    *,
    egress: EgressAccess | None,
    errlog: TextIO,
) -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """The MCP streams of ``server`` started in ``sandbox`` over ``workspace``; the process is killed at the end.

    Its stderr goes to ``errlog`` with the egress grant's token hidden.

    Raises:
        ValueError: the sandbox cannot hold a long-lived program.
        OSError: it could not be started.
    """
    command, binds = sandboxed_command(server)
    read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)
    hide = egress.token if egress is not None else ""
    async with sandbox.program(command, workspace, egress=egress, env=server.env, binds=binds) as process:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        stdin, stdout, stderr = process.stdin, process.stdout, process.stderr

        async def reader() -> None:
            async with read_in:
                while line := await stdout.readline():
                    try:
                        message: SessionMessage | Exception = SessionMessage(
                            types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        )
                    except ValueError as exc:
                        message = exc
                    try:
                        await read_in.send(message)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return

        async def writer() -> None:
            try:
                async with write_out:
                    async for message in write_out:
                        body = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                        stdin.write(body.encode() + b"\n")
                        await stdin.drain()
            except (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError):
                await read_in.aclose()  # the session sees the end, no request hangs

        async def errors() -> None:
            while line := await stderr.readline():
                text = line.decode(errors="replace")
                errlog.write(text.replace(hide, GRANT_SHOWN_AS) if hide else text)

        async with anyio.create_task_group() as group:
            group.start_soon(reader)
            group.start_soon(writer)
            group.start_soon(errors)
            try:
                yield read_out, write_in
            finally:
                stdin.close()  # a server reading stdin ends here; the sandbox is killed after anyway
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(process.wait()), 2.0)
                group.cancel_scope.cancel()
                await write_in.aclose()
                await read_out.aclose()
