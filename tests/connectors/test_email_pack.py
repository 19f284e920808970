"""The email pack switched on in the YAML (``agents.support.connectors: [email]``), run as a worker runs it.

The settings load and expand the pack into ``mcp_servers.email`` and its approval rule; the operator accepts its
tools with ``switchboard mcp accept email``; the worker's runtime drives turns through the real drain and Redis,
against Dovecot and aiosmtpd.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from switchboard.cli.checks import config_problems
from switchboard.cli.mcp import mcp_command, mcp_secrets
from switchboard.cli.worker import build_runtime
from switchboard.core.messages import ConversationRef, InboundMessage, OperatorActed, Sender
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.mcp.client import McpClients
from switchboard.core.tools.mcp.config import StdioServer
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings, Settings, load_settings
from switchboard.worker.drain import Drainer
from tests.connectors.mail import Dovecot, MailAccount, SmtpServer
from tests.queue.conftest import RecordingDeliverer

ROOT = Path(__file__).resolve().parents[2]


def pack_settings(tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, account: MailAccount) -> Settings:
    config = tmp_path / "switchboard.yaml"
    config.write_text(
        f"""
default_agent: support
connectors:
  email:
    imap_host: 127.0.0.1
    imap_port: {dovecot.imaps_port}
    smtp_host: 127.0.0.1
    smtp_port: {smtp.port}
    username: {account.username}
    password: MAIL_PASSWORD
    internal_networks: 127.0.0.0/8
    ca_file: {dovecot.ca_file}
    python: {sys.executable}
agents:
  support:
    profile: {{name: Support}}
    instructions: Answer customers' mail.
    connectors: [email]
"""
    )
    settings = load_settings(
        {
            "SWITCHBOARD_CONFIG": str(config),
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_EGRESS__SECRETS__MAIL_PASSWORD__VALUE": account.password,
            "SWITCHBOARD_EGRESS__SECRETS__MAIL_PASSWORD__DOMAINS": "127.0.0.1",
        }
    )
    server = settings.file.mcp_servers["email"]
    assert isinstance(server, StdioServer)
    # the connector process imports this checkout (an installed Switchboard needs no PYTHONPATH)
    settings.file.mcp_servers["email"] = server.model_copy(update={"env": {**server.env, "PYTHONPATH": str(ROOT)}})
    return settings


async def test_the_email_pack_switched_on_for_an_agent_reads_and_sends_after_approval(
    tmp_path: Path,
    dovecot: Dovecot,
    smtp_server: SmtpServer,
    mail_account: MailAccount,
    client: aioredis.Redis,
    queue_settings: QueueSettings,
    ingestor: Ingestor,
    capfd: Any,
) -> None:
    settings = pack_settings(tmp_path, dovecot, smtp_server, mail_account)
    server = settings.file.mcp_servers["email"]
    assert isinstance(server, StdioServer)
    assert server.command[1:] == ["-m", "switchboard.connectors.email"] and server.reads == ["search_mail", "read_mail"]
    assert server.env["EMAIL_PASSWORD"] == "{{secret:MAIL_PASSWORD}}"  # the name of the secret, never its value
    agent = settings.file.agents["support"]
    assert [m.server for m in agent.mcp] == ["email"]
    assert [(r.tool, r.decide) for r in agent.policy.rules if r.name == "connector:email"] == [("email__*", "approve")]
    assert not [p for p in config_problems(settings) if "connector:email" in p]  # `switchboard run` starts

    accepted = await asyncio.to_thread(mcp_command, settings, "accept", "email", None)  # as the operator runs it
    assert accepted == 0
    assert "search_mail, read_mail, send_mail" in capfd.readouterr().out
    dovecot.append(mail_account, b"From: ann@example.test\r\nSubject: Where is my parcel?\r\n\r\nOrder 77.\r\n")

    clients = McpClients(settings.file.mcp_servers, secrets=mcp_secrets(settings))
    deliverer = RecordingDeliverer()
    counter = 0

    async def send(text: str, event: OperatorActed | None = None) -> InboundMessage:
        nonlocal counter
        counter += 1
        message = InboundMessage(
            dedup_key=f"evt-{counter}",
            conversation=ConversationRef(agent="support", channel="telegram", conversation="c1"),
            sender=Sender(id="console:alice" if event else "u1", name="User"),
            text=text,
        )
        message = message if event is None else message.model_copy(update={"event": event})
        runtime = build_runtime(settings, ModelFactory(ProviderConfig()), mcp=clients)
        support = agent.model_copy(update={"model": "offline"})
        drainer = Drainer(
            client,
            queue_settings,
            runner=runtime.run_turn,
            deliverer=deliverer,
            agent_for=lambda m: support,
            worker_id="w1",
        )
        await ingestor.ingest(message)
        await drainer.drain(message.session_key)
        return message

    try:
        first = await send('/tool email__search_mail {"query": "parcel"}')
        assert "Where is my parcel?" in deliverer.texts()[-1]  # a read runs at once
        reply = {"to": ["ann@example.test"], "subject": "Re: Where is my parcel?", "body": "It left today."}
        await send("/tool email__send_mail " + json.dumps(reply))
        assert smtp_server.received == []
        events = await read_events(client, first.session_key, 1000)
        (asked,) = [e for e in events if e["kind"] == "approval_requested"]
        assert asked["tool"] == "email__send_mail"
        decide = OperatorActed(
            action="decide", operator="console:alice", approval_id=asked["approval_id"], verdict="approve"
        )
        await send("", decide)
        (received,) = smtp_server.received
        assert received.rcpt_tos == ["ann@example.test"] and received.login == mail_account.username
        assert b"It left today." in received.content
    finally:
        await clients.aclose()


def test_a_stdio_servers_secrets_are_the_deployments_and_the_agents_own_unless_ambiguous(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(
        """
default_agent: a
agents:
  a:
    profile: {name: A}
    egress: {secrets: {MAIL: {env: A_MAIL, domains: [mail.example.com]}, SHARED: {env: A_SHARED, domains: [x.test]}}}
  b:
    profile: {name: B}
    egress: {secrets: {SHARED: {env: B_SHARED, domains: [x.test]}}}
"""
    )
    settings = load_settings(
        {
            "SWITCHBOARD_CONFIG": str(config),
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_EGRESS__SECRETS__DEPLOYED__VALUE": "d-value",
            "SWITCHBOARD_EGRESS__SECRETS__DEPLOYED__DOMAINS": "mail.example.com",
            "A_MAIL": "a-value",
            "A_SHARED": "one",
            "B_SHARED": "two",
        }
    )
    found = {name: value.get_secret_value() for name, value in mcp_secrets(settings).items()}
    assert found == {"DEPLOYED": "d-value", "MAIL": "a-value"}  # SHARED is bound to two values: left out
