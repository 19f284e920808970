"""Fake search APIs at their HTTP boundary: Brave Search, Tavily and SearXNG, each in its documented JSON shape.

- Brave: ``GET /res/v1/web/search?q=&count=`` with ``X-Subscription-Token``; answers ``{"type": "search", "query":
  {...}, "web": {"type": "search", "results": [{"title", "url", "description", "age", "page_age", ...}]}}``, the
  description with ``<strong>`` highlights.
- Tavily: ``POST /search`` with ``Authorization: Bearer`` and ``{"query", "max_results", ...}``; answers
  ``{"query", "answer", "results": [{"title", "url", "content", "score", "published_date"}], "response_time"}``.
- SearXNG: ``GET /search?q=&format=json`` (403 unless ``format=json``, as an instance without the JSON format
  enabled answers); ``{"query", "number_of_results", "results": [{"url", "title", "content", "publishedDate",
  "engine"}]}``.

:attr:`FakeSearch.pages` are what every search finds (neutral: title, url, snippet, date); every request is
recorded in :attr:`FakeSearch.hits`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["BRAVE_KEY", "TAVILY_KEY", "FakeSearch", "Page"]

BRAVE_KEY = "BSA-real-brave-key-0f9e8d7c"
TAVILY_KEY = "tvly-real-tavily-key-1a2b3c4d"


@dataclass
class Page:
    """A page every search finds."""

    title: str
    url: str
    snippet: str
    date: str | None = None


@dataclass
class FakeSearch:
    """The three APIs in one app (they do not share paths and methods)."""

    pages: list[Page] = field(
        default_factory=lambda: [
            Page("Switchboard docs", "https://docs.example.org/switchboard", "A self-hosted gateway.", "2026-11-02"),
            Page("Switchboard on GitHub", "https://github.example/switchboard", "Source and issues.", None),
        ]
    )
    hits: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    """Answer every search with this status instead (an error body in the API's shape)."""

    async def _record(self, request: web.Request) -> None:
        self.hits.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": request.headers.copy(),
                "body": await request.read(),
            }
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/res/v1/web/search", self._brave)
        app.router.add_post("/search", self._tavily)
        app.router.add_get("/search", self._searxng)
        return app

    async def _brave(self, request: web.Request) -> web.Response:
        await self._record(request)
        if request.headers.get("X-Subscription-Token") != BRAVE_KEY:
            error = {"type": "ErrorResponse", "error": {"code": "SUBSCRIPTION_TOKEN_INVALID", "status": 422}}
            return web.json_response(error, status=422)
        if self.status != 200:
            return web.json_response({"type": "ErrorResponse", "error": {"status": self.status}}, status=self.status)
        query = request.query.get("q", "")
        count = int(request.query.get("count", "20"))
        results = [
            {
                "type": "search_result",
                "title": page.title.replace("Switchboard", "<strong>Switchboard</strong>"),
                "url": page.url,
                "description": page.snippet.replace("gateway", "<strong>gateway</strong>"),
                "is_source_local": False,
                "language": "en",
                **({"page_age": f"{page.date}T00:00:00", "age": "1 month ago"} if page.date else {}),
            }
            for page in self.pages[:count]
        ]
        return web.json_response(
            {
                "type": "search",
                "query": {"original": query, "more_results_available": False},
                "web": {"type": "search", "results": results, "family_friendly": True},
            }
        )

    async def _tavily(self, request: web.Request) -> web.Response:
        await self._record(request)
        if request.headers.get("Authorization") != f"Bearer {TAVILY_KEY}":
            return web.json_response({"detail": {"error": "Unauthorized: missing or invalid API key."}}, status=401)
        if self.status != 200:
            return web.json_response({"detail": {"error": "failed"}}, status=self.status)
        body = await request.json()
        count = int(body.get("max_results", 5))
        results = [
            {
                "title": page.title,
                "url": page.url,
                "content": page.snippet,
                "score": 0.9,
                "raw_content": None,
                **({"published_date": page.date} if page.date else {}),
            }
            for page in self.pages[:count]
        ]
        return web.json_response(
            {"query": body.get("query"), "answer": None, "images": [], "results": results, "response_time": 0.4}
        )

    async def _searxng(self, request: web.Request) -> web.Response:
        await self._record(request)
        if request.query.get("format") != "json":
            return web.Response(status=403, text="403 Forbidden")
        if self.status != 200:
            return web.Response(status=self.status, text="error")
        results = [
            {
                "url": page.url,
                "title": page.title,
                "content": page.snippet,
                "engine": "duckduckgo",
                "engines": ["duckduckgo"],
                "score": 1.0,
                "category": "general",
                "publishedDate": f"{page.date}T00:00:00" if page.date else None,
            }
            for page in self.pages
        ]
        return web.json_response(
            {"query": request.query.get("q"), "number_of_results": len(results), "results": results, "answers": []}
        )
