"""OTLP/HTTP export: spans reach a local collector speaking the real protobuf wire format.

The collector is a small aiohttp server decoding ``ExportTraceServiceRequest`` with ``opentelemetry-proto``, the
message definitions every OpenTelemetry collector uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from switchboard import tracing


@dataclass
class Collector:
    url: str
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    got = Collector(url="")

    async def export(request: web.Request) -> web.Response:
        got.paths.append(request.path)
        got.content_types.append(request.content_type)
        got.requests.append(ExportTraceServiceRequest.FromString(await request.read()))
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    got.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield got
    finally:
        await runner.cleanup()


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


async def test_spans_are_exported_over_otlp_http_protobuf(collector: Collector, otel_env: pytest.MonkeyPatch) -> None:
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    traces = tracing.configure("switchboard-worker")
    try:
        assert traces.enabled and tracing.recording()
        with (
            tracing.span("run", trace_key="0193-first-message", switchboard__steps=2),
            tracing.span("model.call", gen_ai__operation__name="chat", gen_ai__usage__input_tokens=12),
        ):
            pass
    finally:
        await asyncio.to_thread(traces.shutdown)  # flushes the batch (the collector answers on this loop)
    assert not tracing.recording()
    assert collector.paths and set(collector.paths) == {"/v1/traces"}
    assert set(collector.content_types) == {"application/x-protobuf"}
    resource_spans = [rs for request in collector.requests for rs in request.resource_spans]
    services = {
        a.value.string_value for rs in resource_spans for a in rs.resource.attributes if a.key == "service.name"
    }
    assert services == {"switchboard-worker"}
    spans = {s.name: s for rs in resource_spans for ss in rs.scope_spans for s in ss.spans}
    assert set(spans) == {"run", "model.call"}
    trace_id = tracing.trace_id_of("0193-first-message").to_bytes(16, "big")
    assert spans["run"].trace_id == spans["model.call"].trace_id == trace_id
    assert spans["model.call"].parent_span_id == spans["run"].span_id
    assert spans["run"].parent_span_id and spans["run"].parent_span_id != spans["run"].span_id  # the synthetic root
    attributes = {a.key: a.value for a in spans["model.call"].attributes}
    assert attributes["gen_ai.operation.name"].string_value == "chat"
    assert attributes["gen_ai.usage.input_tokens"].int_value == 12


async def test_the_traces_endpoint_and_service_name_variables_win(
    collector: Collector, otel_env: pytest.MonkeyPatch
) -> None:
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9/unused")
    otel_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{collector.url}/v1/traces")
    otel_env.setenv("OTEL_SERVICE_NAME", "gateway-eu-1")
    traces = tracing.configure("switchboard-web")
    try:
        tracing.span_at("webhook", start_ns=1_700_000_000_000_000_000, trace_key="m1", http__response__status_code=200)
    finally:
        await asyncio.to_thread(traces.shutdown)
    [request] = collector.requests
    [resource_spans] = request.resource_spans
    names = {a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"}
    assert names == {"gateway-eu-1"}
    [span] = resource_spans.scope_spans[0].spans
    assert span.name == "webhook" and span.start_time_unix_nano == 1_700_000_000_000_000_000
    assert span.trace_id == tracing.trace_id_of("m1").to_bytes(16, "big")


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    ],
)
def test_without_an_endpoint_or_when_disabled_nothing_records(
    env: dict[str, str], otel_env: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        otel_env.setenv(name, value)
    traces = tracing.configure("switchboard-web")
    assert not traces.enabled and not tracing.recording()
    traces.shutdown()  # a no-op
