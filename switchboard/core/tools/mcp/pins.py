"""What the operator accepted of each MCP server: its identity and each tool's description and schema hash.

A tool whose description or input schema differs from what was accepted is disabled until accepted again (a server
that changes a tool after approval cannot slip new instructions or new arguments past the operator). The pins live
in one JSON file, rewritten whole (write then rename).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mcp import types

__all__ = ["PinStore", "PinnedTool", "ServerPins", "ToolStatus", "tool_sha256", "tool_status"]

ToolStatus = Literal["new", "accepted", "changed", "removed"]


def tool_sha256(tool: types.Tool) -> str:
    """The hash of what a model reads of a tool and how it is called: description and input schema."""
    body = json.dumps(
        {"name": tool.name, "description": tool.description or "", "input_schema": tool.input_schema},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class PinnedTool:
    """One accepted tool, as the model will see it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    sha256: str


@dataclass(frozen=True, slots=True)
class ServerPins:
    """One server's accepted identity and tools."""

    identity: str
    tools: dict[str, PinnedTool]


def tool_status(pins: ServerPins | None, tool: types.Tool) -> ToolStatus:
    """How an announced tool stands against the pins."""
    pinned = pins.tools.get(tool.name) if pins is not None else None
    if pinned is None:
        return "new"
    return "accepted" if pinned.sha256 == tool_sha256(tool) else "changed"


class PinStore:
    """The pins file (``<data dir>/mcp/pins.json``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> dict[str, Any]:
        try:
            loaded = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def server(self, name: str) -> ServerPins | None:
        """The pins of server ``name``, if any were accepted."""
        raw = self._load().get(name)
        if not isinstance(raw, dict):
            return None
        tools = {
            key: PinnedTool(key, str(value["description"]), dict(value["input_schema"]), str(value["sha256"]))
            for key, value in raw.get("tools", {}).items()
        }
        return ServerPins(identity=str(raw.get("identity", "")), tools=tools)

    def accept(self, name: str, identity: str, announced: Iterable[types.Tool], only: str | None = None) -> list[str]:
        """Pin the server's identity and its announced tools (or only the tool ``only``); the names pinned.

        Accepting under a new identity drops the tools pinned under the old one, except those accepted now.

        Raises:
            KeyError: ``only`` is not among the announced tools.
        """
        announced = list(announced)
        chosen = [t for t in announced if only is None or t.name == only]
        if only is not None and not chosen:
            raise KeyError(only)
        data = self._load()
        previous = data.get(name) if isinstance(data.get(name), dict) else None
        kept: dict[str, Any] = {}
        if previous is not None and previous.get("identity") == identity:
            kept = dict(previous.get("tools", {}))
        for tool in chosen:
            kept[tool.name] = {
                "description": tool.description or "",
                "input_schema": tool.input_schema,
                "sha256": tool_sha256(tool),
            }
        data[name] = {"identity": identity, "tools": kept}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(temporary, self.path)
        return [t.name for t in chosen]
