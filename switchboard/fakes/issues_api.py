"""A fake GitHub Issues REST API: search, get, list comments, comment, open, in GitHub's wire shapes.

State is one dict of repositories (``owner/name``) holding issues by number, each with its comments; every request
is recorded in :attr:`IssuesApi.hits`. A request without ``Authorization: Bearer <token>`` gets GitHub's 401 body.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from switchboard.fakes import localhost_tls

__all__ = ["IssuesApi"]

_STAMP = "2026-12-07T12:00:00Z"


def _message(status: int, message: str) -> web.Response:
    return web.json_response({"message": message, "documentation_url": "https://docs.github.com/rest"}, status=status)


@dataclass
class IssuesApi:
    """The fake API; ``repos`` maps ``owner/name`` to its issues by number."""

    token: str
    login: str = "switchboard-bot"
    repos: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    comments: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    hits: list[dict[str, Any]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1001))

    def add_issue(
        self, repo: str, title: str, body: str = "", *, state: str = "open", labels: tuple[str, ...] = (), by: str = ""
    ) -> dict[str, Any]:
        """Open an issue in ``repo`` (as if opened elsewhere) and return it."""
        issues = self.repos.setdefault(repo, {})
        number = len(issues) + 1
        issue = {
            "id": next(self._ids),
            "number": number,
            "title": title,
            "body": body,
            "state": state,
            "user": {"login": by or "octocat"},
            "labels": [{"name": name} for name in labels],
            "comments": 0,
            "html_url": f"https://github.example/{repo}/issues/{number}",
            "created_at": _STAMP,
            "updated_at": _STAMP,
        }
        issues[number] = issue
        return issue

    def add_comment(self, repo: str, number: int, body: str, *, by: str = "") -> dict[str, Any]:
        """Comment on an issue and return the comment."""
        comment_id = next(self._ids)
        comment = {
            "id": comment_id,
            "body": body,
            "user": {"login": by or self.login},
            "html_url": f"https://github.example/{repo}/issues/{number}#issuecomment-{comment_id}",
            "created_at": _STAMP,
        }
        self.comments.setdefault((repo, number), []).append(comment)
        self.repos[repo][number]["comments"] += 1
        return comment

    def _matches(self, issue: dict[str, Any], terms: list[str]) -> bool:
        for term in terms:
            key, _, value = term.partition(":")
            if key in ("is", "state") and value in ("open", "closed"):
                if issue["state"] != value:
                    return False
            elif key == "label":
                if value not in {label["name"] for label in issue["labels"]}:
                    return False
            elif not (key == "is" and value == "issue"):
                words = f"{issue['title']} {issue['body']}".casefold()
                if term.casefold() not in words:
                    return False
        return True

    def app(self) -> web.Application:
        """The aiohttp application."""

        @web.middleware
        async def record_and_authorise(request: web.Request, handler: Any) -> web.StreamResponse:
            body = await request.read()
            self.hits.append(
                {"method": request.method, "path": request.path_qs, "headers": request.headers.copy(), "body": body}
            )
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return _message(401, "Bad credentials")
            response: web.StreamResponse = await handler(request)
            return response

        def issue_of(request: web.Request) -> tuple[str, dict[str, Any]] | None:
            repo = f"{request.match_info['owner']}/{request.match_info['name']}"
            try:
                return repo, self.repos[repo][int(request.match_info["number"])]
            except (KeyError, ValueError):
                return None

        async def search(request: web.Request) -> web.Response:
            q = request.query.get("q", "")
            repos = re.findall(r"\brepo:(\S+)", q)
            if not repos:
                return _message(422, "Validation Failed")
            terms = [t for t in q.split() if not t.startswith("repo:")]
            items = [i for repo in repos for i in self.repos.get(repo, {}).values() if self._matches(i, terms)]
            items = items[: int(request.query.get("per_page", "30"))]
            return web.json_response({"total_count": len(items), "incomplete_results": False, "items": items})

        async def get_issue(request: web.Request) -> web.Response:
            found = issue_of(request)
            return web.json_response(found[1]) if found else _message(404, "Not Found")

        async def list_comments(request: web.Request) -> web.Response:
            found = issue_of(request)
            if found is None:
                return _message(404, "Not Found")
            return web.json_response(self.comments.get((found[0], found[1]["number"]), []))

        async def comment(request: web.Request) -> web.Response:
            found = issue_of(request)
            if found is None:
                return _message(404, "Not Found")
            body = await request.json()
            if not isinstance(body, dict) or not isinstance(body.get("body"), str) or not body["body"]:
                return _message(422, "Validation Failed")
            return web.json_response(self.add_comment(found[0], found[1]["number"], body["body"]), status=201)

        async def open_issue(request: web.Request) -> web.Response:
            repo = f"{request.match_info['owner']}/{request.match_info['name']}"
            body = await request.json()
            if repo not in self.repos:
                return _message(404, "Not Found")
            if not isinstance(body, dict) or not isinstance(body.get("title"), str) or not body["title"]:
                return _message(422, "Validation Failed")
            issue = self.add_issue(
                repo, body["title"], body.get("body") or "", labels=tuple(body.get("labels") or ()), by=self.login
            )
            return web.json_response(issue, status=201)

        app = web.Application(middlewares=[record_and_authorise])
        app.router.add_get("/search/issues", search)
        app.router.add_get("/repos/{owner}/{name}/issues/{number}", get_issue)
        app.router.add_get("/repos/{owner}/{name}/issues/{number}/comments", list_comments)
        app.router.add_post("/repos/{owner}/{name}/issues/{number}/comments", comment)
        app.router.add_post("/repos/{owner}/{name}/issues", open_issue)
        return app


def main(argv: list[str] | None = None) -> None:
    """``python -m switchboard.fakes.issues_api [--port 8766] [--token dev-token]``: serve ``acme/shop``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--token", default="dev-token")
    parser.add_argument("--tls-dir", type=Path, help="serve HTTPS for localhost under a CA kept in this folder")
    args = parser.parse_args(argv)
    api = IssuesApi(token=args.token)
    api.add_issue("acme/shop", "Refund button does nothing", "Clicking refund shows a spinner forever.")
    api.add_issue("acme/shop", "Dark mode", "Please add it.", labels=("idea",))
    api.add_comment("acme/shop", 1, "Seen on Safari too.", by="alice")
    tls = localhost_tls(args.tls_dir) if args.tls_dir else None
    scheme = "https://localhost" if tls else "http://127.0.0.1"
    print(f"fake GitHub Issues API on {scheme}:{args.port} (token {args.token!r}, repository acme/shop)")
    web.run_app(api.app(), host="127.0.0.1", port=args.port, ssl_context=tls, print=None)


if __name__ == "__main__":
    main()
