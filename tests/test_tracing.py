"""Traces of a real request: a signed Telegram webhook → ingest → a worker's turn (offline model) → the send.

Spans go to an in-memory exporter through the SDK's real provider; the request travels the real gateway, Redis and
worker, and the reply reaches the fake Bot API.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN

from switchboard import tracing
from switchboard.cli.worker import run_worker
from switchboard.queue.eventlog import read_events
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from switchboard.web.webhooks import handle_traced_webhook, handle_webhook
from tests.channels.test_telegram import BOT, SECRET, TOKEN
from tests.channels.test_telegram_gateway import fake, gateway_env  # noqa: F401 (fixtures)
from tests.fakes.telegram_api import FakeTelegram, check_html, make_update, sign_update
from tests.waiting import wait_until

CHAT_ID = 9087123456
SESSION = f"default/assistant/telegram/default/{CHAT_ID}"
TEXT = "please wire 4417 crowns to Zanzibar quietly"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


def _values(span: ReadableSpan) -> list[str]:
    """Every attribute value of the span, its events and its links, as text."""
    found: list[Any] = [span.name, *(span.attributes or {}).values()]
    for event in span.events:
        found += [event.name, *(event.attributes or {}).values()]
    for link in span.links:
        found += list((link.attributes or {}).values())
    return [str(v) for v in found]


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    named = [s for s in spans if s.name == name]
    assert len(named) == 1, f"{name}: {[s.name for s in spans]}"
    return named[0]


async def test_a_telegram_request_is_one_trace_from_webhook_to_send(
    aiohttp_client: Any,
    gateway_env: dict[str, str],  # noqa: F811
    fake: FakeTelegram,  # noqa: F811
    redis_url: str,
    spans: InMemorySpanExporter,
) -> None:
    client = await aiohttp_client(create_app(load_settings(gateway_env)))
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(gateway_env), stop))
    body, headers = sign_update(make_update(TEXT, chat_id=CHAT_ID, update_id=7001, message_id=12), SECRET)
    try:
        resp = await client.post("/webhooks/telegram", data=body, headers=headers)
        assert resp.status == 200

        async def replied() -> bool:
            if worker.done():
                worker.result()
            return bool(fake.sent(CHAT_ID))

        await wait_until(replied, "a reply on Telegram")
        resp = await client.post("/webhooks/telegram", data=body, headers=headers)  # Telegram retries the update
        assert resp.status == 200
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
    assert "Zanzibar" in check_html(fake.sent(CHAT_ID)[0].params["text"])  # the offline model echoed the text

    redis = aioredis.Redis.from_url(redis_url)
    try:
        events = await read_events(redis, SessionKey(SESSION))
    finally:
        await redis.aclose()
    [message_id] = {e["message_id"] for e in events if e["kind"] == "message_received"}
    trace_id = tracing.trace_id_of(message_id)
    # the console reads the trace id from the step facts: the OTel trace id in hex
    steps = [e for e in events if e["kind"] == "step"]
    assert steps and steps[0]["detail"]["trace_id"] == tracing.trace_hex(message_id) == f"{trace_id:032x}"

    finished = list(spans.get_finished_spans())
    assert {s.context.trace_id for s in finished} == {trace_id}, "one trace per request"
    webhooks = [s for s in finished if s.name == "webhook"]
    assert len(webhooks) == 2  # the platform's retry joined the original's trace
    webhook = webhooks[0]
    wait, run, call, send = (_one(finished, n) for n in ("queue.wait", "run", "model.call", "send"))
    assert {s.name for s in finished} == {"webhook", "queue.wait", "run", "model.call", "send"}

    # parent / child: the top spans hang off the trace's one synthetic root; the model call is inside the run
    roots = {s.parent.span_id for s in (webhook, wait, run) if s.parent is not None}
    assert len(roots) == 1 and roots.isdisjoint({s.context.span_id for s in finished})
    assert call.parent is not None and call.parent.span_id == run.context.span_id
    assert send.parent is not None and send.parent.span_id in roots | {run.context.span_id}
    assert webhook.start_time <= wait.start_time <= wait.end_time <= run.start_time  # type: ignore[operator]
    assert run.start_time <= call.start_time and call.end_time <= run.end_time  # type: ignore[operator]
    assert run.start_time <= send.start_time  # type: ignore[operator]

    assert webhook.attributes is not None and webhook.attributes["http.response.status_code"] == 200
    assert webhook.attributes["switchboard.channel"] == "telegram"
    assert webhook.attributes["switchboard.message_id"] == message_id
    assert call.attributes is not None and call.attributes["gen_ai.operation.name"] == "chat"
    assert call.attributes["gen_ai.conversation.id"] == tracing.conversation_id(SESSION)
    assert call.attributes["gen_ai.usage.output_tokens"] > 0  # type: ignore[operator]
    assert "gen_ai.request.model" in call.attributes and "gen_ai.usage.input_tokens" in call.attributes
    assert send.attributes is not None and send.attributes["switchboard.outcome"] == "sent"
    assert send.attributes["switchboard.channel"] == "telegram" and send.attributes["switchboard.parts"] == 1

    forbidden = [TOKEN, SECRET, SESSION, str(CHAT_ID), "Zanzibar", "crowns", "4417 crowns", BOT]
    for span in finished:
        for value in _values(span):
            leaked = [word for word in forbidden if word in value]
            assert not leaked, f"{span.name}: {value!r} holds {leaked}"


async def test_a_refused_webhook_is_a_trace_of_its_own_and_names_no_invented_channel(
    aiohttp_client: Any,
    gateway_env: dict[str, str],  # noqa: F811
    spans: InMemorySpanExporter,
) -> None:
    client = await aiohttp_client(create_app(load_settings(gateway_env)))
    body, _ = sign_update(make_update(TEXT, chat_id=CHAT_ID, update_id=7002), SECRET)
    resp = await client.post("/webhooks/telegram", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 401
    resp = await client.post("/webhooks/made-up-SECRET-name", data=body)
    assert resp.status == 404
    refused, unknown = spans.get_finished_spans()
    assert refused.attributes is not None and refused.attributes["http.response.status_code"] == 401
    assert refused.attributes["switchboard.messages"] == 0 and refused.parent is None
    assert unknown.attributes is not None and unknown.attributes["switchboard.channel"] == "unknown"
    assert refused.context.trace_id != unknown.context.trace_id
    assert not any("SECRET" in v or "Zanzibar" in v for s in (refused, unknown) for v in _values(s))


def test_without_an_exporter_nothing_records_and_webhooks_are_not_timed(gateway_env: dict[str, str]) -> None:  # noqa: F811
    assert not tracing.recording()
    with tracing.span("run", trace_key="x", switchboard__steps=1) as opened:
        assert opened is INVALID_SPAN
    app = create_app(load_settings(gateway_env))
    handlers = {r.handler for r in app.router.routes() if r.resource is not None and "webhooks" in str(r.resource)}
    assert handlers == {handle_webhook}
    tracing.install(TracerProvider())
    try:
        app = create_app(load_settings(gateway_env))
        handlers = {r.handler for r in app.router.routes() if r.resource is not None and "webhooks" in str(r.resource)}
        assert handlers == {handle_traced_webhook}
    finally:
        tracing.install(None)


def test_trace_ids_are_the_first_message_ids_digest() -> None:
    assert tracing.trace_hex("0193abc") == f"{tracing.trace_id_of('0193abc'):032x}"
    assert len(tracing.trace_hex("0193abc")) == 32 and tracing.trace_hex("a") != tracing.trace_hex("b")
    assert tracing.conversation_id(SESSION) not in SESSION and str(CHAT_ID) not in tracing.conversation_id(SESSION)


def test_a_trace_id_in_hex_names_the_same_trace_and_root_as_the_message_id(spans: InMemorySpanExporter) -> None:
    """``approval.wait`` is recorded from ``ApprovalRecord.trace_id`` (hex), beside the run keyed by the message id."""
    message_id = "01a2346038101c3436a693af9149"
    with tracing.span("run", trace_key=message_id):
        pass
    tracing.span_at("approval.wait", start_ns=time.time_ns() - 1000, trace_key=tracing.trace_hex(message_id))
    run, wait = spans.get_finished_spans()
    assert run.context.trace_id == wait.context.trace_id == tracing.trace_id_of(message_id)
    assert run.parent is not None and wait.parent is not None and run.parent.span_id == wait.parent.span_id
    with tracing.span("run", trace_key="not-hex-" + "0" * 24):  # 32 characters, not all hex: a key like any other
        pass
    assert spans.get_finished_spans()[-1].context.trace_id == tracing.trace_id_of("not-hex-" + "0" * 24)
