"""OpenAIModel against the fake OpenAI server, with the official SDK as the client (both wire APIs)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import pytest

from switchboard.core.model import ChatMessage, Finished, TextDelta, ToolCall, ToolCallEvent, ToolSpec, Usage
from switchboard.core.providers.openai import OpenAIModel
from switchboard.core.providers.transcript import MISSING_RESULT
from switchboard.errors import ModelError
from tests.core.turns import MemorySink, MemoryStore, runtime
from tests.core.turns import request as turn_request
from tests.fakes.model_script import Call, Failure
from tests.fakes.openai_api import FakeOpenAI
from tests.providers.conftest import collect, request

WIRES: list[Literal["responses", "chat"]] = ["responses", "chat"]
MakeModel = Callable[..., OpenAIModel]


@pytest.fixture
async def make_model(openai_url: str) -> AsyncIterator[MakeModel]:
    models: list[OpenAIModel] = []

    def make(wire_api: Literal["responses", "chat"] = "responses", **options: Any) -> OpenAIModel:
        values: dict[str, Any] = {"api_key": "sk-test", "base_url": openai_url, "wire_api": wire_api}
        values.update(options)
        model = OpenAIModel(**values)
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


@pytest.mark.parametrize("wire", WIRES)
async def test_text_streams_in_several_deltas_then_usage_and_finish(
    wire: Literal["responses", "chat"], fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.reply("Hel", "lo ", "world", input_tokens=21, output_tokens=3)

    events = await collect(make_model(wire).stream(request()))

    assert events == [
        TextDelta(text="Hel"),
        TextDelta(text="lo "),
        TextDelta(text="world"),
        Usage(input_tokens=21, output_tokens=3),
        Finished(stop_reason="stop"),
    ]


@pytest.mark.parametrize("wire", WIRES)
async def test_tool_calls_are_assembled_from_fragments(
    wire: Literal["responses", "chat"], fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.reply(
        "Checking.",
        calls=[
            Call("get_weather", {"city": "Paris", "days": 3}, call_id="call_a", fragments=5),
            Call("get_weather", {"city": "Oslo"}, call_id="call_b", fragments=2),
        ],
    )

    events = await collect(make_model(wire).stream(request(tools=[WEATHER])))

    calls = [event.call for event in events if isinstance(event, ToolCallEvent)]
    assert calls == [
        ToolCall(id="call_a", name="get_weather", arguments={"city": "Paris", "days": 3}),
        ToolCall(id="call_b", name="get_weather", arguments={"city": "Oslo"}),
    ]
    assert events[0] == TextDelta(text="Checking.")
    assert events[-1] == Finished(stop_reason="tool_calls")


async def test_chat_calls_sent_whole_at_the_same_index_stay_apart(
    fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.whole_calls = True
    fake_openai.reply(calls=[Call("get_weather", {"city": "Lima"}, call_id="c1"), Call("now", {}, call_id="c2")])

    events = await collect(make_model("chat").stream(request(tools=[WEATHER])))

    assert [event.call for event in events if isinstance(event, ToolCallEvent)] == [
        ToolCall(id="c1", name="get_weather", arguments={"city": "Lima"}),
        ToolCall(id="c2", name="now", arguments={}),
    ]


@pytest.mark.parametrize("wire", WIRES)
async def test_invalid_argument_json_is_passed_on_raw(
    wire: Literal["responses", "chat"], fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.reply(calls=[Call("get_weather", '{"city": "Par', call_id="call_x")])

    events = await collect(make_model(wire).stream(request(tools=[WEATHER])))

    [call] = [event.call for event in events if isinstance(event, ToolCallEvent)]
    assert call.arguments == {"_raw": '{"city": "Par'}


async def test_responses_request_shape(fake_openai: FakeOpenAI, make_model: MakeModel) -> None:
    fake_openai.reply("ok")
    messages = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(
            role="assistant",
            content="Let me look.",
            tool_calls=[ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"})],
        ),
        ChatMessage(role="tool", content='{"temp": 21}', tool_call_id="call_1", name="get_weather"),
    ]

    await collect(
        make_model("responses").stream(
            request(messages=messages, tools=[WEATHER], max_output_tokens=99, metadata={"run": "r1"})
        )
    )

    [received] = fake_openai.received
    assert received.path == "/v1/responses"
    assert received.headers["authorization"] == "Bearer sk-test"
    body = received.body
    assert body["model"] == "test-model"
    assert body["instructions"] == "You are terse."
    assert body["stream"] is True
    assert body["store"] is False
    assert body["max_output_tokens"] == 99
    assert body["metadata"] == {"run": "r1"}
    assert body["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": WEATHER.parameters,
            "strict": False,
        }
    ]
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "Weather in Paris?"},
        {"type": "message", "role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 21}'},
    ]


async def test_chat_request_shape(fake_openai: FakeOpenAI, make_model: MakeModel) -> None:
    fake_openai.reply("ok")
    messages = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(
            role="assistant", tool_calls=[ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"})]
        ),
        ChatMessage(role="tool", content='{"temp": 21}', tool_call_id="call_1", name="get_weather"),
    ]

    await collect(make_model("chat").stream(request(messages=messages, tools=[WEATHER], max_output_tokens=77)))

    [received] = fake_openai.received
    assert received.path == "/v1/chat/completions"
    body = received.body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 77  # compatible servers know max_tokens
    assert "max_completion_tokens" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather for a city", "parameters": WEATHER.parameters},
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]


@pytest.mark.parametrize("wire", WIRES)
async def test_tool_result_goes_back_with_its_call_in_the_next_request(
    wire: Literal["responses", "chat"], fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    model = make_model(wire)
    fake_openai.reply(calls=[Call("get_weather", {"city": "Rome"}, call_id="call_77")])
    fake_openai.reply("Sunny in Rome.")
    first = await collect(model.stream(request(tools=[WEATHER])))
    [call] = [event.call for event in first if isinstance(event, ToolCallEvent)]

    history = [
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="assistant", tool_calls=[call]),
        ChatMessage(role="tool", content="sunny", tool_call_id=call.id, name=call.name),
    ]
    second = await collect(model.stream(request(messages=history, tools=[WEATHER])))

    assert second[0] == TextDelta(text="Sunny in Rome.")
    sent = fake_openai.received[1].body
    if wire == "responses":
        assert sent["input"][-2:] == [
            {"type": "function_call", "call_id": "call_77", "name": "get_weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "call_77", "output": "sunny"},
        ]
    else:
        assert sent["messages"][-2]["tool_calls"][0]["id"] == "call_77"
        assert sent["messages"][-1] == {"role": "tool", "tool_call_id": "call_77", "content": "sunny"}


async def test_a_call_without_result_gets_a_stand_in_and_orphan_results_are_dropped(
    fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.reply("ok")
    messages = [
        ChatMessage(role="tool", content="orphan", tool_call_id="call_gone"),
        ChatMessage(role="user", content="go"),
        ChatMessage(role="assistant", tool_calls=[ToolCall(id="call_1", name="get_weather", arguments={})]),
        ChatMessage(role="user", content="and?"),
    ]

    await collect(make_model("responses").stream(request(messages=messages)))

    assert fake_openai.received[0].body["input"] == [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": MISSING_RESULT},
        {"type": "message", "role": "user", "content": "and?"},
    ]


@pytest.mark.parametrize(("wire", "stop"), [("responses", "max_output_tokens"), ("chat", "length")])
async def test_output_cut_short_finishes_with_length(
    wire: Literal["responses", "chat"], stop: str, fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.reply("partial", stop=stop)

    events = await collect(make_model(wire).stream(request()))

    assert events[-1] == Finished(stop_reason="length")


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize(
    ("status", "kind", "headers", "code", "retryable", "retry_after"),
    [
        (429, "rate_limit_exceeded", {"retry-after": "7"}, "rate_limit", True, 7.0),
        (429, "rate_limit_exceeded", {"retry-after-ms": "1500", "retry-after": "9"}, "rate_limit", True, 1.5),
        (429, "insufficient_quota", {}, "quota", False, None),
        (500, "server_error", {}, "server_error", True, None),
        (503, "server_error", {"retry-after": "2"}, "server_error", True, 2.0),
        (400, "context_length_exceeded", {}, "context_length", False, None),
        (400, "invalid_request_error", {}, "bad_request", False, None),
        (404, "model_not_found", {}, "not_found", False, None),
    ],
)
async def test_http_errors_are_classified(
    wire: Literal["responses", "chat"],
    status: int,
    kind: str,
    headers: dict[str, str],
    code: str,
    retryable: bool,
    retry_after: float | None,
    fake_openai: FakeOpenAI,
    make_model: MakeModel,
) -> None:
    fake_openai.fail(status, kind, "something went wrong", headers=headers)

    with pytest.raises(ModelError) as caught:
        await collect(make_model(wire).stream(request()))

    assert (caught.value.code, caught.value.retryable, caught.value.retry_after) == (code, retryable, retry_after)
    assert "something went wrong" in str(caught.value)
    assert len(fake_openai.received) == 1  # the SDK did not retry on its own


async def test_context_length_is_recognised_from_a_compatible_servers_message(
    fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.fail(
        400, "BadRequestError", "This model's maximum context length is 4096 tokens. However, you requested 5000"
    )

    with pytest.raises(ModelError) as caught:
        await collect(make_model("chat").stream(request()))

    assert (caught.value.code, caught.value.retryable) == ("context_length", False)


@pytest.mark.parametrize("wire", WIRES)
async def test_auth_failure_names_the_env_var_and_hides_the_key(
    wire: Literal["responses", "chat"], fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.api_key = "sk-right"
    secret = "sk-wrong-SECRET-4242"

    with pytest.raises(ModelError) as caught:
        await collect(make_model(wire, api_key=secret).stream(request()))

    error = caught.value
    assert (error.code, error.retryable) == ("auth", False)
    assert "OPENAI_API_KEY" in str(error)
    assert "SECRET-4242" not in repr(error.args)
    assert error.__cause__ is None and error.__suppress_context__  # the SDK error echoing the key is not chained


async def test_forbidden_is_an_auth_error(fake_openai: FakeOpenAI, make_model: MakeModel) -> None:
    fake_openai.fail(403, "permission_denied", "no access to model")

    with pytest.raises(ModelError) as caught:
        await collect(make_model("responses").stream(request()))

    assert (caught.value.code, caught.value.retryable) == ("auth", False)
    assert "OPENAI_API_KEY" in str(caught.value)


@pytest.mark.parametrize("wire", WIRES)
async def test_error_inside_the_stream_comes_after_the_text_already_sent(
    wire: Literal["responses", "chat"], fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.reply("Hal", "f", fail_after_text=Failure(500, "server_error", "the model crashed"))
    received: list[object] = []

    with pytest.raises(ModelError) as caught:
        async for event in make_model(wire).stream(request()):
            received.append(event)

    assert received == [TextDelta(text="Hal"), TextDelta(text="f")]
    assert (caught.value.code, caught.value.retryable) == ("server_error", True)
    assert "the model crashed" in str(caught.value)


async def test_unreachable_server_is_a_retryable_connection_error(closed_port_url: str) -> None:
    model = OpenAIModel(api_key="sk-test", base_url=closed_port_url, wire_api="chat", timeout_s=5)
    try:
        with pytest.raises(ModelError) as caught:
            await collect(model.stream(request()))
    finally:
        await model.aclose()

    assert (caught.value.code, caught.value.retryable) == ("connection", True)
    assert "OPENAI_BASE_URL" in str(caught.value)


@pytest.mark.parametrize("wire", WIRES)
async def test_a_stalled_stream_times_out_as_retryable(
    wire: Literal["responses", "chat"], fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.reply("a", "b", "c", stall_after=2)
    model = make_model(wire, timeout_s=0.3)

    with pytest.raises(ModelError) as caught:
        await collect(model.stream(request()))
    fake_openai.release()

    assert (caught.value.code, caught.value.retryable) == ("timeout", True)


async def test_the_key_comes_from_the_caller_never_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    fake_openai.reply("ok")

    await collect(make_model("chat", api_key=None).stream(request()))

    assert fake_openai.received[0].headers["authorization"] == "Bearer unused"


async def test_default_endpoint_is_openai_and_aclose_releases_the_pool() -> None:
    model = OpenAIModel(api_key="sk-test", base_url=None, wire_api="chat")
    try:
        assert model._official
        assert str(model._client.base_url) == "https://api.openai.com/v1/"
    finally:
        await model.aclose()
    assert model._client.is_closed()


@pytest.mark.parametrize("wire", WIRES)
async def test_malformed_json_in_the_stream_is_a_classified_retryable_error(
    wire: Literal["responses", "chat"], fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.reply("a", "b", "c", garble_after=3)

    with pytest.raises(ModelError) as caught:
        await collect(make_model(wire).stream(request()))

    assert (caught.value.code, caught.value.retryable) == ("bad_response", True)
    assert "malformed" in str(caught.value) and "sk-test" not in str(caught.value)


async def test_a_turn_retries_past_a_malformed_stream(
    tmp_path: Path, fake_openai: FakeOpenAI, make_model: MakeModel
) -> None:
    fake_openai.reply("lost", garble_after=1)  # before any text reached the user
    fake_openai.reply("Hello", " again")
    rt = runtime(tmp_path, model=make_model("chat"))

    result = await rt.run_turn(turn_request("hi"), MemorySink(), MemoryStore())

    assert result.text == "Hello again"
    assert len(fake_openai.received) == 2
