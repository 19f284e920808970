"""``/mcp``: Switchboard's MCP server over streamable HTTP, under the web tier, one bearer token per client.

The token is checked first (``401`` when missing or not a client's), the body is read with a cap (``413``), and
only then is the request handed to the SDK's streamable HTTP transport, stateless and answering JSON, for a server
built for that client (:func:`~switchboard.web.mcpserve.server.build_server`): a client sees only its tenant's
agents. A body that is not JSON-RPC is the SDK's ``400``; anything unexpected is a JSON ``500``-free refusal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import Any, Final

from aiohttp import web
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from redis.exceptions import RedisError

from switchboard.core.tools.builtin import default_registry
from switchboard.queue.mcpclients import McpClient, McpClientStore
from switchboard.web.api.tokens import MAX_TOKEN_CHARS, token_hash
from switchboard.web.appkeys import REDIS, ROUTER, SETTINGS
from switchboard.web.mcpserve.server import build_server
from switchboard.web.mcpserve.service import McpService

__all__ = ["PATH", "add_routes"]

logger = logging.getLogger(__name__)

PATH: Final = "/mcp"
_SECURITY: Final = TransportSecuritySettings(enable_dns_rebinding_protection=False)
"""Every request carries a client's bearer token, so a page a browser was tricked into loading gets nothing."""
SERVICE: web.AppKey[McpService] = web.AppKey("mcp_service")


def _error(status: int, code: str, message: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="switchboard-mcp"'} if status == 401 else None
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


async def _client(request: web.Request) -> McpClient | web.Response:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        return _error(401, "unauthenticated", "send the client's token as 'Authorization: Bearer <token>'")
    if len(presented) > MAX_TOKEN_CHARS or not presented.isascii():
        return _error(401, "unauthenticated", "the token is not valid")
    try:
        async with asyncio.timeout(request.app[SETTINGS].queue.ingest_timeout_s):
            client = await McpClientStore(request.app[REDIS]).find(token_hash(presented))
    except (TimeoutError, RedisError, OSError):
        return _error(503, "unavailable", "the queue did not answer in time; try again")
    if client is None:
        return _error(401, "unauthenticated", "the token is not valid (make one with `switchboard mcp clients add`)")
    return client


async def _body(request: web.Request, limit: int) -> bytes | None:
    if request.content_length is not None and request.content_length > limit:
        return None
    body = await request.content.read(limit + 1)
    while len(body) <= limit and not request.content.at_eof():
        more = await request.content.read(limit + 1 - len(body))
        if not more:
            break
        body += more
    return None if len(body) > limit else body


def _scope(request: web.Request) -> dict[str, Any]:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": PATH,
        "raw_path": PATH.encode(),
        "root_path": "",
        "query_string": request.query_string.encode("latin-1"),
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        "server": None,
        "state": {},
    }


async def handle(request: web.Request) -> web.StreamResponse:
    """``POST /mcp``: one MCP request of an authenticated client, through the SDK's transport (others: ``405``)."""
    client = await _client(request)
    if isinstance(client, web.Response):
        return client
    if request.method != "POST":  # stateless and JSON only: no event stream to open (GET), no session to end (DELETE)
        refused = _error(405, "method_not_allowed", "this MCP server answers POST only (stateless, JSON responses)")
        refused.headers["Allow"] = "POST"
        return refused
    limit = request.app[SETTINGS].mcp_serve.max_body_bytes
    body = await _body(request, limit)
    if body is None:
        return _error(413, "too_large", f"the body is over {limit} bytes")
    server = build_server(request.app[SERVICE], client)
    manager = StreamableHTTPSessionManager(
        server._lowlevel_server,  # what MCPServer.streamable_http_app mounts; its Starlette app is not needed
        json_response=True,
        stateless=True,
        security_settings=_SECURITY,
        max_request_body_size=limit,
    )
    response: web.StreamResponse | None = None
    done = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal response
        if message["type"] == "http.response.start":
            response = web.StreamResponse(status=message["status"])
            for name, value in message.get("headers", []):
                key = name.decode("latin-1")
                if key.lower() not in {"content-length", "transfer-encoding", "connection"}:
                    response.headers.add(key, value.decode("latin-1"))
            await response.prepare(request)
        elif message["type"] == "http.response.body" and response is not None:
            await response.write(message.get("body", b""))
            if not message.get("more_body", False):
                await response.write_eof()
                done.set()

    try:
        async with manager.run():
            await manager.handle_request(_scope(request), receive, send)
    except Exception:  # the transport failed before answering: a clear refusal, never a traceback page
        logger.exception("MCP request of client %s failed", client.name)
        if response is None:
            return _error(503, "unavailable", "the MCP request could not be served; try again")
    finally:
        done.set()
    if response is None:
        return _error(503, "unavailable", "the MCP request was not answered; try again")
    return response


async def _service(app: web.Application) -> Any:
    settings = app[SETTINGS]
    app[SERVICE] = McpService(
        app[REDIS], app[ROUTER], wait_s=settings.mcp_serve.wait_s, tool_names=default_registry().names()
    )
    yield


def add_routes(app: web.Application) -> None:
    """Serve ``/mcp`` (after the app's lifecycle has made Redis and the router)."""
    app.cleanup_ctx.append(_service)
    for method in ("POST", "GET", "DELETE"):
        app.router.add_route(method, PATH, handle)
