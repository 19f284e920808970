"""OpenTelemetry spans: one trace per user request, from the webhook to the last send (``docs/ARCHITECTURE.md`` §8).

Every process derives the trace id from the request's first message id, so the web process and the worker write spans
of one trace without passing context through Redis. Attributes never hold secrets or message text. With no OTLP
endpoint configured nothing records and :func:`span` costs next to nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Link, NonRecordingSpan, Span, SpanContext, Status, StatusCode, TraceFlags

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "AttributeValue",
    "Tracing",
    "collecting_ingested",
    "configure",
    "conversation",
    "conversation_id",
    "current_conversation",
    "install",
    "link_to",
    "note_ingested",
    "recording",
    "span",
    "span_at",
    "trace_hex",
    "trace_id_of",
]

logger = logging.getLogger(__name__)

AttributeValue = str | int | float | bool

_tracer: trace.Tracer | None = None
"""The tracer spans are made with; ``None`` while nothing records (no exporter configured)."""

_INGESTED: ContextVar[list[str] | None] = ContextVar("switchboard_ingested", default=None)
"""Gateway ids of the messages accepted in this context, while a webhook collects them (:func:`collecting_ingested`)."""

_CONVERSATION: ContextVar[str | None] = ContextVar("switchboard_conversation", default=None)
"""``gen_ai.conversation.id`` of the turn running in this context (:func:`conversation`)."""

_SERVICE_NAME = "service.name"
_TRACE_HEX = re.compile(r"[0-9a-f]{32}")
_LOW64 = (1 << 64) - 1


def trace_id_of(key: str) -> int:
    """The 128-bit trace id of the request whose first gateway message id is ``key`` (never 0)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:32], 16) or 1


def trace_hex(message_id: str) -> str:
    """The trace id of the request whose first gateway message id is ``message_id``: 32 lower-case hex digits.

    What a trace backend (Jaeger, Tempo, Honeycomb…) takes in its search box, and what the event log's ``step``
    facts carry as ``trace_id``.
    """
    return f"{trace_id_of(message_id):032x}"


def conversation_id(session_key: str) -> str:
    """``gen_ai.conversation.id`` of a session: 32 hex digits of the SHA-256 of its key, never the key itself.

    The session key holds platform chat and user ids; the digest is the same as the session's workspace directory
    name (``workspaces/t-…/<digest>``), so an operator can go from a trace to the session's files.
    """
    return hashlib.sha256(session_key.encode()).hexdigest()[:32]


def _trace_of(key: str) -> int:
    """The trace id ``key`` names: 32 hex digits are one already (a gateway message id has 28), else its digest."""
    if _TRACE_HEX.fullmatch(key):
        return int(key, 16) or 1
    return trace_id_of(key)


