"""Declarations of REST tools drafted from an OpenAPI 3 document, for the operator to review before use.

Only the operations asked for (by ``operationId``) are drafted: each becomes one narrow tool whose argument schema is
its path and query parameters and the properties of its JSON body, with local ``$ref`` resolved, and whose headers
carry a ``{{secret:NAME}}`` placeholder for its API key or bearer scheme. What a document says (names, summaries,
schemas) is outside text: the drafts are shown to the operator, never loaded on their own.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from switchboard.core.tools.rest.declaration import RestToolSpec

__all__ = ["OpenApiError", "draft_tools", "operations", "tool_name"]

_METHODS = ("get", "post", "put", "patch", "delete")
_ARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_DROP = frozenset({"xml", "example", "examples", "externalDocs", "discriminator", "deprecated"})
_MAX_DEPTH = 16
_MAX_NODES = 5000
"""Most schema nodes one operation inlines (references that fan out grow exponentially, a document does not)."""


class OpenApiError(ValueError):
    """The document, or an operation asked for, cannot be drafted as a tool (the message says why)."""


def tool_name(operation_id: str) -> str:
    """``findPetsByStatus`` → ``find_pets_by_status``."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", operation_id)
    return re.sub(r"[^a-z0-9_]+", "_", snake.lower()).strip("_")[:64]


