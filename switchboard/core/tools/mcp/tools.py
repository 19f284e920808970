"""MCP tools as gateway tools: each accepted tool of a configured server becomes ``<server>__<tool>``.

The model sees the description and input schema the operator accepted, the description as a data block (a server's
text, never instructions). Before each call the tool is checked against what the server announces now: a changed
description or schema, or a changed server identity, disables it until accepted again. Arguments are validated
against the accepted JSON Schema by the gateway; results are untrusted data.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from mcp import types
from pydantic import BaseModel, ConfigDict, model_validator

from switchboard.core.model import data_block
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.mcp.client import McpClients, Scope
from switchboard.core.tools.mcp.config import TOOL_NAME_PATTERN, McpServer, identity, tool_name
from switchboard.core.tools.mcp.pins import PinnedTool, PinStore, tool_sha256
from switchboard.errors import ToolError
from switchboard.sandbox.runner import GRANT_SHOWN_AS

__all__ = ["mcp_tools", "result_value", "schema_input"]

logger = logging.getLogger(__name__)

_MAX_ERRORS = 3


def schema_input(name: str, schema: Mapping[str, Any], *, source: str | None = None) -> type[BaseModel]:
    """An input model that validates arguments against ``schema`` (JSON Schema 2020-12) and reports it as its own.

    ``source``: whose text the schema is: then every ``description`` in the schema the model is shown is a data block
    of that source (a server may hide an instruction in an argument's description as well as in the tool's).

    Raises:
        ValueError: ``schema`` is not a valid JSON Schema of an object.
    """
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as err:
        raise ValueError(f"{name}: invalid input schema: {err.message}") from None
    if schema.get("type", "object") != "object":
        raise ValueError(f"{name}: the input schema is not an object")
    if any(not ref.startswith("#") for ref in _refs(schema)):
        raise ValueError(f"{name}: the input schema refers to another document (only local $ref is followed)")
    checker = Draft202012Validator(schema)
    announced = copy.deepcopy(dict(schema))
    if source is not None:
        announced = _wrapped(announced, source)

    class SchemaInput(BaseModel):
        model_config = ConfigDict(extra="allow")
        json_schema: ClassVar[dict[str, Any]] = announced

        @model_validator(mode="before")
        @classmethod
        def _conforms(cls, data: Any) -> Any:
            try:
                errors = sorted(checker.iter_errors(data), key=lambda e: list(e.absolute_path))
            except Exception as exc:  # an unresolvable reference or a pattern the engine refuses: never a crash
                raise ValueError(f"the arguments cannot be checked against the schema ({type(exc).__name__})") from None
            if errors:
                raise ValueError(
                    "; ".join(
                        f"{'/'.join(str(p) for p in e.absolute_path) or 'arguments'}: {e.message}"
                        for e in errors[:_MAX_ERRORS]
                    )
                )
            return data

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(cls.json_schema)

    SchemaInput.__name__ = SchemaInput.__qualname__ = re.sub(r"\W", "_", name) + "_input"
    return SchemaInput


def _wrapped(node: Any, source: str) -> Any:
    """``node`` with every ``description`` text in it wrapped as a data block of ``source``."""
    if isinstance(node, list):
        return [_wrapped(item, source) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description" and isinstance(value, str):
            out[key] = data_block(value, source=source)
        else:  # a property named ``description`` holds a schema (a mapping): walked like any other
            out[key] = _wrapped(value, source)
    return out


def _refs(node: Any) -> list[str]:
    """Every ``$ref`` value in a schema."""
    if isinstance(node, dict):
        found = [str(node["$ref"])] if "$ref" in node else []
        return found + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def result_value(result: types.CallToolResult) -> dict[str, Any]:
    """A call's result as JSON-able data: its text, structured content, and whether the server reported an error."""
    parts: list[Any] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append({"type": block.type, "omitted": "non-text content is not passed on"})
    value: dict[str, Any] = {"content": parts}
    if result.structured_content is not None:
        value["structured"] = result.structured_content
    if result.is_error:
        value["is_error"] = True
    return value


def _description(server: str, pinned: PinnedTool) -> str:
    text = pinned.description.strip() or "(no description)"
    return f"Tool {pinned.name} of the MCP server {server}. " + data_block(
        text, source=f"mcp:{server}/{pinned.name} description"
    )


def _tool(server_name: str, server: McpServer, accepted: str, pinned: PinnedTool, clients: McpClients) -> Tool:
    name = tool_name(server_name, pinned.name)
    write = pinned.name not in server.reads

    async def call(args: BaseModel, ctx: ToolContext) -> Any:
        connection = clients.connection(server_name, Scope(ctx.agent, ctx.session_key, ctx.workspace))
        announced = {t.name: t for t in await connection.tools(refresh=True)}
        if connection.identity != accepted:
            raise ToolError(
                f"{name} is disabled: the MCP server {server_name} is not the one the operator accepted "
                f"(`switchboard mcp tools {server_name}`)",
                error_class="auth",
            )
        now = announced.get(pinned.name)
        if now is None:
            raise ToolError(f"{name} is no longer offered by the MCP server {server_name}")
        if tool_sha256(now) != pinned.sha256:
            raise ToolError(
                f"{name} is disabled: its description or schema changed since the operator accepted it "
                f"(`switchboard mcp accept {server_name} {pinned.name}`)",
                error_class="auth",
            )
        value = result_value(await connection.call(pinned.name, args.model_dump(mode="json"), write=write))
        if connection.grant:  # a sandboxed server's egress grant is not the model's to see
            value = json.loads(json.dumps(value).replace(connection.grant, GRANT_SHOWN_AS))
        return value

    return Tool(
        name=name,
        description=_description(server_name, pinned),
        input=schema_input(name, pinned.input_schema, source=f"mcp:{server_name}/{pinned.name} schema"),
        fn=call,
        side_effect="write" if write else "read",
        risk="medium" if write else "low",
        reversible=not write,
        timeout_s=server.timeout_s,
        owner=f"mcp:{server_name}",
        connector=f"mcp:{server_name}",
        output_trust="data",
        retry_on=frozenset({"rate_limit", "transient"}),
    )


def mcp_tools(servers: Mapping[str, McpServer], pins: PinStore, clients: McpClients) -> list[Tool]:
    """The accepted tools of every configured server whose identity still matches what was accepted."""
    found: list[Tool] = []
    for server_name, server in servers.items():
        accepted = pins.server(server_name)
        if accepted is None:
            continue
        if accepted.identity != identity(server):
            logger.warning("MCP server %s changed since its tools were accepted; its tools are off", server_name)
            continue
        for pinned in accepted.tools.values():
            if not re.match(TOOL_NAME_PATTERN, pinned.name):
                continue
            try:
                found.append(_tool(server_name, server, accepted.identity, pinned, clients))
            except ValueError as err:
                logger.warning("MCP tool not offered: %s", err)
    return found