def _root(key: str) -> SpanContext:
    trace_id = _trace_of(key)
    return SpanContext(
        trace_id=trace_id,
        span_id=((trace_id >> 64) ^ (trace_id & _LOW64)) or 1,  # the trace id is a digest already: fold it
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


def _root_parent(key: str) -> Context:
    return trace.set_span_in_context(NonRecordingSpan(_root(key)))


def link_to(key: str) -> Link:
    """A span link to the trace of the request whose first gateway message id is ``key`` (its synthetic root)."""
    return Link(_root(key))


def recording() -> bool:
    """Whether spans are recorded in this process (an exporter or a test's provider is installed)."""
    return _tracer is not None


def _attributes(attributes: Mapping[str, AttributeValue | None]) -> dict[str, AttributeValue]:
    return {k.replace("__", "."): v for k, v in attributes.items() if v is not None}


@contextmanager
def span(name: str, *, trace_key: str | None = None, **attributes: AttributeValue | None) -> Iterator[Span]:
    """A span named ``name`` under the current one; with no current span, in the trace of ``trace_key``.

    An exception leaving the span marks it failed with ``error.type`` (the exception's class name); its message is
    not recorded (it may quote a platform's answer or a user's words).

    Args:
        name: dotted, lower case (``webhook``, ``queue.wait``, ``model.call``, ``policy.check``, ``tool.call``,
            ``approval.wait``, ``send``).
        trace_key: the request's first gateway message id, or its trace id in hex (:func:`trace_hex`, what
            ``TurnRequest.trace_id`` and ``ApprovalRecord.trace_id`` hold); ``None`` keeps the current trace.
        attributes: ``__`` in a name stands for ``.`` (``gen_ai__request__model``); ``None`` values are left out;
            never pass secrets or message text.
    """
    tracer = _tracer
    if tracer is None:
        yield INVALID_SPAN
        return
    current = trace.get_current_span().get_span_context()
    context = _root_parent(trace_key) if trace_key and not current.is_valid else None
    with tracer.start_as_current_span(
        name,
        context=context,
        attributes=_attributes(attributes),
        record_exception=False,
        set_status_on_exception=False,
    ) as opened:
        try:
            yield opened
        except BaseException as exc:
            opened.set_attribute("error.type", type(exc).__name__)
            opened.set_status(Status(StatusCode.ERROR))
            raise


def span_at(
    name: str,
    *,
    start_ns: int,
    end_ns: int | None = None,
    trace_key: str | None,
    links: Iterable[Link] = (),
    **attributes: AttributeValue | None,
) -> None:
    """Record a finished span that began at ``start_ns`` (Unix nanoseconds) and ends at ``end_ns`` (default: now).

    For what is known only afterwards: the wait of a message in its queue (from its acceptance to its turn), and a
    webhook request, whose trace is that of the first message it accepted; an approval's wait. It is a top span of
    the trace of ``trace_key`` (a first message id, or a trace id in hex as for :func:`span`) whatever span is
    current; with ``trace_key=None``, the root of a trace of its own.
    """
    tracer = _tracer
    if tracer is None:
        return
    context = _root_parent(trace_key) if trace_key else Context()
    opened = tracer.start_span(
        name, context=context, attributes=_attributes(attributes), links=list(links), start_time=start_ns
    )
    opened.end(end_time=end_ns if end_ns is not None else time.time_ns())


@contextmanager
def collecting_ingested() -> Iterator[list[str]]:
    """Collect the gateway ids of the messages accepted inside the block, in order (:func:`note_ingested`)."""
    ids: list[str] = []
    token = _INGESTED.set(ids)
    try:
        yield ids
    finally:
        _INGESTED.reset(token)


def note_ingested(message_id: str) -> None:
    """Ingest reports a message Redis accepted (or a duplicate's original id); a no-op unless a webhook collects."""
    ids = _INGESTED.get()
    if ids is not None:
        ids.append(message_id)


@contextmanager
def conversation(session_key: str) -> Iterator[str]:
    """Within the block, :func:`current_conversation` is the ``gen_ai.conversation.id`` of ``session_key``."""
    value = conversation_id(session_key)
    token = _CONVERSATION.set(value)
    try:
        yield value
    finally:
        _CONVERSATION.reset(token)


def current_conversation() -> str | None:
    """``gen_ai.conversation.id`` of the turn running in this context, if the worker set one."""
    return _CONVERSATION.get()


class Tracing:
    """The process's tracing: :meth:`shutdown` exports what is buffered and stops the exporter."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        """The SDK provider spans go to (``None``: nothing records)."""

    @property
    def enabled(self) -> bool:
        """Whether spans are recorded and exported."""
        return self.provider is not None

    def shutdown(self) -> None:
        """Flush the batch of spans not yet exported (bounded by the exporter's timeout), then stop recording."""
        global _tracer
        if self.provider is None:
            return
        provider, self.provider = self.provider, None
        _tracer = None
        try:
            provider.shutdown()
        except Exception as err:  # never fail a process's exit over its traces
            logger.warning("trace export at shutdown failed: %s", type(err).__name__)


def _service_version() -> str | None:
    try:
        return version("switchboard")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without installing
        return None


def _env_true(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() == "true"


def configure(service_name: str, environ: Mapping[str, str] | None = None) -> Tracing:
    """Set up tracing for this process from the standard OpenTelemetry variables; a no-op without an endpoint.

    Spans are exported over OTLP/HTTP (protobuf) when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the full URL) or
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL: ``/v1/traces`` is appended) is set, unless ``OTEL_SDK_DISABLED=true``
    or ``OTEL_TRACES_EXPORTER=none``. The SDK reads the rest itself: ``OTEL_EXPORTER_OTLP[_TRACES]_HEADERS``,
    ``_TIMEOUT``, ``_COMPRESSION``, ``_CERTIFICATE``; ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
    (``service_name`` is the default, e.g. ``switchboard-web``); ``OTEL_TRACES_SAMPLER`` / ``_ARG``; the batch
    processor's ``OTEL_BSP_*``. Call :meth:`Tracing.shutdown` on exit.

    Args:
        service_name: ``service.name`` unless the environment names one.
        environ: the environment (default ``os.environ``; the SDK itself always reads ``os.environ``).
    """
    global _tracer
    env = os.environ if environ is None else environ
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if not endpoint or _env_true(env, "OTEL_SDK_DISABLED") or "none" in exporters:
        return Tracing()
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "http/protobuf":
        logger.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported: traces are sent as http/protobuf", protocol)
    # imported here: a process that exports nothing never loads the SDK, the exporter, or protobuf
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(_SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({_SERVICE_NAME: service_name}))
    if (release := _service_version()) is not None and "service.version" not in resource.attributes:
        resource = resource.merge(Resource({"service.version": release}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _tracer = provider.get_tracer("switchboard", _service_version())
    logger.info("traces exported over OTLP/HTTP as %s", resource.attributes.get(_SERVICE_NAME))
    return Tracing(provider)


def install(provider: TracerProvider | None) -> None:
    """Record spans with ``provider`` (a test's, with an in-memory exporter); ``None`` stops recording."""
    global _tracer
    _tracer = provider.get_tracer("switchboard") if provider is not None else None
