"""Fixtures for the browser tests: the real gateway started as a user starts it, and headless Chromium.

``gateway`` runs ``python -m switchboard run`` in a subprocess (embedded Valkey, web tier, one worker) with a slow
offline model, waits for ``/healthz`` to count a worker and for the printed web chat URL, and at the end stops it with
SIGINT (Ctrl-C) and checks that it exits cleanly. ``open_chat`` opens the chat page in a fresh browser context whose
page records a timeline of what a user would see (bubbles, their texts and states, the typing indicator), so a test
can assert on states that only last a moment without racing them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

from tests.conftest import MINIMAL_CONFIG


def _find_chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


CHROMIUM: Final = _find_chromium()
SKIP_REASON: Final = "Chromium not installed: apt-get install chromium"
CHROMIUM_ARGS: Final = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OFFLINE_DELAY_MS: Final = 600
"""Each model step of the offline model takes this long: long enough to see a run in progress and a queued message."""
MAX_FILE_BYTES: Final = 64 * 1024
"""``SWITCHBOARD_ATTACHMENTS__MAX_BYTES`` of the gateway: small, so a test can send a file over it."""
GUARD_MS: Final = 20_000
"""Upper bound on any single wait in the browser: a guard against hanging, not a timing assertion."""
STARTUP_GUARD_S: Final = 60.0
STOP_GUARD_S: Final = 10.0
SCREENSHOT: Final = Path("/tmp/webchat.png")

# Runs in every page before its own scripts: after each batch of DOM changes, note what the user sees.
RECORDER_JS: Final = r"""
(() => {
  const timeline = [];
  window.__timeline = timeline;
  let last = "";
  const visible = (node) => Boolean(node) && node.checkVisibility();
  const snapshot = () => {
    const list = document.querySelector("[data-testid=message-list]");
    const typing = document.querySelector("[data-testid=typing-indicator]");
    if (!list || !typing) return;
    const items = Array.from(list.children, (li) => {
      const body = li.querySelector(".body");
      const status = li.querySelector("[data-testid=msg-status]");
      return {
        role: li.dataset.testid === "msg-user" ? "user" : li.dataset.testid === "msg-assistant" ? "assistant" : "?",
        text: body ? body.textContent : li.textContent,
        state: li.dataset.state || "",
        status: status && visible(status) ? status.textContent : "",
        final: li.getAttribute("aria-busy") === "false",
        reply_to: li.dataset.replyTo || "",
      };
    });
    const entry = { typing: visible(typing), items };
    const key = JSON.stringify(entry);
    if (key !== last) {
      last = key;
      timeline.push(entry);
    }
  };
  new MutationObserver(snapshot).observe(document, {
    subtree: true, childList: true, attributes: true, characterData: true,
  });
})();
"""


# ---------------------------------------------------------------- the gateway


@dataclass
class Gateway:
    """A running ``switchboard run`` process and where to reach it."""

    url: str
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def output(self) -> str:
        """What the process printed so far (stdout, then the tail of stderr), for failure messages."""
        err = self.stderr.read_text(errors="replace").splitlines()[-40:]
        return self.stdout.read_text(errors="replace") + "\n--- stderr (tail) ---\n" + "\n".join(err)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _health(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url + "healthz", timeout=2) as response:
            body: dict[str, Any] = json.loads(response.read())
            return body if response.status == 200 else None
    except (OSError, ValueError, urllib.error.URLError):
        return None


def _wait_ready(gateway: Gateway) -> None:
    """Poll until ``/healthz`` is 200 with a live worker and the web chat URL has been printed."""
    deadline = time.monotonic() + STARTUP_GUARD_S
    health: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        if gateway.process.poll() is not None:
            code = gateway.process.returncode
            pytest.fail(f"`switchboard run` exited with {code} during start-up:\n{gateway.output()}")
        health = _health(gateway.url)
        printed = f"Web chat:  {gateway.url}" in gateway.stdout.read_text(errors="replace")
        if health and int(health.get("workers", 0)) >= 1 and printed:
            return
        time.sleep(0.1)
    pytest.fail(
        f"`switchboard run` not ready after {STARTUP_GUARD_S:.0f} s (last /healthz: {health}); "
        f"expected 200 with workers >= 1 and 'Web chat:  {gateway.url}' printed:\n{gateway.output()}"
    )


def _stop(gateway: Gateway) -> None:
    """Ctrl-C, as a user stops it; it must exit 0 within ``STOP_GUARD_S``."""
    process = gateway.process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_GUARD_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"`switchboard run` did not stop within {STOP_GUARD_S:.0f} s of SIGINT:\n{gateway.output()}")
    assert process.returncode == 0, f"`switchboard run` exited with {process.returncode}:\n{gateway.output()}"
    assert "Switchboard stopped." in gateway.stdout.read_text(errors="replace"), gateway.output()


def run_gateway(
    root: Path, config: Path, *, delay_ms: int = OFFLINE_DELAY_MS, extra_env: dict[str, str] | None = None
) -> Iterator[Gateway]:
    """``python -m switchboard run`` on ``config`` (paths in it are relative to it), data under ``root``, until the
    caller is done; then Ctrl-C, and it must stop cleanly. ``extra_env`` adds variables (a provider's fake URL)."""
    if CHROMIUM is None:
        pytest.skip(SKIP_REASON)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))}
    port = _free_port()
    env.update(
        {
            "SWITCHBOARD_HOST": "127.0.0.1",
            "SWITCHBOARD_PORT": str(port),
            "SWITCHBOARD_DATA_DIR": str(root / "data"),
            "SWITCHBOARD_CONFIG": str(config),
            "SWITCHBOARD_OFFLINE__DELAY_MS": str(delay_ms),
            "SWITCHBOARD_ATTACHMENTS__MAX_BYTES": str(MAX_FILE_BYTES),
        }
        | (extra_env or {})
    )
    stdout, stderr = root / "stdout.txt", root / "stderr.txt"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "switchboard", "run"], env=env, cwd=root, stdout=out, stderr=err
        )
    running = Gateway(url=f"http://127.0.0.1:{port}/", process=process, stdout=stdout, stderr=stderr)
    try:
        _wait_ready(running)
        yield running
    finally:
        _stop(running)


