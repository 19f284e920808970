"""Declared REST tool call overhead (issue #23): the tool gateway + egress forwarder vs a raw aiohttp client call.

One local aiohttp server answers ``GET /v1/orders/{id}`` with a small JSON document. The baseline is a plain
``aiohttp.ClientSession`` (kept open, as any client would) calling it; the measured path is the declared tool
``get_order`` called through ``ToolGateway.call``: argument validation against the declared JSON Schema, policy,
the egress forwarder (a grant for the agent, the allowlist, the address check on every resolution, the egress fact)
and the result projection. Both run in the same process, interleaved, against the same server.

    python -m bench.rest_overhead
    python -m bench.rest_overhead --quick
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from bench._harness import SUMMARY_HEADERS, Row, fmt, median, parser, percentile, render_table, rounds_of, verdicts
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.egress.events import EgressRequested
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy
from switchboard.egress.transport import EgressTransport, register_rest_tools
from switchboard.settings import load_settings
from switchboard.types import SessionKey

CALLS, QUICK_CALLS = 500, 50
WARMUP = 20

CONFIG = """
default_agent: shop
agents:
  shop:
    profile: {{name: Shop}}
    instructions: bench
    egress: {{allow: [localhost]}}
    rest_tools:
      - name: get_order
        description: One order by id.
        method: GET
        url: http://localhost:{port}/v1/orders/{{order_id}}
        parameters:
          type: object
          required: [order_id]
          additionalProperties: false
          properties:
            order_id: {{type: string, pattern: "^O[0-9]+$"}}
        result: {{pointer: /order, fields: {{id: /id, status: /status}}}}
"""


class _NoSink:
    async def record(self, event: EgressRequested) -> None:
        return None


async def _order(request: web.Request) -> web.Response:
    oid = request.match_info["oid"]
    return web.json_response({"order": {"id": oid, "status": "open", "total": {"amount": 12.5}}, "meta": {}})


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its table, return the summary rows."""
    ns = parser(__doc__.splitlines()[0] if __doc__ else "rest_overhead").parse_args(argv)
    calls = QUICK_CALLS if ns.quick else CALLS
    rounds = rounds_of(ns)
    app = web.Application()
    app.router.add_get("/v1/orders/{oid}", _order)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(f"rest_overhead: {rounds} round(s) of {calls} calls each way, interleaved", flush=True)
    with tempfile.TemporaryDirectory(prefix="sb-bench-rest-") as tmp:
        config = Path(tmp) / "switchboard.yaml"
        config.write_text(CONFIG.format(port=port))
        settings = load_settings(
            {
                "SWITCHBOARD_CONFIG": str(config),
                "SWITCHBOARD_DATA_DIR": str(Path(tmp) / "data"),
                "SWITCHBOARD_EGRESS__PORTS": str(port),
                "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": "127.0.0.0/8,::1/128",
            }
        )
        forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, _NoSink())
        registry = ToolRegistry()
        register_rest_tools(registry, settings, EgressTransport(forwarder))
        gateway = ToolGateway(registry, workspace_root=Path(tmp) / "ws")
        ctx = ToolContext(
            session_key=SessionKey("default/shop/web/main/bench"),
            tenant="default",
            run_id="bench",
            actor="web:u1",
            workspace=Path(tmp) / "ws" / "bench",
            idempotency_key="",
            agent="shop",
        )
        raw_ms: list[float] = []
        tool_ms: list[float] = []
        async with aiohttp.ClientSession() as client:

            async def raw(n: int) -> float:
                started = time.perf_counter()
                async with client.get(f"http://localhost:{port}/v1/orders/O{n}") as resp:
                    body = await resp.json()
                assert resp.status == 200 and body["order"]["id"] == f"O{n}"
                return (time.perf_counter() - started) * 1000

            async def tool(n: int) -> float:
                started = time.perf_counter()
                out = await gateway.call("get_order", {"order_id": f"O{n}"}, ctx)
                assert out.ok and out.value == {"id": f"O{n}", "status": "open"}, out.error
                return (time.perf_counter() - started) * 1000

            for n in range(WARMUP):
                await raw(n)
                await tool(n)
            for _ in range(rounds):
                for n in range(calls):
                    raw_ms.append(await raw(n))
                    tool_ms.append(await tool(n))
        await forwarder.close()
    await runner.cleanup()
    raw_p50, tool_p50 = median(raw_ms), median(tool_ms)
    raw_p95, tool_p95 = percentile(raw_ms, 95), percentile(tool_ms, 95)
    print(
        render_table(
            f"one GET to a local aiohttp server ({len(raw_ms)} calls each way)",
            ("path", "p50 (ms)", "p95 (ms)", "ratio p50", "ratio p95"),
            [
                ("raw aiohttp client", fmt(raw_p50, 3), fmt(raw_p95, 3), "1.0×", "1.0×"),
                (
                    "declared REST tool (gateway + egress)",
                    fmt(tool_p50, 3),
                    fmt(tool_p95, 3),
                    f"{tool_p50 / raw_p50:.1f}×",
                    f"{tool_p95 / raw_p95:.1f}×",
                ),
            ],
        )
    )
    print(f"added per call (p50): {fmt(tool_p50 - raw_p50, 3)} ms")
    rows = verdicts(
        [Row("rest_overhead", "declared tool call p50 overhead", f"{fmt(tool_p50 - raw_p50, 3)} ms", "measured", None)],
        ns.quick,
    )
    print(render_table("summary", SUMMARY_HEADERS, [row.cells() for row in rows]))
    return rows


if __name__ == "__main__":
    asyncio.run(run())
