"""OpenTelemetry spans: one trace per user request, from the webhook to the last send (docs/ARCHITECTURE.md §8).

Every process derives the trace id from the request's first gateway message id (:func:`trace_id_of`), so the web
process that accepted the message and the worker that answers it write spans of one trace without passing context
through Redis. Attributes never hold secrets or message text: names, ids, counts, sizes, durations and classes only.

Without an exporter configured the OpenTelemetry API is a no-op and a span costs a function call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags

__all__ = ["AttributeValue", "span", "trace_id_of"]

AttributeValue = str | int | float | bool

_TRACER = trace.get_tracer("switchboard")


def trace_id_of(key: str) -> int:
    """The 128-bit trace id of the request whose first gateway message id is ``key`` (never 0)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:32], 16) or 1


def _root_parent(key: str) -> Context:
    digest = hashlib.sha256(f"root\n{key}".encode()).hexdigest()
    parent = SpanContext(
        trace_id=trace_id_of(key),
        span_id=int(digest[:16], 16) or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


@contextmanager
def span(name: str, *, trace_key: str | None = None, **attributes: AttributeValue | None) -> Iterator[Span]:
    """A span named ``name`` under the current one; with no current span, in the trace of ``trace_key``.

    Args:
        name: dotted, lower case (``webhook``, ``queue.wait``, ``model.call``, ``policy.check``, ``tool.call``,
            ``approval.wait``, ``send``).
        trace_key: the request's first gateway message id (``None`` keeps the current trace).
        attributes: ``None`` values are left out; never pass secrets or message text.
    """
    current = trace.get_current_span().get_span_context()
    context = _root_parent(trace_key) if trace_key and not current.is_valid else None
    attrs = {k.replace("__", "."): v for k, v in attributes.items() if v is not None}
    with _TRACER.start_as_current_span(name, context=context, attributes=attrs) as opened:
        yield opened
