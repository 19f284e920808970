"""The tool gateway: validation, authorisation, retries, circuit breakers, output tiers, idempotency."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.tools.builtin import ToolRegistry, default_registry
from switchboard.core.tools.builtin.clock import TOOLS as CLOCK
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.gateway import (
    CallScope,
    CircuitBreaker,
    ToolGateway,
    data_card,
    idempotency_key,
    workspace_for,
)
from switchboard.core.workspaces.disk import DIRECTORY_BYTES, Quotas, Workspaces
from switchboard.errors import RateLimitedError, ToolError
from switchboard.types import SessionKey
from tests.core.turns import Empty, Payload, make_tool


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ctx(tmp_path: Path, **kw: Any) -> ToolContext:
    values: dict[str, Any] = {
        "session_key": SessionKey("t/a/web/default/c"),
        "tenant": "t",
        "run_id": "run-1",
        "actor": "u",
        "workspace": tmp_path / "ws",
        "idempotency_key": "",
    }
    values.update(kw)
    return ToolContext(**values)


def gateway(tmp_path: Path, *tools: Tool, **kw: Any) -> ToolGateway:
    kw.setdefault("backoff_base_s", 0.0)
    return ToolGateway(ToolRegistry([*CLOCK, *tools]), workspace_root=tmp_path, **kw)


def failing(error: BaseException, runs: list[int], *, succeed_after: int | None = None, **kw: Any) -> Tool:
    async def fn(args: Empty, c: ToolContext) -> Any:
        runs.append(1)
        if succeed_after is not None and len(runs) > succeed_after:
            return {"ok": len(runs)}
        raise error

    return make_tool(kw.pop("name", "fails"), fn, **kw)


# ---------------------------------------------------------------- resolve and validate


async def test_unknown_tool_is_a_correctable_error_naming_the_tools(tmp_path: Path) -> None:
    out = await gateway(tmp_path).call("curent_time", {}, ctx(tmp_path))
    assert (out.ok, out.error_class, out.correctable) == (False, "validation", True)
    assert "current_time" in (out.error or "")
    assert json.loads(out.for_model())["error_class"] == "validation"


async def test_tool_outside_the_agents_list_is_refused(tmp_path: Path) -> None:
    runs: list[int] = []
    tool = failing(RuntimeError("x"), runs, name="secret")
    out = await gateway(tmp_path, tool).call("secret", {}, ctx(tmp_path), scope=CallScope(allowed=frozenset({"a"})))
    assert out.error_class == "validation" and runs == []


async def test_validation_errors_name_the_field_and_nothing_runs(tmp_path: Path) -> None:
    runs: list[int] = []

    async def fn(args: Payload, c: ToolContext) -> Any:
        runs.append(args.n)
        return args.n

    gw = gateway(tmp_path, make_tool("count", fn, input=Payload))
    out = await gw.call("count", {"n": "many"}, ctx(tmp_path))
    assert out.error_class == "validation" and "n:" in (out.error or "")
    bad_zone = await gw.call("current_time", {"timezone": "Mars/Olympus"}, ctx(tmp_path))
    assert bad_zone.error_class == "validation"
    assert "timezone" in (bad_zone.error or "") and "IANA" in (bad_zone.error or "")
    extra = await gw.call("current_time", {"tz": "UTC"}, ctx(tmp_path))
    assert extra.error_class == "validation" and "tz" in (extra.error or "")
    raw = await gw.call("count", {"_raw": "{not json"}, ctx(tmp_path))
    assert raw.error_class == "validation" and "not a JSON object" in (raw.error or "")
    assert runs == []
    assert (await gw.call("count", {"n": 3}, ctx(tmp_path))).value == 3


async def test_authorisation_is_checked_outside_the_model(tmp_path: Path) -> None:
    runs: list[int] = []
    tool = failing(RuntimeError("never"), runs, succeed_after=0, name="admin", permission="admin")
    gw = gateway(tmp_path, tool)
    denied = await gw.call("admin", {}, ctx(tmp_path))
    assert (denied.ok, denied.error_class, runs) == (False, "auth", [])
    allowed = await gw.call("admin", {}, ctx(tmp_path, permissions=frozenset({"admin"})))
    assert allowed.ok and runs == [1]


# ---------------------------------------------------------------- errors and retries


async def test_transient_errors_are_retried_until_success(tmp_path: Path) -> None:
    runs: list[int] = []
    gw = gateway(tmp_path, failing(ConnectionError("reset"), runs, succeed_after=2))
    out = await gw.call("fails", {}, ctx(tmp_path))
    assert out.ok and out.attempts == 3 and len(runs) == 3


async def test_retries_stop_at_max_attempts(tmp_path: Path) -> None:
    runs: list[int] = []
    out = await gateway(tmp_path, failing(ToolError("busy", error_class="transient"), runs)).call(
        "fails", {}, ctx(tmp_path)
    )
    assert (out.ok, out.error_class, out.attempts, len(runs)) == (False, "transient", 3, 3)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ToolError("bad id", error_class="validation"), "validation"),
        (PermissionError("no"), "auth"),
        (KeyError("missing"), "permanent"),
        (ToolError("gone", error_class="permanent"), "permanent"),
    ],
)
async def test_non_retryable_classes_run_once(tmp_path: Path, error: BaseException, expected: str) -> None:
    runs: list[int] = []
    tool = failing(error, runs, retry_on=frozenset({"validation", "auth", "permanent", "transient"}))
    out = await gateway(tmp_path, tool).call("fails", {}, ctx(tmp_path))
    assert out.error_class == expected
    assert len(runs) == (1 if expected in {"validation", "auth"} else 3)


async def test_a_tool_without_retry_classes_is_never_retried(tmp_path: Path) -> None:
    runs: list[int] = []
    out = await gateway(tmp_path, failing(ConnectionError("x"), runs, retry_on=frozenset())).call(
        "fails", {}, ctx(tmp_path)
    )
    assert out.error_class == "transient" and len(runs) == 1


async def test_timeouts_retry_reads_but_not_writes(tmp_path: Path) -> None:
    runs: list[str] = []

    def slow(name: str, side_effect: str) -> Tool:
        async def fn(args: Empty, c: ToolContext) -> Any:
            runs.append(name)
            await asyncio.sleep(10)

        return make_tool(name, fn, side_effect=side_effect, timeout_s=0.01)

    gw = gateway(tmp_path, slow("read_slow", "read"), slow("write_slow", "write"))
    read = await gw.call("read_slow", {}, ctx(tmp_path))
    write = await gw.call("write_slow", {}, ctx(tmp_path))
    assert (read.error_class, read.attempts) == ("transient", 3)
    assert (write.error_class, write.attempts) == ("ambiguous_timeout", 1)
    assert "did not finish within" in (write.error or "")
    assert runs.count("read_slow") == 3 and runs.count("write_slow") == 1


async def test_rate_limits_honour_retry_after(tmp_path: Path) -> None:
    gw = gateway(tmp_path, backoff_base_s=0.01, max_retry_wait_s=5)
    assert all(gw.backoff_s(1, 2.5) >= 2.5 for _ in range(20))
    runs: list[int] = []
    tool = failing(RateLimitedError("429", channel="x", retry_after=60), runs)
    out = await gateway(tmp_path, tool, max_retry_wait_s=5).call("fails", {}, ctx(tmp_path))
    assert out.error_class == "rate_limit" and len(runs) == 1  # waiting 60 s is not worth it inside a turn
    runs2: list[int] = []
    tool2 = failing(ToolError("slow down", error_class="rate_limit", retry_after=0.0), runs2, succeed_after=1)
    assert (await gateway(tmp_path, tool2).call("fails", {}, ctx(tmp_path))).ok and len(runs2) == 2


def test_backoff_is_exponential_with_full_jitter(tmp_path: Path) -> None:
    gw = gateway(tmp_path, backoff_base_s=0.1, backoff_cap_s=0.5)
    samples = {attempt: [gw.backoff_s(attempt) for _ in range(200)] for attempt in (1, 2, 3, 6)}
    assert all(0 <= s <= 0.1 for s in samples[1]) and max(samples[2]) > 0.1 and max(samples[2]) <= 0.2
    assert max(samples[6]) <= 0.5 and min(samples[3]) < max(samples[3])


async def test_cancellation_reaches_the_running_tool(tmp_path: Path) -> None:
    started, seen = asyncio.Event(), []

    async def fn(args: Empty, c: ToolContext) -> Any:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = asyncio.create_task(gateway(tmp_path, make_tool("wait", fn)).call("wait", {}, ctx(tmp_path)))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]


# ---------------------------------------------------------------- circuit breakers


async def test_breaker_opens_after_consecutive_failures_then_half_opens(tmp_path: Path) -> None:
    clock = Clock()
    runs: list[int] = []
    tool = failing(ConnectionError("down"), runs, connector="crm", retry_on=frozenset())
    gw = gateway(tmp_path, tool, breaker_threshold=3, breaker_cooldown_s=30, clock=clock)
    for _ in range(3):
        assert (await gw.call("fails", {}, ctx(tmp_path))).error_class == "transient"
    assert gw.breaker("crm").state == "open"
    refused = await gw.call("fails", {}, ctx(tmp_path))
    assert refused.error_class == "circuit_open" and len(runs) == 3
    assert (await gw.call("current_time", {}, ctx(tmp_path))).ok  # other connectors are unaffected

    clock.now += 31
    assert gw.breaker("crm").state == "half_open"
    assert (await gw.call("fails", {}, ctx(tmp_path))).error_class == "transient"  # the probe ran and failed
    assert len(runs) == 4 and gw.breaker("crm").state == "open"
    assert (await gw.call("fails", {}, ctx(tmp_path))).error_class == "circuit_open"


def test_breaker_probe_success_closes_it() -> None:
    clock = Clock()
    breaker = CircuitBreaker(threshold=2, cooldown_s=10, clock=clock)
    breaker.record_failure()
    assert breaker.allow()
    breaker.record_failure()
    assert not breaker.allow()
    clock.now += 10
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.record_success()
    assert breaker.state == "closed" and breaker.allow()


async def test_validation_and_permanent_errors_do_not_trip_the_breaker(tmp_path: Path) -> None:
    runs: list[int] = []
    tool = failing(KeyError("nope"), runs, retry_on=frozenset())
    gw = gateway(tmp_path, tool, breaker_threshold=2)
    for _ in range(4):
        assert (await gw.call("fails", {}, ctx(tmp_path))).error_class == "permanent"
    assert gw.breaker("fails").state == "closed" and gw.breaker("fails").failures == 0 and len(runs) == 4


# ---------------------------------------------------------------- output tiers


def returning(value: Any, name: str = "data") -> Tool:
    async def fn(args: Empty, c: ToolContext) -> Any:
        return value

    return make_tool(name, fn)


async def test_small_results_are_inline(tmp_path: Path) -> None:
    scope = CallScope()
    out = await gateway(tmp_path, returning({"a": 1})).call("data", {}, ctx(tmp_path), scope=scope)
    assert (out.tier, out.value, out.variable, out.file) == ("inline", {"a": 1}, None, None)
    assert json.loads(out.for_model()) == {"a": 1}
    assert scope.variables == {}


async def test_large_results_become_a_data_card_bound_to_a_variable(tmp_path: Path) -> None:
    rows = [{"id": i, "name": f"row {i}", "tags": ["x", "y"]} for i in range(100)]
    scope = CallScope()
    gw = gateway(tmp_path, returning(rows))
    out = await gw.call("data", {}, ctx(tmp_path), scope=scope)
    assert (out.tier, out.variable, out.file) == ("card", "result_1", None)
    assert scope.variables["result_1"] == rows
    card = out.value
    assert card["type"] == "list" and card["length"] == 100 and card["columns"] == ["id", "name", "tags"]
    assert card["sample"][0]["name"] == "row 0"
    assert [row["name"] for row in card["sample_tail"]] == ["row 98", "row 99"]  # the end is not lost
    shown = out.for_model(codeact=True)
    assert len(shown) < 2048 and "result_1" in shown and "row 99" in shown and "row 50" not in shown
    again = await gw.call("data", {}, ctx(tmp_path), scope=scope)
    assert again.variable == "result_2"
    assert not (tmp_path / "ws").exists()


async def test_very_large_results_are_also_written_to_the_workspace(tmp_path: Path) -> None:
    text = "line of a long report\n" * 5000
    scope = CallScope()
    out = await gateway(tmp_path, returning(text, "report")).call("report", {}, ctx(tmp_path), scope=scope)
    assert out.tier == "file" and out.variable == "result_1" and out.file is not None
    assert not Path(out.file).is_absolute() and out.file.startswith("results/report-")
    assert json.loads((tmp_path / "ws" / out.file).read_text()) == text
    assert out.value["type"] == "text" and out.value["chars"] == len(text)
    assert out.file in out.for_model() and "read_file" in json.loads(out.for_model())["pages"]


def test_data_cards_stay_small_whatever_the_value() -> None:
    wide = [{f"column_{c}": "x" * 100 for c in range(60)} for _ in range(50)]
    for value in (wide, {f"k{i}": "v" * 500 for i in range(100)}, "y" * 100_000, 12345):
        card = data_card(value, size_bytes=10**6)
        assert len(json.dumps(card)) <= 1600


# ---------------------------------------------------------------- idempotency and workspaces


async def test_idempotency_keys_derive_from_run_and_logical_action(tmp_path: Path) -> None:
    keys: list[str] = []

    async def fn(args: Payload, c: ToolContext) -> Any:
        keys.append(c.idempotency_key)
        return "done"

    gw = gateway(tmp_path, make_tool("send", fn, input=Payload, side_effect="write"))
    first = await gw.call("send", {"n": 1}, ctx(tmp_path), scope=CallScope())
    await gw.call("send", {"n": 2}, ctx(tmp_path), scope=CallScope())
    expected = hashlib.sha256(b'run-1\nsend\n{"n":1}').hexdigest()
    assert keys[0] == expected == first.idempotency_key == idempotency_key("run-1", "send", {"n": 1})
    assert keys[1] == idempotency_key("run-1", "send", {"n": 2}) != keys[0]  # another action, another key
    await gw.call("send", {"n": 1}, ctx(tmp_path, run_id="run-2"), scope=CallScope())
    assert keys[2] not in keys[:2]  # another run, another key


def test_workspace_paths_are_digests_under_the_root(tmp_path: Path) -> None:
    found = workspace_for(tmp_path, "t/a/web/default/c1")
    assert found.parent.parent == tmp_path and found == workspace_for(tmp_path, "t/a/web/default/c1")
    assert found.parent == workspace_for(tmp_path, "t/other/web/default/c2").parent  # one directory per tenant
    assert found.parent != workspace_for(tmp_path, "u/a/web/default/c1").parent
    sneaky = workspace_for(tmp_path, "t/a/web/../..")
    assert sneaky.resolve().is_relative_to(tmp_path.resolve()) and ".." not in sneaky.parts


# ---------------------------------------------------------------- native tools: breakers, paths, previews


def test_native_tool_families_have_breakers_of_their_own() -> None:
    tools = {tool.name: tool for tool in default_registry()}
    keys = {name: tools[name].breaker_key for name in ("read_document", "list_files", "current_time", "update_plan")}
    assert len(set(keys.values())) == 4, keys
    assert keys["read_document"] == "documents" and keys["list_files"] == "files"


async def test_a_failing_connector_does_not_pause_other_tools_for_any_session(tmp_path: Path) -> None:
    from switchboard.core.tools.builtin.files import TOOLS as FILES

    runs: list[int] = []
    parser = failing(TimeoutError(), runs, name="parse", connector="documents")
    gw = ToolGateway(ToolRegistry([*CLOCK, *FILES, parser]), workspace_root=tmp_path, backoff_base_s=0.0)
    for _ in range(5):
        assert not (await gw.call("parse", {}, ctx(tmp_path))).ok
    assert gw.breaker("documents").state == "open"
    other = ctx(tmp_path, session_key=SessionKey("t/a/web/default/other"), workspace=tmp_path / "other")
    assert (await gw.call("current_time", {}, other)).ok
    listed = await gw.call("list_files", {}, other)
    assert listed.ok and listed.value["entries"] == []


async def test_errors_never_show_host_paths(tmp_path: Path) -> None:
    from switchboard.core.tools.builtin.files import TOOLS as FILES

    async def leaks(args: Empty, c: ToolContext) -> Any:
        raise OSError(f"cannot open {c.workspace.resolve() / 'inbox' / 'x.txt'} or {tmp_path}/elsewhere")

    gw = gateway(tmp_path, *FILES, make_tool("leaks", leaks, retry_on=frozenset()))
    here = ctx(tmp_path)
    outcomes = [
        await gw.call("write_file", {"path": "n" * 300 + ".txt", "content": "x"}, here),
        await gw.call("read_file", {"path": "d" * 300 + "/x.txt"}, here),
        await gw.call("list_files", {"path": "e" * 300}, here),
        await gw.call("leaks", {}, here),
    ]
    for outcome in outcomes:
        assert not outcome.ok
        shown = outcome.for_model()
        assert str(tmp_path) not in shown and "/tmp" not in shown, shown
    assert "a name in the path is 304 bytes long, over the most of 255" in (outcomes[0].error or "")
    assert "inbox/x.txt" in (outcomes[3].error or "")


async def test_a_saved_result_can_be_paged_through_without_a_new_card(tmp_path: Path) -> None:
    from switchboard.core.tools.builtin.files import TOOLS as FILES

    report = "".join(f"line {i:05d}\n" for i in range(20_000))
    scope = CallScope()
    gw = gateway(tmp_path, *FILES, returning(report, "report"))
    saved = await gw.call("report", {}, ctx(tmp_path), scope=scope)
    assert saved.tier == "file" and saved.file is not None
    pieces: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = await gw.call(
            "read_file", {"path": saved.file, "offset": offset, "max_chars": 100_000}, ctx(tmp_path), scope=scope
        )
        assert page.ok and page.tier == "inline" and page.variable is None and page.file is None
        pieces.append(page.value["content"])
        nxt = page.value.get("next")
        offset = page.value["end"] if nxt else None
    assert json.loads("".join(pieces)) == report
    assert len(scope.variables) == 1  # only the original result


async def test_very_large_results_count_against_the_workspace_quota(tmp_path: Path) -> None:
    text = "y" * 200_000
    tight = Workspaces(tmp_path, Quotas(session_bytes=100_000))
    scope = CallScope()
    out = await gateway(tmp_path, returning(text, "big"), workspaces=tight).call(
        "big", {}, ctx(tmp_path, workspace=tight.path("t/a/web/default/c")), scope=scope
    )
    assert out.ok and out.tier == "card" and out.file is None and scope.variables["result_1"] == text
    assert "quota" in out.value["not_saved"] and str(tmp_path) not in out.for_model()
    roomy = Workspaces(tmp_path, Quotas())
    saved = await gateway(tmp_path, returning(text, "big"), workspaces=roomy).call(
        "big", {}, ctx(tmp_path, workspace=roomy.path("t/a/web/default/c")), scope=CallScope()
    )
    assert saved.tier == "file" and roomy.total_bytes() == len(json.dumps(text)) + DIRECTORY_BYTES  # + results/
