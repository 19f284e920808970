"""The console's Budgets, People and Schedules tabs in real Chromium against a real ``switchboard run``.

Spend comes from a real conversation's metered run (the offline model has a price), a person is linked in the page,
jobs are made through the console API, the YAML file and the page's own form, and a job's skipped occurrence says
why. Markup in a principal and in a job's text shows as text; a viewer sees no write control and a forced write is
``403``; nothing overflows the page sideways at 1280 px.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

import pytest
from playwright.async_api import expect

from switchboard.web.console.passwords import hash_password
from tests.browser.conftest import (
    CHROMIUM,
    GUARD_MS,
    OFFLINE_DELAY_MS,
    SKIP_REASON,
    ChatPage,
    ConsolePage,
    Gateway,
    run_gateway,
)
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

OpenChat = Callable[[], Awaitable[ChatPage]]
OpenConsole = Callable[[], Awaitable[ConsolePage]]
PASSWORD: Final = "operator password for the panels test"
HOSTILE: Final = "<img src=x onerror=alert(1)><b>bold</b>"
"""Markup in a job's text: the page shows it as text."""
HOSTILE_PRINCIPAL: Final = "slack:<img/src=x/onerror=alert(1)>"
"""A principal may hold any non-space characters after its channel."""
PANELS_CONFIG: Final = """
default_agent: assistant
agents:
  assistant:
    profile: {{name: Assistant}}
    instructions: You are a test assistant.
    tools: [current_time]
prices:
  offline: {{input: 1000, output: 1000}}
budgets:
  - {{scope: user, period: day, credits: 10000, alert_at: [0.001, 0.9]}}
  - {{scope: tenant, period: month, credits: 10000000}}
identity: {{self_link: true}}
schedules:
  - id: weekday-digest
    target: {{channel: web, conversation: digest-room}}
    action: turn
    text: summarise the open questions
    cron: "0 9 * * mon-fri"
    timezone: Europe/Berlin
console:
  operators:
    - name: alice
      password_hash: "{hash}"
      tenants: [default]
    - name: victor
      password_hash: "{hash}"
      tenants: [default]
      role: viewer
    - name: carol
      password_hash: "{hash}"
      tenants: [default]
"""
LOADED: Final = {
    "budgets": "[data-testid=budget-row], [data-testid=budgets-empty]:visible",
    "people": "[data-testid=person-row]",
    "schedules": "[data-testid=schedule-row]",
}
"""What shows once each panel has read its data."""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """``python -m switchboard run`` with budgets, schedules, identity, an operator and a viewer."""
    root = tmp_path_factory.mktemp("console-panels")
    config = root / "switchboard.yaml"
    config.write_text(PANELS_CONFIG.format(hash=hash_password(PASSWORD)))
    yield from run_gateway(root, config, delay_ms=OFFLINE_DELAY_MS // 3)


async def _signed_in(open_console: OpenConsole, name: str) -> ConsolePage:
    console = await open_console()
    await console.page.set_viewport_size({"width": 1280, "height": 800})
    await console.sign_in(name, PASSWORD)
    return console


async def _api(console: ConsolePage, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """Call ``/console/api/<path>`` from the page, with its sign-in cookie and CSRF token; ``(status, JSON body)``."""
    status, data = await console.page.evaluate(
        """async ([method, path, body]) => {
             const me = await (await fetch('/console/api/me')).json();
             const init = { method, headers: {} };
             if (method !== 'GET') {
               init.headers = { 'X-CSRF-Token': me.csrf, 'Content-Type': 'application/json' };
               init.body = JSON.stringify(body);
             }
             const response = await fetch('/console/api/' + path, init);
             return [response.status, await response.json()];
           }""",
        [method, path, body],
    )
    return int(status), data


def _forget_refusals(console: ConsolePage, *statuses: int) -> None:
    """Drop the browser's own log lines for responses a test provoked on purpose."""
    console.errors[:] = [e for e in console.errors if not any(f"status of {s}" in e for s in statuses)]


async def _no_markup(console: ConsolePage) -> None:
    assert await console.page.locator("main img, main b").count() == 0


async def test_the_budgets_tab_shows_the_spend_of_a_real_conversation(
    open_chat: OpenChat, open_console: OpenConsole
) -> None:
    chat = await open_chat()
    await chat.type_and_send("hello, how much does this cost?")
    await chat.wait_answered(1)
    console = await _signed_in(open_console, "alice")
    status, data = await _api(console, "GET", "budgets")
    assert status == 200
    user = next(b for b in data["budgets"] if b["scope"] == "user")
    assert user["spent"] > 0 and user["alerts"] == [0.001]  # the metered run crossed the first threshold only

    await console.page.get_by_test_id("tab-budgets").click()
    rows = console.page.get_by_test_id("budget-row")
    await expect(rows).to_have_count(len(data["budgets"]), timeout=GUARD_MS)
    shown = rows.and_(console.page.locator("[data-scope=user]"))
    await expect(shown).to_contain_text(user["subject"])
    await expect(shown).to_contain_text(user["period"])
    await expect(shown.locator("td").nth(5)).to_have_text("0.1%")  # the thresholds reported
    meter = shown.get_by_test_id("budget-bar")
    assert await meter.evaluate("m => [m.value, m.max]") == [pytest.approx(user["spent"]), user["credits"]]
    assert await shown.locator("td").nth(6).inner_text()  # when it resets
    alerts = console.page.get_by_test_id("budget-alert-row")
    await expect(alerts).to_have_count(len(data["alerts"]))
    await expect(alerts.first).to_contain_text(user["subject"])
    await expect(alerts.first).to_contain_text("0.1%")
    [figures] = data["agents"]  # the conversation's turn, by agent version: counted, timed and priced
    assert (figures["agent"], figures["tenant"], figures["turns"]) == ("assistant", "default", 1)
    assert figures["cost_per_task"] == pytest.approx(user["spent"]) and figures["p95_s"] > 0
    agent_row = console.page.get_by_test_id("agent-figures-row")
    await expect(agent_row).to_have_count(1)
    await expect(agent_row).to_contain_text(figures["version"])

    # another run: the tab reads again while it is shown, without a click
    await chat.type_and_send("and once more")
    await chat.wait_answered(2)
    spent_before = await meter.evaluate("m => m.value")
    await console.page.wait_for_function(
        "v => document.querySelector('[data-testid=budget-row][data-scope=user] meter').value > v",
        arg=spent_before,
        timeout=GUARD_MS,
    )


async def test_an_operator_links_and_unlinks_a_person_in_the_page(open_console: OpenConsole) -> None:
    console = await _signed_in(open_console, "alice")
    await console.page.get_by_test_id("tab-people").click()
    form = console.page.get_by_test_id("people-link")
    await expect(form.get_by_test_id("people-tenant")).to_have_value("default")

    # a bad person id: a clear error, nothing linked
    await form.get_by_test_id("people-principals").fill("telegram:42")
    await form.get_by_test_id("people-person").fill("Not A Person")
    await form.get_by_test_id("people-link-button").click()
    await expect(console.page.get_by_test_id("notice")).to_contain_text("person id", timeout=GUARD_MS)
    assert (await _api(console, "GET", "people"))[1] == {"people": []}
    _forget_refusals(console, 400)

    await form.get_by_test_id("people-principals").fill(f"telegram:42 {HOSTILE_PRINCIPAL}")
    await form.get_by_test_id("people-person").fill("dana")
    await form.get_by_test_id("people-link-button").click()
    person = console.page.locator("[data-testid=person-row][data-person=dana]")
    await expect(person.get_by_test_id("person-principal")).to_have_count(2, timeout=GUARD_MS)
    await expect(person).to_contain_text(HOSTILE_PRINCIPAL)  # markup shown as text
    await _no_markup(console)
    status, people = await _api(console, "GET", "people")
    assert status == 200
    assert people["people"] == [
        {"tenant": "default", "person": "dana", "principals": sorted(["telegram:42", HOSTILE_PRINCIPAL])}
    ]

    await person.locator('[data-principal="telegram:42"]').get_by_test_id("people-unlink").click()
    await expect(person.get_by_test_id("person-principal")).to_have_count(1, timeout=GUARD_MS)
    status, people = await _api(console, "GET", "people")
    assert people["people"] == [{"tenant": "default", "person": "dana", "principals": [HOSTILE_PRINCIPAL]}]


async def test_the_schedules_tab_lists_jobs_says_why_one_was_not_delivered_and_manages_them(
    open_console: OpenConsole,
) -> None:
    console = await _signed_in(open_console, "alice")
    job = {
        "id": "renewal-reminder",
        "target": {"channel": "whatsapp", "conversation": "4915550001"},
        "action": "message",
        "text": HOSTILE,
        "cron": "30 8 * * *",
        "timezone": "Europe/Paris",
    }
    status, made = await _api(console, "POST", "schedules", job)
    assert status == 201, made
    await console.page.get_by_test_id("tab-schedules").click()
    reminder = console.page.locator("[data-testid=schedule-row][data-id=renewal-reminder]")
    await expect(reminder).to_contain_text(HOSTILE, timeout=GUARD_MS)  # markup shown as text
    await _no_markup(console)
    await expect(reminder).to_contain_text("cron 30 8 * * * (Europe/Paris)")
    await expect(reminder).to_contain_text(made["result"]["session"])
    await expect(reminder.get_by_test_id("schedule-outcome")).to_have_text("not run yet")
    digest = console.page.locator("[data-testid=schedule-row][data-id=weekday-digest]")  # from the YAML file
    await expect(digest).to_contain_text("runs a turn on")
    await expect(digest).to_contain_text("cron 0 9 * * mon-fri (Europe/Berlin)")

    # run now: WhatsApp's window is closed and the job has no template, so the occurrence is not delivered, and why
    await reminder.get_by_test_id("schedule-run-now").click()
    await expect(reminder.get_by_test_id("schedule-outcome")).to_have_text("skipped", timeout=GUARD_MS)
    reason = reminder.get_by_test_id("schedule-reason")
    await expect(reason).to_contain_text("window_closed: outside WhatsApp's 24-hour window (the user never wrote)")
    [listed] = [j for j in (await _api(console, "GET", "schedules"))[1]["schedules"] if j["id"] == "renewal-reminder"]
    assert listed["last_outcome"] == "skipped" and await reason.inner_text() == listed["last_reason"]

    # a one-off job made with the page's form
    form = console.page.get_by_test_id("schedule-add")
    await form.get_by_test_id("schedule-id").fill("new-year")
    await form.get_by_test_id("schedule-channel").fill("web")
    await form.get_by_test_id("schedule-conversation").fill("party-room")
    await form.get_by_test_id("schedule-text").fill("Happy new year!")
    await form.get_by_test_id("schedule-when").select_option("at")
    await form.get_by_test_id("schedule-schedule").fill("2031-01-01T00:00:00")
    await form.get_by_test_id("schedule-timezone").fill("Europe/Berlin")
    await form.get_by_test_id("schedule-add-button").click()
    added = console.page.locator("[data-testid=schedule-row][data-id=new-year]")
    await expect(added).to_contain_text("once at 2031-01-01T00:00:00", timeout=GUARD_MS)
    [stored] = [j for j in (await _api(console, "GET", "schedules"))[1]["schedules"] if j["id"] == "new-year"]
    assert stored["action"] == "message" and stored["created_by"] == "console:alice"
    assert stored["next_at"] == 1924988400.0  # 2031-01-01 00:00 in Berlin is 2030-12-31 23:00 UTC

    await added.get_by_test_id("schedule-remove").click()
    await expect(added).to_have_count(0, timeout=GUARD_MS)
    ids = {j["id"] for j in (await _api(console, "GET", "schedules"))[1]["schedules"]}
    assert ids == {"weekday-digest", "renewal-reminder"}


async def test_a_viewer_sees_the_panels_without_write_controls_and_a_forced_write_is_refused(
    open_console: OpenConsole,
) -> None:
    alice = await _signed_in(open_console, "alice")
    status, _ = await _api(
        alice, "POST", "people/link", {"tenant": "default", "principals": ["web:v1"], "person": "vi"}
    )
    assert status == 200
    viewer = await _signed_in(open_console, "victor")
    page = viewer.page
    writes = {
        "budgets": ((), ()),
        "people": (("people-link",), ("people-unlink",)),
        "schedules": (("schedule-add",), ("schedule-run-now", "schedule-remove")),
        "access": (("access-approve",), ("access-revoke",)),
    }
    for tab, (forms, buttons) in writes.items():
        await page.get_by_test_id(f"tab-{tab}").click()
        if tab in LOADED:
            await expect(page.locator(LOADED[tab]).first).to_be_visible(timeout=GUARD_MS)
        for form in forms:
            await expect(page.get_by_test_id(form)).to_be_hidden()
        for control in buttons:
            assert await page.get_by_test_id(control).count() == 0, control
    await page.get_by_test_id("tab-people").click()
    await expect(page.locator("[data-testid=person-row][data-person=vi]")).to_be_visible(timeout=GUARD_MS)
    assert await page.get_by_test_id("people-unlink").count() == 0

    before = await _api(viewer, "GET", "people"), await _api(viewer, "GET", "schedules")
    for path, body in (
        ("people/link", {"tenant": "default", "principals": ["telegram:99"], "person": "mallory"}),
        ("people/unlink", {"tenant": "default", "principal": "web:v1"}),
        ("schedules/run-now", {"id": "renewal-reminder"}),
        ("schedules/remove", {"id": "weekday-digest"}),
    ):
        status, refused = await _api(viewer, "POST", path, body)
        assert (status, refused["error"]["code"]) == (403, "viewer"), path
    _forget_refusals(viewer, 403)
    assert (await _api(viewer, "GET", "people"), await _api(viewer, "GET", "schedules")) == before


async def test_no_panel_overflows_sideways_at_1280_px(open_console: OpenConsole) -> None:
    console = await _signed_in(open_console, "alice")
    long_principal = "telegram:" + "9" * 150
    link = {"tenant": "default", "principals": [long_principal], "person": "long-" + "x" * 59}
    assert (await _api(console, "POST", "people/link", link))[0] == 200
    job = {
        "id": "long-" + "y" * 59,
        "target": {"channel": "web", "conversation": "z" * 200},
        "action": "message",
        "text": "w" * 600,
        "at": "2031-06-01T12:00:00",
    }
    assert (await _api(console, "POST", "schedules", job))[0] == 201
    page = console.page
    for tab in (
        "sessions",
        "approvals",
        "dead",
        "effects",
        "agents",
        "usage",
        "access",
        "budgets",
        "people",
        "schedules",
    ):
        await page.get_by_test_id(f"tab-{tab}").click()
        await expect(page.locator(f"[data-panel={tab}]")).to_be_visible()
        if tab in LOADED:
            await expect(page.locator(LOADED[tab]).first).to_be_visible(timeout=GUARD_MS)
        widths = await page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[0] <= widths[1] == 1280, f"the {tab} tab is {widths[0]} px wide"
    await expect(page.get_by_test_id("schedule-row").filter(has_text="w" * 600)).to_have_count(1)


async def test_a_tab_picked_while_the_console_loads_stays_shown(open_console: OpenConsole) -> None:
    """The first sessions read comes back after the operator opened another tab: the console stays on that tab."""
    console = await open_console()
    await console.page.set_viewport_size({"width": 1280, "height": 800})
    held: list[Any] = []

    async def hold(route: Any) -> None:
        held.append(route)

    await console.page.route("**/console/api/sessions", hold)
    await console.sign_in("carol", PASSWORD)  # an operator of her own: no live console of another test counts
    await wait_until(lambda: bool(held), "the console's first sessions read", timeout=GUARD_MS / 1000)
    await console.page.get_by_test_id("tab-budgets").click()
    for route in held:
        await route.continue_()
    await console.page.unroute("**/console/api/sessions")
    await expect(console.page.locator(LOADED["budgets"]).first).to_be_visible(timeout=GUARD_MS)
    await expect(console.page.get_by_test_id("tab-budgets")).to_have_attribute("aria-current", "page")
