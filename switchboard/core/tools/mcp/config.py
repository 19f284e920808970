"""The ``mcp_servers`` block of the YAML file and an agent's ``mcp`` list.

A server is reached over stdio (a host process the worker starts, or a process in the session's sandbox) or
streamable HTTP. Its identity (the command and
the digest of its program, or its URL) is pinned when the operator accepts its tools; see :mod:`.pins`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

__all__ = [
    "SECRET_PLACEHOLDER",
    "SERVER_NAME_PATTERN",
    "TOOL_NAME_PATTERN",
    "AgentMcp",
    "HttpServer",
    "McpServer",
    "StdioServer",
    "file_sha256",
    "identity",
    "program_file",
    "tool_name",
]

SERVER_NAME_PATTERN = r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$"
"""Server names never hold ``__``, so ``<server>__<tool>`` splits one way."""

TOOL_NAME_PATTERN = r"^[A-Za-z0-9]+(_[A-Za-z0-9]+)*$"
"""Announced tool names the gateway takes (others are listed but never offered)."""

SECRET_PLACEHOLDER = re.compile(r"\{\{\s*secret:([A-Za-z0-9_]{1,64})\s*\}\}")
"""``{{secret:NAME}}`` in a stdio server's ``env``: the egress secret ``NAME``'s value, filled in at start."""


class StdioServer(BaseModel):
    """A server the worker starts as a host process and speaks to over its stdin and stdout."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["stdio"]
    command: list[str] = Field(min_length=1)
    """The program and its arguments (``[python, server.py]``)."""
    digest: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    """SHA-256 of :attr:`digest_file`: the server is not started when the file's digest differs."""
    digest_file: str | None = None
    """The file the digest covers (a script); default: the program, ``command[0]`` as found on ``PATH``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set for the process besides a minimal default environment (never the worker's own). A
    ``{{secret:NAME}}`` placeholder in a value is replaced by the egress secret ``NAME`` when the process starts
    (``SWITCHBOARD_EGRESS__SECRETS__<NAME>__VALUE``): the value is in no file, command line or log."""
    cwd: str | None = None
    sandbox: bool = False
    """Run one process per agent and session in the session's sandbox (the ``shell`` tool's, bubblewrap only), over
    its workspace, with the agent's egress allowlist as its only network; refused where the host has no such
    sandbox. ``False``: one host process per worker."""
    timeout_s: float = Field(30.0, gt=0, le=600)
    """Per call."""
    connect_timeout_s: float = Field(30.0, gt=0, le=600)
    """Starting the process and the protocol's handshake."""
    reads: list[str] = Field(default_factory=list)
    """Tools the operator declares reads; every other tool is an irreversible write that policy gates."""

    @model_validator(mode="after")
    def _sandbox_has_no_cwd(self) -> StdioServer:
        if self.sandbox and self.cwd is not None:
            raise ValueError("cwd: a sandboxed server runs in the session's workspace; leave cwd out")
        return self


class HttpServer(BaseModel):
    """A server reached over streamable HTTP, after the egress address checks."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["http"]
    url: str = Field(pattern=r"^https?://[^/\s]+(/\S*)?$")
    timeout_s: float = Field(30.0, gt=0, le=600)
    """Per call."""
    connect_timeout_s: float = Field(30.0, gt=0, le=600)
    """Connecting and the protocol's handshake."""
    reads: list[str] = Field(default_factory=list)


McpServer = Annotated[StdioServer | HttpServer, Field(discriminator="transport")]


def _server_only(value: Any) -> Any:
    return {"server": value} if isinstance(value, str) else value


class _AgentMcp(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: str = Field(pattern=SERVER_NAME_PATTERN)
    tools: list[str] | None = None
    """The allowlist: announced tools this agent may call (``None``: every tool the operator accepted)."""


AgentMcp = Annotated[_AgentMcp, BeforeValidator(_server_only)]
"""One entry of an agent's ``mcp`` list: a server name, or ``{server, tools}``."""


def tool_name(server: str, tool: str) -> str:
    """The gateway's name for one MCP tool: ``<server>__<tool>``."""
    return f"{server}__{tool}"


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def program_file(server: StdioServer) -> str | None:
    """The file a stdio server's digest covers, if it exists."""
    found = server.digest_file or shutil.which(server.command[0])
    return found if found and Path(found).is_file() else None


def identity(server: StdioServer | HttpServer) -> str:
    """What the operator's acceptance pins about the server itself: command, digest and sandbox, or URL."""
    if isinstance(server, StdioServer):
        found = program_file(server)
        pinned: dict[str, Any] = {"command": server.command, "sha256": file_sha256(found) if found else None}
        if server.sandbox:  # taking a server out of its sandbox needs accepting it again
            pinned["sandbox"] = True
        return "stdio:" + json.dumps(pinned, sort_keys=True)
    return f"http:{server.url}"
