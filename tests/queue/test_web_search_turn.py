"""``web_search`` in a whole turn: the offline model's ``/tool``, the worker's runtime, the real drain."""

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
from tests.fakes.search_api import BRAVE_KEY
from tests.queue.conftest import RecordingDeliverer, make_message
from tests.webtools.conftest import HOSTS, search_settings, serve_search


async def test_a_turn_searches_the_web_through_the_workers_egress(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    async with serve_search(tmp_path) as (api, ports, ca):
        settings = search_settings(tmp_path, ports, ca)
        resolver = MapResolver({host: [[PUBLIC]] for host in HOSTS.values()})
        forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, ListSink(), resolver=resolver)
        try:
            runtime = build_runtime(settings, ModelFactory(ProviderConfig()), rest=EgressTransport(forwarder))
            agent = settings.file.agents["brave"]
            drainer = Drainer(
                client,
                queue_settings,
                runner=runtime.run_turn,
                deliverer=deliverer,
                agent_for=lambda m: agent,
                worker_id="w1",
            )
            message = make_message('/tool web_search {"query": "switchboard"}')
            await ingestor.ingest(message)
            await drainer.drain(message.session_key)
        finally:
            await forwarder.close()
    (hit,) = api.hits
    assert hit["headers"]["X-Subscription-Token"] == BRAVE_KEY
    events = await client.xrange(SessionKeys(message.session_key).events)
    called = [json.loads(f[b"data"]) for _, f in events if f[b"kind"] == b"tool_called"]
    assert [(e["tool"], e["ok"]) for e in called] == [("web_search", True)]
    assert "https://docs.example.org/switchboard" in deliverer.texts()[-1]
    raw = json.dumps([{k.decode(): v.decode() for k, v in f.items()} for _, f in events])
    assert BRAVE_KEY not in raw  # the key never reaches the event log
