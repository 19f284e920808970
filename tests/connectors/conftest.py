"""A connector pack in whole turns: its fake API over real HTTPS, the worker's runtime, the drain, real Redis.

The email pack's tests use real mail servers instead (Dovecot and aiosmtpd, :mod:`tests.connectors.mail`).

The fake listens on 127.0.0.2 under a certificate of a test CA egress trusts; only the test resolver knows its host
name. The offline model calls a tool for ``/tool NAME {json}``; approvals are decided as an operator would.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from switchboard.cli.worker import build_runtime
from switchboard.core.messages import ConversationRef, InboundMessage, OperatorActed, Sender
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.egress.ca import DeploymentCA
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy
from switchboard.egress.transport import EgressTransport
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings, Settings, load_settings
from switchboard.worker.drain import Drainer
from tests.connectors.mail import dovecot, mail_account, mail_ca, smtp_server
from tests.egress.conftest import PUBLIC, ListSink, MapResolver, _serve
from tests.queue.conftest import RecordingDeliverer, client, ingestor, queue_settings

__all__ = ["client", "dovecot", "ingestor", "mail_account", "mail_ca", "queue_settings", "smtp_server"]


@contextlib.asynccontextmanager
async def serve_https(app: web.Application, host: str, tmp_path: Path) -> AsyncIterator[tuple[int, DeploymentCA]]:
    """``app`` over HTTPS on 127.0.0.2 as ``host``: its port and the CA that signed its certificate."""
    ca = DeploymentCA.load_or_create(tmp_path / "upstream-ca")
    cert, key = ca.issue(host)
    (tmp_path / "api.pem").write_bytes(cert + key)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "api.pem")
    runner, port = await _serve(app, PUBLIC, 0, tls)
    try:
        yield port, ca
    finally:
        await runner.cleanup()


def connector_settings(tmp_path: Path, yaml: str, port: int, ca: DeploymentCA, env: dict[str, str]) -> Settings:
    config = tmp_path / "switchboard.yaml"
    config.write_text(yaml)
    return load_settings(
        {
            "SWITCHBOARD_CONFIG": str(config),
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_EGRESS__PORTS": f"443,{port}",
            "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": f"{PUBLIC}/32",
            "SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE": str(ca.cert_path),
            **env,
        }
    )


@dataclass
class Conversation:
    """One conversation with ``agent``, driven through the real drain and runtime."""

    client: aioredis.Redis
    queue: QueueSettings
    ingestor: Ingestor
    settings: Settings
    host: str
    agent: str
    deliverer: RecordingDeliverer = field(default_factory=RecordingDeliverer)
    counter: int = 0

    def message(self, text: str, event: OperatorActed | None = None, sender: str = "u1") -> InboundMessage:
        self.counter += 1
        draft = InboundMessage(
            dedup_key=f"evt-{self.counter}",
            conversation=ConversationRef(agent=self.agent, channel="telegram", conversation="c1"),
            sender=Sender(id=sender, name="User"),
            text=text,
        )
        return draft if event is None else draft.model_copy(update={"event": event})

    async def send(self, message: InboundMessage) -> None:
        """Ingest ``message`` and drain the session with a worker's runtime (a fresh one each time, as after a
        restart)."""
        forwarder = Forwarder(
            EgressPolicy.from_settings(self.settings),
            self.settings.egress,
            ListSink(),
            resolver=MapResolver({self.host: [[PUBLIC]]}),
        )
        try:
            runtime = build_runtime(self.settings, ModelFactory(ProviderConfig()), rest=EgressTransport(forwarder))
            agent = self.settings.file.agents[self.agent].model_copy(update={"model": "offline"})
            drainer = Drainer(
                self.client,
                self.queue,
                runner=runtime.run_turn,
                deliverer=self.deliverer,
                agent_for=lambda m: agent,
                worker_id="w1",
            )
            await self.ingestor.ingest(message)
            await drainer.drain(message.session_key)
        finally:
            await forwarder.close()

    async def tool(self, name: str, args: dict[str, Any]) -> None:
        await self.send(self.message(f"/tool {name} {json.dumps(args)}"))

    async def approve(self, approval_id: str) -> None:
        decide = OperatorActed(action="decide", operator="console:alice", approval_id=approval_id, verdict="approve")
        await self.send(self.message("", decide, sender="console:alice"))

    async def events(self, kind: str) -> list[dict[str, Any]]:
        found = await read_events(self.client, self.message("x").session_key, 1000)
        return [e for e in found if e["kind"] == kind]

    def reply(self) -> str:
        return self.deliverer.texts()[-1]

    async def everything_stored(self) -> str:
        """Every value in Redis, as text (to show a secret is nowhere in it)."""
        parts: list[str] = []
        async for key in self.client.scan_iter(count=500):
            kind = (await self.client.type(key)).decode()
            if kind == "string":
                parts.append(repr(await self.client.get(key)))
            elif kind == "hash":
                parts.append(repr(await self.client.hgetall(key)))
            elif kind == "list":
                parts.append(repr(await self.client.lrange(key, 0, -1)))
            elif kind == "stream":
                parts.append(repr(await self.client.xrange(key)))
            elif kind == "zset":
                parts.append(repr(await self.client.zrange(key, 0, -1)))
            elif kind == "set":
                parts.append(repr(await self.client.smembers(key)))
        return "\n".join(parts)
