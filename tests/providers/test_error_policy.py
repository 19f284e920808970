"""The shared error policy and the conversation repair, without a server."""

from __future__ import annotations

import email.utils

import pytest

from switchboard.core.model import ChatMessage, ToolCall
from switchboard.core.providers.errors import ProviderFacts, redact, retry_after, status_error, stream_error
from switchboard.core.providers.transcript import MISSING_RESULT, paired, parse_arguments
from switchboard.errors import AgentError, ModelError

FACTS = ProviderFacts(name="Acme", key_env="ACME_API_KEY", base_url_env="ACME_BASE_URL", secret="sk-acme-SECRET99")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"Retry-After": "0.5"}, 0.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_retry_after_reads_seconds_and_milliseconds(headers: dict[str, str] | None, expected: float | None) -> None:
    assert retry_after(headers) == expected


def test_retry_after_reads_an_http_date() -> None:
    now = 1_700_000_000.0
    header = email.utils.formatdate(now + 30, usegmt=True)

    assert retry_after({"retry-after": header}, now=now) == pytest.approx(30.0)


def test_quoted_provider_text_never_carries_the_key() -> None:
    error = status_error(
        FACTS,
        status=400,
        headers=None,
        kind="invalid_request_error",
        message="bad key sk-acme-SECRET99 used",
        model="m",
    )

    assert "SECRET99" not in str(error)
    assert "[redacted]" in str(error)
    assert redact("x", "") == "x"


def test_long_provider_text_is_shortened() -> None:
    error = status_error(FACTS, status=400, headers=None, kind=None, message="word " * 500, model="m")

    assert len(str(error)) < 400


def test_model_error_code_is_optional_and_keeps_the_old_signature() -> None:
    legacy = ModelError("x", retryable=True, retry_after=2.0)

    assert isinstance(legacy, AgentError)
    assert (legacy.retryable, legacy.retry_after, legacy.code) == (True, 2.0, None)


@pytest.mark.parametrize(
    ("kind", "message", "code", "retryable"),
    [
        ("overloaded_error", "Overloaded", "overloaded", True),
        ("rate_limit_exceeded", "slow", "rate_limit", True),
        (None, "connection reset", "server_error", True),
        ("invalid_prompt", "nope", "bad_request", False),
        ("authentication_error", "bad key sk-acme-SECRET99", "auth", False),
        ("invalid_request_error", "input length and `max_tokens` exceed context limit", "context_length", False),
    ],
)
def test_errors_inside_a_stream(kind: str | None, message: str, code: str, retryable: bool) -> None:
    error = stream_error(FACTS, kind=kind, message=message, model="m")

    assert (error.code, error.retryable) == (code, retryable)
    assert "SECRET99" not in str(error)


def test_auth_message_mentions_the_endpoint_variable_for_custom_endpoints() -> None:
    custom = ProviderFacts(name="Acme", key_env="ACME_API_KEY", base_url_env="ACME_BASE_URL", custom_endpoint=True)

    error = status_error(custom, status=401, headers=None, kind=None, message="", model="m")

    assert "ACME_API_KEY" in str(error) and "ACME_BASE_URL" in str(error)


def _call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="t", arguments={})


def test_paired_moves_each_result_right_after_its_call() -> None:
    messages = [
        ChatMessage(role="user", content="go"),
        ChatMessage(role="assistant", tool_calls=[_call("a"), _call("b")]),
        ChatMessage(role="user", content="interjection"),
        ChatMessage(role="tool", content="B", tool_call_id="b"),
        ChatMessage(role="tool", content="A", tool_call_id="a"),
    ]

    out = paired(messages)

    assert [(m.role, m.content, m.tool_call_id) for m in out] == [
        ("user", "go", None),
        ("assistant", "", None),
        ("tool", "A", "a"),
        ("tool", "B", "b"),
        ("user", "interjection", None),
    ]


def test_paired_fills_missing_results_and_drops_orphans() -> None:
    messages = [
        ChatMessage(role="tool", content="lost", tool_call_id="zz"),
        ChatMessage(role="assistant", tool_calls=[_call("a")]),
    ]

    out = paired(messages)

    assert [(m.role, m.content, m.tool_call_id) for m in out] == [
        ("assistant", "", None),
        ("tool", MISSING_RESULT, "a"),
    ]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("", {}),
        ("  ", {}),
        ("[1, 2]", {"_raw": "[1, 2]"}),
        ('{"a": ', {"_raw": '{"a": '}),
    ],
)
def test_parse_arguments(raw: str, expected: dict[str, object]) -> None:
    assert parse_arguments(raw) == expected
