"""A plain HTTP server standing for an internal host or an attacker's: it records every request and answers as told.

Attack tests point the gateway at it (a metadata endpoint, an internal service, a spoofed Graph API) and assert
that nothing reached it, or only what may.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["Recorder", "serving"]


@dataclass
class Recorder:
    """What reached the server (``hits``: method, path with query, headers) and how it answers."""

    url: str = ""
    hits: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    redirect_to: str | None = None
    """Where requests under :attr:`hop` are redirected, when set."""
    hop: str = "/"
    """The path prefix that redirects; other paths answer :attr:`json_answer` when it is set."""
    json_answer: Any = None
    answer: bytes = b"internal secret: AKIA-EXAMPLE"
    content_type: str = "application/octet-stream"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append((request.method, request.path_qs, dict(request.headers)))
        hop = request.path.startswith(self.hop)
        if self.redirect_to is not None and hop:
            raise web.HTTPFound(self.redirect_to)
        if self.json_answer is not None and not hop:
            return web.json_response(self.json_answer)
        return web.Response(body=self.answer, content_type=self.content_type)


@asynccontextmanager
async def serving(recorder: Recorder) -> AsyncIterator[Recorder]:
    """Serve ``recorder`` on a free loopback port (its ``url`` set) until the block ends."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    recorder.url = f"http://127.0.0.1:{port}"
    try:
        yield recorder
    finally:
        await runner.cleanup()
