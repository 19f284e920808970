"""The page at ``/`` and its assets: served with security headers, no inline script, the hooks tests rely on."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from .conftest import Chat


class _Scan(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.inline_script = False
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline_script = True


async def _page(chat: Chat) -> tuple[str, dict[str, str]]:
    resp = await chat.client.get("/")
    assert resp.status == 200
    return await resp.text(), dict(resp.headers)


async def test_page_has_a_strict_content_security_policy(chat: Chat) -> None:
    _, headers = await _page(chat)
    assert headers["Content-Type"].startswith("text/html")
    csp = headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff"


async def test_page_has_no_inline_script_nor_handlers(chat: Chat) -> None:
    html, _ = await _page(chat)
    scan = _Scan()
    scan.feed(html)
    assert not scan.inline_script
    assert all(not name.startswith("on") for _, attrs in scan.tags for name in attrs)
    scripts = [attrs.get("src") for tag, attrs in scan.tags if tag == "script"]
    assert scripts == ["static/chat.js"]


async def test_page_carries_the_hooks_browser_tests_use(chat: Chat) -> None:
    html, _ = await _page(chat)
    for testid in ("message-list", "composer-input", "send-button", "typing-indicator"):
        assert f'data-testid="{testid}"' in html
    assert re.search(r'id="message-list"[^>]*aria-live="polite"|aria-live="polite"[^>]*id="message-list"', html, re.S)
    assert '<label class="visually-hidden" for="composer-input">' in html
    assert 'name="viewport"' in html
    script = await (await chat.client.get("/static/chat.js")).text()
    for testid in ("msg-user", "msg-assistant", "msg-status"):
        assert f'"{testid}"' in script


@pytest.mark.parametrize(("name", "content_type"), [("chat.js", "text/javascript"), ("chat.css", "text/css")])
async def test_assets_are_served_with_their_types(chat: Chat, name: str, content_type: str) -> None:
    resp = await chat.client.get(f"/static/{name}")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith(content_type)
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert len(await resp.read()) > 100


@pytest.mark.parametrize("path", ["/static/web.py", "/static/..%2Fweb.py", "/static/%2E%2E/webchat.py", "/static/"])
async def test_nothing_else_is_served_from_disk(chat: Chat, path: str) -> None:
    resp = await chat.client.get(path)
    assert resp.status == 404


async def test_script_never_parses_server_text_as_html() -> None:
    from switchboard.web.webchat.routes import STATIC_DIR

    script = (STATIC_DIR / "chat.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script
