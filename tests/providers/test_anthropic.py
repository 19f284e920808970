"""AnthropicModel against the fake Messages API, with the official SDK as the client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from switchboard.core.model import ChatMessage, Finished, TextDelta, ToolCall, ToolCallEvent, ToolSpec, Usage
from switchboard.core.providers.anthropic import AnthropicModel
from switchboard.errors import ModelError
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.model_script import Call, Failure
from tests.providers.conftest import collect, request

MakeModel = Callable[..., AnthropicModel]


@pytest.fixture
async def make_model(anthropic_url: str) -> AsyncIterator[MakeModel]:
    models: list[AnthropicModel] = []

    def make(**options: Any) -> AnthropicModel:
        values: dict[str, Any] = {"api_key": "sk-ant-test", "base_url": anthropic_url}
        values.update(options)
        model = AnthropicModel(**values)
        models.append(model)
        return model

    yield make
    for model in models:
        await model.aclose()


WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


async def test_text_streams_in_several_deltas_then_usage_and_finish(
    fake_anthropic: FakeAnthropic, make_model: MakeModel
) -> None:
    fake_anthropic.reply("Bon", "jour", " !", input_tokens=30, output_tokens=4)

    events = await collect(make_model().stream(request()))

    assert events == [
        TextDelta(text="Bon"),
        TextDelta(text="jour"),
        TextDelta(text=" !"),
        Usage(input_tokens=30, output_tokens=4),
        Finished(stop_reason="stop"),
    ]


async def test_tool_use_blocks_are_assembled_from_input_json_fragments(
    fake_anthropic: FakeAnthropic, make_model: MakeModel
) -> None:
    fake_anthropic.reply(
        "Checking.",
        calls=[
            Call("get_weather", {"city": "Paris", "days": 3}, call_id="toolu_a", fragments=6),
            Call("get_weather", {"city": "Oslo"}, call_id="toolu_b", fragments=1),
        ],
    )

    events = await collect(make_model().stream(request(tools=[WEATHER])))

    assert events[0] == TextDelta(text="Checking.")
    assert [event.call for event in events if isinstance(event, ToolCallEvent)] == [
        ToolCall(id="toolu_a", name="get_weather", arguments={"city": "Paris", "days": 3}),
        ToolCall(id="toolu_b", name="get_weather", arguments={"city": "Oslo"}),
    ]
    assert events[-1] == Finished(stop_reason="tool_calls")


async def test_invalid_input_json_is_passed_on_raw(fake_anthropic: FakeAnthropic, make_model: MakeModel) -> None:
    fake_anthropic.reply(calls=[Call("get_weather", '{"city": ', call_id="toolu_x")])

    events = await collect(make_model().stream(request(tools=[WEATHER])))

    [call] = [event.call for event in events if isinstance(event, ToolCallEvent)]
    assert call.arguments == {"_raw": '{"city": '}


async def test_request_shape_with_tool_calls_and_results(fake_anthropic: FakeAnthropic, make_model: MakeModel) -> None:
    fake_anthropic.reply("ok")
    messages = [
        ChatMessage(role="user", content="Weather in Paris and Oslo?"),
        ChatMessage(
            role="assistant",
            content="Looking.",
            tool_calls=[
                ToolCall(id="toolu_1", name="get_weather", arguments={"city": "Paris"}),
                ToolCall(id="toolu_2", name="get_weather", arguments={"city": "Oslo"}),
            ],
        ),
        ChatMessage(role="tool", content="21C", tool_call_id="toolu_1", name="get_weather"),
        ChatMessage(role="tool", content="4C", tool_call_id="toolu_2", name="get_weather"),
        ChatMessage(role="user", content="Thanks, and tomorrow?"),
    ]

    await collect(make_model().stream(request(messages=messages, tools=[WEATHER], max_output_tokens=321)))

    [received] = fake_anthropic.received
    assert received.path == "/v1/messages"
    assert received.headers["authorization"] == "Bearer sk-ant-test"
    body = received.body
    assert body["model"] == "test-model"
    assert body["system"] == "You are terse."
    assert body["max_tokens"] == 321
    assert body["stream"] is True
    assert body["tools"] == [
        {"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER.parameters}
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Oslo?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "4C"},
                {"type": "text", "text": "Thanks, and tomorrow?"},
            ],
        },
    ]


async def test_tool_result_goes_back_with_its_call_in_the_next_request(
    fake_anthropic: FakeAnthropic, make_model: MakeModel
) -> None:
    model = make_model()
    fake_anthropic.reply(calls=[Call("get_weather", {"city": "Rome"}, call_id="toolu_77")])
    fake_anthropic.reply("Sunny in Rome.")
    first = await collect(model.stream(request(tools=[WEATHER])))
    [call] = [event.call for event in first if isinstance(event, ToolCallEvent)]

    history = [
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="assistant", tool_calls=[call]),
        ChatMessage(role="tool", content="sunny", tool_call_id=call.id, name=call.name),
    ]
    second = await collect(model.stream(request(messages=history, tools=[WEATHER])))

    assert second[0] == TextDelta(text="Sunny in Rome.")
    assert fake_anthropic.received[1].body["messages"][-2:] == [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_77", "name": "get_weather", "input": {"city": "Rome"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_77", "content": "sunny"}]},
    ]


@pytest.mark.parametrize(
    ("stop", "expected"), [("max_tokens", "length"), ("refusal", "refusal"), ("pause_turn", "pause")]
)
async def test_stop_reasons_are_neutral(
    stop: str, expected: str, fake_anthropic: FakeAnthropic, make_model: MakeModel
) -> None:
    fake_anthropic.reply("partial", stop=stop)

    events = await collect(make_model().stream(request()))

    assert events[-1] == Finished(stop_reason=expected)


@pytest.mark.parametrize(
    ("status", "kind", "message", "headers", "code", "retryable", "retry_after"),
    [
        (429, "rate_limit_error", "slow down", {"retry-after": "13"}, "rate_limit", True, 13.0),
        (529, "overloaded_error", "Overloaded", {}, "overloaded", True, None),
        (500, "api_error", "Internal server error", {}, "server_error", True, None),
        (
            400,
            "invalid_request_error",
            "prompt is too long: 210000 tokens > 200000 maximum",
            {},
            "context_length",
            False,
            None,
        ),
        (
            413,
            "request_too_large",
            "Request exceeds the maximum allowed number of bytes",
            {},
            "context_length",
            False,
            None,
        ),
        (
            400,
            "invalid_request_error",
            "messages: text content blocks must be non-empty",
            {},
            "bad_request",
            False,
            None,
        ),
        (404, "not_found_error", "model: claude-nope", {}, "not_found", False, None),
    ],
)
async def test_http_errors_are_classified(
    status: int,
    kind: str,
    message: str,
    headers: dict[str, str],
    code: str,
    retryable: bool,
    retry_after: float | None,
    fake_anthropic: FakeAnthropic,
    make_model: MakeModel,
) -> None:
    fake_anthropic.fail(status, kind, message, headers=headers)

    with pytest.raises(ModelError) as caught:
        await collect(make_model().stream(request()))

    assert (caught.value.code, caught.value.retryable, caught.value.retry_after) == (code, retryable, retry_after)
    assert message in str(caught.value)
    assert len(fake_anthropic.received) == 1  # the SDK did not retry on its own


async def test_auth_failure_names_the_env_var_and_hides_the_key(
    fake_anthropic: FakeAnthropic, make_model: MakeModel
) -> None:
    fake_anthropic.api_key = "sk-ant-right"
    secret = "sk-ant-wrong-SECRET-777"

    with pytest.raises(ModelError) as caught:
        await collect(make_model(api_key=secret).stream(request()))

    error = caught.value
    assert (error.code, error.retryable) == ("auth", False)
    assert "ANTHROPIC_API_KEY" in str(error)
    assert "SECRET-777" not in repr(error.args)
    assert error.__cause__ is None and error.__suppress_context__


async def test_overloaded_error_event_inside_the_stream_is_retryable(
    fake_anthropic: FakeAnthropic, make_model: MakeModel
) -> None:
    fake_anthropic.reply("Hal", "f", fail_after_text=Failure(529, "overloaded_error", "Overloaded"))
    received: list[object] = []

    with pytest.raises(ModelError) as caught:
        async for event in make_model().stream(request()):
            received.append(event)

    assert received == [TextDelta(text="Hal"), TextDelta(text="f")]
    assert (caught.value.code, caught.value.retryable) == ("overloaded", True)


async def test_unreachable_server_is_a_retryable_connection_error(closed_port_url: str) -> None:
    model = AnthropicModel(api_key="sk-ant-test", base_url=closed_port_url.removesuffix("/v1"), timeout_s=5)
    try:
        with pytest.raises(ModelError) as caught:
            await collect(model.stream(request()))
    finally:
        await model.aclose()

    assert (caught.value.code, caught.value.retryable) == ("connection", True)
    assert "ANTHROPIC_BASE_URL" in str(caught.value)


async def test_a_stalled_stream_times_out_as_retryable(fake_anthropic: FakeAnthropic, make_model: MakeModel) -> None:
    fake_anthropic.reply("a", "b", "c", stall_after=3)

    with pytest.raises(ModelError) as caught:
        await collect(make_model(timeout_s=0.3).stream(request()))
    fake_anthropic.release()

    assert (caught.value.code, caught.value.retryable) == ("timeout", True)


async def test_the_key_comes_from_the_caller_never_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, fake_anthropic: FakeAnthropic, make_model: MakeModel
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    fake_anthropic.reply("ok")

    await collect(make_model(api_key=None).stream(request()))

    assert fake_anthropic.received[0].headers["authorization"] == "Bearer unused"


async def test_leaving_the_stream_early_releases_the_response(
    fake_anthropic: FakeAnthropic, make_model: MakeModel
) -> None:
    model = make_model()
    fake_anthropic.reply("one", "two", "three")
    fake_anthropic.reply("again")

    stream = model.stream(request())
    first = await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    second = await collect(model.stream(request()))

    assert first == TextDelta(text="one")
    assert second[0] == TextDelta(text="again")


async def test_malformed_json_in_the_stream_is_a_classified_retryable_error(
    fake_anthropic: FakeAnthropic, make_model: MakeModel
) -> None:
    fake_anthropic.reply("a", "b", "c", garble_after=3)

    with pytest.raises(ModelError) as caught:
        await collect(make_model().stream(request()))

    assert (caught.value.code, caught.value.retryable) == ("bad_response", True)