@pytest.fixture(scope="module")
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """``python -m switchboard run`` with its own embedded server, a minimal YAML file and a slow offline model.

    A test module may set ``GATEWAY_CONFIG`` (YAML text) to run its gateway with another configuration.
    """
    root = tmp_path_factory.mktemp("gateway")
    config = root / "switchboard.yaml"
    config.write_text(getattr(request.module, "GATEWAY_CONFIG", MINIMAL_CONFIG))
    yield from run_gateway(root, config)


# ---------------------------------------------------------------- the browser


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the module (Debian's package; never a downloaded build)."""
    if CHROMIUM is None:
        pytest.skip(SKIP_REASON)
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


Snapshot = dict[str, Any]
"""One entry of a page's timeline: ``{"typing": bool, "items": [{"role", "text", "state", "status", "final",
"reply_to"}]}``."""


@dataclass
class ChatPage:
    """The chat page in one browser context, driven through its ``data-testid`` attributes."""

    page: Page
    url: str
    errors: list[str] = field(default_factory=list)

    async def open(self) -> None:
        """Load the page and wait until its event stream is connected."""
        await self.page.goto(self.url)
        await expect(self.page.get_by_test_id("connection-state")).to_have_text("Connected", timeout=GUARD_MS)

    async def reload(self) -> None:
        """Reload as a user would (F5); the page keeps its token in localStorage."""
        await self.page.reload()
        await expect(self.page.get_by_test_id("connection-state")).to_have_text("Connected", timeout=GUARD_MS)

    async def type_and_send(self, text: str, *, click: bool = False) -> None:
        """Type ``text`` in the composer, then press Enter (or click Send)."""
        box = self.page.get_by_test_id("composer-input")
        await box.fill(text)
        if click:
            await self.page.get_by_test_id("send-button").click()
        else:
            await box.press("Enter")

    async def wait_answered(self, count: int) -> None:
        """Wait until ``count`` replies are final and painted."""
        await self.page.wait_for_function(
            "n => document.querySelectorAll('[data-testid=msg-assistant][aria-busy=false]').length >= n",
            arg=count,
            timeout=GUARD_MS,
        )
        # The final text is painted on the next animation frame; two frames later it is certainly there.
        await self.page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")

    async def transcript(self) -> list[tuple[str, str]]:
        """``(role, text)`` of every bubble, top to bottom, as shown now."""
        items = await self.page.evaluate(
            """() => Array.from(document.querySelectorAll('[data-testid=message-list] > li'), (li) => [
                 li.dataset.testid, (li.querySelector('.body') || li).textContent])"""
        )
        return [("user" if role == "msg-user" else "assistant", text) for role, text in items]

    async def timeline(self) -> list[Snapshot]:
        """Every distinct state of the conversation since the page was (re)loaded."""
        entries: list[Snapshot] = await self.page.evaluate("() => window.__timeline")
        return entries

    async def session(self) -> str:
        """The session id this page keeps in localStorage."""
        value: str = await self.page.evaluate("() => JSON.parse(localStorage.getItem('switchboard.webchat')).session")
        return value


@pytest_asyncio.fixture(loop_scope="module")
async def open_chat(gateway: Gateway, browser: Browser) -> AsyncIterator[Callable[[], Awaitable[ChatPage]]]:
    """Open the chat in a fresh browser context (fresh storage: a new session); console errors fail the test."""
    contexts: list[BrowserContext] = []
    pages: list[ChatPage] = []

    async def opener() -> ChatPage:
        context = await browser.new_context(viewport={"width": 900, "height": 700})
        contexts.append(context)
        await context.add_init_script(RECORDER_JS)
        page = await context.new_page()
        chat = ChatPage(page=page, url=gateway.url)
        page.on("pageerror", lambda exc: chat.errors.append(str(exc)))
        page.on("console", lambda msg: chat.errors.append(msg.text) if msg.type == "error" else None)
        pages.append(chat)
        await chat.open()
        return chat

    yield opener
    for context in contexts:
        await context.close()
    errors = [error for chat in pages for error in chat.errors]
    assert errors == [], f"errors in the browser console: {errors}"


# ---------------------------------------------------------------- the operator console


@dataclass
class ConsolePage:
    """The console in its own browser context (its own cookies), driven through ``data-testid`` attributes."""

    page: Page
    url: str
    errors: list[str] = field(default_factory=list)

    async def sign_in(self, name: str, password: str) -> None:
        """Open ``/console`` (redirected to sign-in), sign in, and wait for the console."""
        await self.page.goto(self.url + "console")
        await expect(self.page).to_have_url(self.url + "console/login")
        await self.page.get_by_test_id("login-name").fill(name)
        await self.page.get_by_test_id("login-password").fill(password)
        await self.page.get_by_test_id("login-submit").click()
        await expect(self.page.get_by_test_id("operator-name")).to_contain_text(name, timeout=GUARD_MS)

    async def open_session(self, session: str) -> None:
        """Show a session's timeline and controls."""
        await self.page.get_by_test_id("tab-sessions").click()
        row = self.page.locator(f'[data-testid=session-row][data-key="{session}"]')
        await row.click(timeout=GUARD_MS)
        await expect(self.page.get_by_test_id("detail-key")).to_have_text(session, timeout=GUARD_MS)


@pytest_asyncio.fixture(loop_scope="module")
async def open_console(gateway: Gateway, browser: Browser) -> AsyncIterator[Callable[[], Awaitable[ConsolePage]]]:
    """A console page in a fresh browser context; errors in its console fail the test."""
    opened: list[ConsolePage] = []

    async def opener() -> ConsolePage:
        context = await browser.new_context(viewport={"width": 1200, "height": 800})
        page = await context.new_page()
        console = ConsolePage(page=page, url=gateway.url)
        page.on("pageerror", lambda exc: console.errors.append(str(exc)))
        page.on("console", lambda msg: console.errors.append(msg.text) if msg.type == "error" else None)
        opened.append(console)
        return console

    yield opener
    for console in opened:
        await console.page.context.close()
    errors = [error for console in opened for error in console.errors]
    assert errors == [], f"errors in the console page: {errors}"