def operations(document: Mapping[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Every operation with an ``operationId``: id → (method, path, operation)."""
    found: dict[str, tuple[str, str, dict[str, Any]]] = {}
    for path, item in (document.get("paths") or {}).items():
        for method in _METHODS:
            operation = item.get(method) if isinstance(item, dict) else None
            if isinstance(operation, dict) and operation.get("operationId"):
                merged = {**operation, "parameters": [*item.get("parameters", []), *operation.get("parameters", [])]}
                found[str(operation["operationId"])] = (method.upper(), path, merged)
    return found


def _resolve(document: Mapping[str, Any], value: Any, depth: int = 0, nodes: list[int] | None = None) -> Any:
    """``value`` with every local ``$ref`` inlined and OpenAPI-only keywords turned into JSON Schema.

    ``nodes``: the count of nodes inlined so far for one operation (shared by its calls), capped at ``_MAX_NODES``.
    """
    nodes = nodes if nodes is not None else [0]
    nodes[0] += 1
    if nodes[0] > _MAX_NODES:
        raise OpenApiError(f"a schema is too large to inline (over {_MAX_NODES} nodes): not a narrow operation")
    if depth > _MAX_DEPTH:
        raise OpenApiError("a schema nests (or refers to itself) too deeply to inline")
    if isinstance(value, list):
        return [_resolve(document, item, depth + 1, nodes) for item in value]
    if not isinstance(value, dict):
        return value
    if "$ref" in value:
        ref = str(value["$ref"])
        if not ref.startswith("#/"):
            raise OpenApiError(f"only local references are followed, not {ref!r}")
        target: Any = document
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise OpenApiError(f"{ref!r} points at nothing in the document")
            target = target[part]
        return _resolve(document, target, depth + 1, nodes)
    out = {k: _resolve(document, v, depth + 1, nodes) for k, v in value.items() if k not in _DROP}
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _writable(schema: dict[str, Any]) -> dict[str, Any]:
    """A request body schema without its ``readOnly`` properties (the server sets them)."""
    properties = {k: v for k, v in schema.get("properties", {}).items() if not v.get("readOnly")}
    required = [name for name in schema.get("required", []) if name in properties]
    return {**schema, "properties": properties, **({"required": required} if required else {})}


def _secret_headers(document: Mapping[str, Any], operation: Mapping[str, Any]) -> dict[str, str]:
    """Headers for the operation's first security requirement an API key or bearer scheme meets."""
    schemes = (document.get("components") or {}).get("securitySchemes") or {}
    requirements = operation.get("security", document.get("security")) or []
    for requirement in requirements:
        for scheme_name in requirement:
            scheme = schemes.get(scheme_name) or {}
            secret = "{{secret:" + re.sub(r"[^A-Z0-9_]", "_", scheme_name.upper())[:64] + "}}"
            if scheme.get("type") == "apiKey" and scheme.get("in") == "header" and scheme.get("name"):
                return {str(scheme["name"]): secret}
            if scheme.get("type") == "http" and str(scheme.get("scheme", "")).lower() == "bearer":
                return {"Authorization": f"Bearer {secret}"}
    return {}


def _draft(
    document: Mapping[str, Any], base: str, operation_id: str, found: tuple[str, str, dict[str, Any]]
) -> dict[str, Any]:
    method, path, operation = found
    if not path.startswith("/"):  # else the document's path would extend the server's host name or port
        raise OpenApiError(f"{operation_id}: its path {path!r} does not start with '/'")
    nodes = [0]
    properties: dict[str, Any] = {}
    required: list[str] = []
    query: list[str] = []
    for raw in operation["parameters"]:
        parameter = _resolve(document, raw, nodes=nodes)
        name, where = str(parameter.get("name", "")), parameter.get("in")
        if where in ("header", "cookie"):
            if parameter.get("required"):
                raise OpenApiError(f"{operation_id}: its required {where} parameter {name!r} cannot be an argument")
            continue
        if not _ARG.match(name):
            raise OpenApiError(f"{operation_id}: parameter {name!r} is not usable as an argument name")
        schema = dict(parameter.get("schema") or {})
        if parameter.get("description") and "description" not in schema:
            schema["description"] = str(parameter["description"])[:300]
        properties[name] = schema
        if parameter.get("required") or where == "path":
            required.append(name)
        if where == "query":
            query.append(name)
    body = (operation.get("requestBody") and _resolve(document, operation["requestBody"], nodes=nodes)) or {}
    if body:
        media = (body.get("content") or {}).get("application/json")
        if media is None:
            raise OpenApiError(f"{operation_id}: only a JSON request body can be drafted")
        schema = _writable(media.get("schema") or {})
        if schema.get("type", "object") != "object":
            raise OpenApiError(f"{operation_id}: only an object request body can be drafted")
        clash = sorted(set(schema.get("properties", {})) & set(properties))
        if clash:
            raise OpenApiError(f"{operation_id}: body properties {clash} clash with its parameters")
        properties.update(schema.get("properties", {}))
        if body.get("required"):
            required += schema.get("required", [])
    text = " ".join(str(operation.get(k, "")).strip() for k in ("summary", "description")).strip()
    declaration: dict[str, Any] = {
        "name": tool_name(operation_id),
        "description": (text or operation_id)[:1024],
        "method": method,
        "url": base.rstrip("/") + path,
        "parameters": {
            "type": "object",
            "properties": properties,
            **({"required": sorted(set(required))} if required else {}),
            "additionalProperties": False,
        },
    }
    if method in ("POST", "PUT", "PATCH") and query:
        declaration["query"] = query
    headers = _secret_headers(document, operation)
    if headers:
        declaration["headers"] = headers
    RestToolSpec.model_validate(declaration)  # a draft that would not load is an error now, not at start-up
    return declaration


def draft_tools(document: Mapping[str, Any], only: Iterable[str], *, server: str | None = None) -> list[dict[str, Any]]:
    """The declarations (as YAML-ready mappings) of the operations ``only`` names, in that order.

    Raises:
        OpenApiError: not an OpenAPI 3 document, no absolute server URL, an unknown ``operationId`` (the known ones
            are listed), or an operation that cannot be one narrow tool.
    """
    if not str(document.get("openapi", "")).startswith("3."):
        raise OpenApiError("not an OpenAPI 3 document (no `openapi: 3.x` field)")
    base = server or str(((document.get("servers") or [{}])[0]).get("url", ""))
    if not base.startswith(("https://", "http://")):
        raise OpenApiError(f"the document's server URL {base!r} is not absolute: pass the API's base URL (--server)")
    known = operations(document)
    wanted = [name.strip() for name in only if name.strip()]
    ids = Counter(
        str(item[method].get("operationId"))
        for item in (document.get("paths") or {}).values()
        if isinstance(item, dict)
        for method in _METHODS
        if isinstance(item.get(method), dict)
    )
    twice = [name for name in wanted if ids[name] > 1]  # never one of them chosen silently
    if twice:
        raise OpenApiError(f"operationId {twice[0]} names {ids[twice[0]]} operations in the document: it is ambiguous")
    missing = [name for name in wanted if name not in known]
    if missing:
        raise OpenApiError(f"no operation {', '.join(missing)} in the document (it has: {', '.join(sorted(known))})")
    if not wanted:
        raise OpenApiError(f"name the operations to draft (it has: {', '.join(sorted(known))})")
    try:
        return [copy.deepcopy(_draft(document, base, name, known[name])) for name in wanted]
    except ValueError as err:  # a draft RestToolSpec refuses
        if isinstance(err, OpenApiError):
            raise
        raise OpenApiError(f"a drafted declaration would not load: {err}") from None
