"""Declared REST operations as gateway tools: arguments checked by their JSON Schema, calls sent through egress.

The gateway validates a call against the declared schema before anything is sent, decides it by its classes
(a write asks a person by default), stamps writes with an ``Idempotency-Key`` header, retries reads on 5xx and
timeouts and keeps a circuit breaker per host. The request goes out through the egress policy (allowlist, address
checks, secret placeholders filled in); the response comes back as untrusted data, cut to the declared result.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol
from urllib.parse import quote, urlencode

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaViolation
from pydantic import BaseModel, ConfigDict, model_validator

from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.rest.declaration import RestResult, RestToolSpec, path_names
from switchboard.errors import ToolError

__all__ = [
    "DeclaredArguments",
    "RestReply",
    "RestTransport",
    "build_request",
    "build_rest_tool",
    "declared_tools",
    "project",
    "resolve_pointer",
]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_SHOWN_ERROR = 300
"""Characters of an error response shown to the model."""


class RestReply(Protocol):
    """A response as egress hands it back (``refused``: the egress policy's reason, nothing was answered)."""

    @property
    def status(self) -> int:
        """The HTTP status (the refusal's, when ``refused``)."""
        ...

    @property
    def headers(self) -> list[tuple[str, str]]:
        """Response headers, in order."""
        ...

    @property
    def body(self) -> bytes:
        """The response body (redacted of secrets by egress)."""
        ...

    @property
    def refused(self) -> str | None:
        """Why egress refused the request (nothing was sent, or nothing came back)."""
        ...


class RestTransport(Protocol):
    """The way out for one call of one agent in one session (the worker's egress forwarder)."""

    async def request(
        self, *, agent: str, session: str, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> RestReply:
        """Send one request under the agent's egress policy; a refusal comes back as a reply, never raised."""
        ...


class DeclaredArguments(BaseModel):
    """Arguments of a declared tool: checked against the declared JSON Schema, shown to the model as declared."""

    model_config = ConfigDict(extra="allow")

    declared_schema: ClassVar[dict[str, Any]] = {}
    checker: ClassVar[Draft202012Validator | None] = None

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("arguments must be a JSON object")
        if cls.checker is not None:
            errors = sorted(cls.checker.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
            if errors:
                raise ValueError("; ".join(_describe(e) for e in errors[:5]))
        return data

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The declared schema, as the model is shown it."""
        return json.loads(json.dumps(cls.declared_schema))  # type: ignore[no-any-return]


def _describe(error: SchemaViolation) -> str:
    where = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
    return f"{where}: {error.message[:200]}"


def _arguments_model(spec: RestToolSpec) -> type[DeclaredArguments]:
    title = "".join(part.capitalize() for part in spec.name.split("_")) + "Arguments"
    checker = Draft202012Validator(spec.parameters, format_checker=Draft202012Validator.FORMAT_CHECKER)
    namespace = {"__module__": __name__, "declared_schema": spec.parameters, "checker": checker}
    return type(title, (DeclaredArguments,), namespace)


def resolve_pointer(value: Any, pointer: str) -> Any:
    """The part of ``value`` at RFC 6901 ``pointer``.

    Raises:
        KeyError: nothing is there.
    """
    if not pointer:
        return value
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            raise KeyError(pointer)
    return value


def _pick(item: Any, fields: Mapping[str, str]) -> dict[str, Any]:
    picked: dict[str, Any] = {}
    for name, pointer in fields.items():
        try:
            picked[name] = resolve_pointer(item, pointer)
        except KeyError:
            picked[name] = None
    return picked


def project(value: Any, shape: RestResult) -> Any:
    """``value`` cut to the declared result: the pointer, each item's fields, at most ``max_items`` items.

    Raises:
        ToolError: the response has nothing at the pointer (the API changed, or the declaration is wrong).
    """
    try:
        value = resolve_pointer(value, shape.pointer)
    except KeyError:
        raise ToolError(f"the response has nothing at {shape.pointer!r}", error_class="permanent") from None
    if isinstance(value, list):
        items = [_pick(item, shape.fields) if shape.fields else item for item in value[: shape.max_items]]
        if len(value) > shape.max_items:
            return {"items": items, "more": len(value) - shape.max_items}
        return items
    return _pick(value, shape.fields) if shape.fields else value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else str(value)


def build_request(spec: RestToolSpec, args: Mapping[str, Any]) -> tuple[str, bytes]:
    """The URL and body of one call with validated ``args``: path segments filled in, the rest in query or body."""
    rest = {k: v for k, v in args.items() if v is not None}
    url = spec.url
    for name in path_names(spec.url):
        url = url.replace("{" + name + "}", quote(_text(rest.pop(name)), safe=""))
    in_query = {k: rest.pop(k) for k in list(rest) if k in spec.query or spec.method not in _BODY_METHODS}
    pairs: list[tuple[str, str]] = []
    for key, value in in_query.items():
        pairs += [(key, _text(v)) for v in value] if isinstance(value, list) else [(key, _text(value))]
    if pairs:
        url += ("&" if "?" in url else "?") + urlencode(pairs)
    body = json.dumps(rest, separators=(",", ":")).encode() if spec.method in _BODY_METHODS else b""
    return url, body


def _header(reply: RestReply, name: str) -> str | None:
    return next((v for n, v in reply.headers if n.lower() == name), None)


def _failure(spec: RestToolSpec, reply: RestReply) -> ToolError:
    """The error a non-2xx reply (or an egress refusal) is to the gateway."""
    write = spec.effect == "write"
    if reply.refused is not None:
        if reply.refused in ("upstream_timeout", "upstream_error"):  # a write may have reached the API
            return ToolError(
                f"{spec.host} did not answer ({reply.refused})",
                error_class="ambiguous_timeout" if write else "transient",
            )
        return ToolError(f"refused by the egress policy ({reply.refused}); do not repeat this call")
    excerpt = reply.body[:_SHOWN_ERROR].decode("utf-8", "replace")
    message = f"{spec.host} answered HTTP {reply.status}: {excerpt}"
    if reply.status == 429:
        after = _header(reply, "retry-after")
        return ToolError(
            message, error_class="rate_limit", retry_after=float(after) if after and after.isdigit() else None
        )
    if reply.status >= 500:
        return ToolError(message, error_class="transient")
    if reply.status in (400, 422):
        return ToolError(message, error_class="validation")
    if reply.status in (401, 403):
        return ToolError(message, error_class="auth")
    return ToolError(message, error_class="permanent")


def _decoded(reply: RestReply) -> Any:
    if not reply.body:
        return {"status": reply.status}
    try:
        return json.loads(reply.body)
    except ValueError:
        return {"status": reply.status, "text": reply.body[:8192].decode("utf-8", "replace")}


def build_rest_tool(spec: RestToolSpec, transport: RestTransport | None) -> Tool:
    """The gateway tool for one declaration (``transport`` ``None``: the process has no way out, calls fail)."""
    write = spec.effect == "write"

    async def call(args: DeclaredArguments, ctx: ToolContext) -> Any:
        if transport is None:
            raise ToolError(f"{spec.name} cannot reach {spec.host}: this process has no egress")
        url, body = build_request(spec, args.model_dump(mode="json"))
        headers = dict(spec.headers)
        headers.setdefault("Accept", "application/json")
        if body:
            headers["Content-Type"] = "application/json"
        if write:
            headers["Idempotency-Key"] = ctx.idempotency_key
        reply = await transport.request(
            agent=ctx.agent, session=ctx.session_key, method=spec.method, url=url, headers=headers, body=body
        )
        if reply.refused is not None or not 200 <= reply.status < 300:
            raise _failure(spec, reply)
        return project(_decoded(reply), spec.result)

    return Tool(
        name=spec.name,
        description=spec.description,
        input=_arguments_model(spec),
        fn=call,
        side_effect=spec.effect,
        risk=spec.risk or ("medium" if write else "low"),
        permission=spec.permission,
        timeout_s=spec.timeout_s,
        owner=spec.owner or "rest",
        cost=1,
        connector=f"rest:{spec.host}",
        output_trust="data",
        reversible=spec.reversible if spec.reversible is not None else not write,
        idempotent=spec.idempotent,
        resources=lambda args: (f"{spec.method} {build_request(spec, args.model_dump(mode='json'))[0]}",),
    )


def _only_for(tool: Tool, owner: str) -> Tool:
    """``tool`` as one agent's own: any other agent that calls it is refused."""

    async def refuse(_args: Any, _ctx: ToolContext) -> Any:
        raise ToolError(f"{tool.name} is declared for agent {owner!r} only", error_class="auth")

    other = dataclasses.replace(tool, fn=refuse, per_agent=None, side_effect="read", risk="low", retry_on=frozenset())
    return dataclasses.replace(tool, per_agent=lambda agent: other if agent != owner else tool)


def declared_tools(
    shared: Sequence[RestToolSpec], own: Mapping[str, Sequence[RestToolSpec]], transport: RestTransport | None
) -> list[Tool]:
    """The gateway tools of the shared declarations and of each agent's own (by agent name)."""
    tools = [build_rest_tool(spec, transport) for spec in shared]
    for agent, specs in own.items():
        tools += [_only_for(build_rest_tool(spec, transport), agent) for spec in specs]
    return tools
