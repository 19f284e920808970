"""A declared REST tool in a whole turn: the offline model's ``/tool``, the worker's runtime, the real drain."""

from __future__ import annotations

import json
from pathlib import Path

import redis.asyncio as aioredis

from switchboard.cli.worker import build_runtime
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy
from switchboard.egress.transport import EgressTransport
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from tests.egress.conftest import PUBLIC, ListSink, MapResolver
from tests.queue.conftest import RecordingDeliverer, make_message
from tests.rest.conftest import SHOP_TOKEN, serve_shop, shop_settings


async def test_a_turn_calls_a_declared_rest_tool_through_egress(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    async with serve_shop(tmp_path) as (api, port, ca):
        settings = shop_settings(tmp_path, port, ca)
        sink = ListSink()
        resolver = MapResolver({"api.shop.test": [[PUBLIC]]})
        forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, sink, resolver=resolver)
        try:
            runtime = build_runtime(settings, ModelFactory(ProviderConfig()), rest=EgressTransport(forwarder))
            agent = settings.file.agents["shop"].model_copy(update={"model": "offline"})
            drainer = Drainer(
                client,
                queue_settings,
                runner=runtime.run_turn,
                deliverer=deliverer,
                agent_for=lambda m: agent,
                worker_id="w1",
            )
            args = {"customer_id": "C123456", "status": "shipped"}
            message = make_message("/tool search_orders " + json.dumps(args))
            await ingestor.ingest(message)
            await drainer.drain(message.session_key)
        finally:
            await forwarder.close()
    (hit,) = api.hits
    assert hit["path"] == "/v1/customers/C123456/orders?status=shipped"
    assert hit["headers"]["Authorization"] == f"Bearer {SHOP_TOKEN}"
    events = await client.xrange(SessionKeys(message.session_key).events)
    called = [json.loads(f[b"data"]) for _, f in events if f[b"kind"] == b"tool_called"]
    assert [(e["tool"], e["ok"]) for e in called] == [("search_orders", True)]
    assert "O2" in deliverer.texts()[-1]
    raw = json.dumps([{k.decode(): v.decode() for k, v in f.items()} for _, f in events])
    assert SHOP_TOKEN not in raw and SHOP_TOKEN not in json.dumps(deliverer.texts())
