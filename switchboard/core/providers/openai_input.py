"""The neutral conversation in OpenAI's two wire formats: Responses API input items and Chat Completions messages.

A user message with images carries them as ``input_image`` parts (Responses) or ``image_url`` parts (Chat
Completions), as base64 ``data:`` URLs. Tool calls and results are paired first (:func:`paired`).
"""

from __future__ import annotations

from collections.abc import Sequence

from openai.types.chat import (
    ChatCompletionContentPartParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)
from openai.types.responses import FunctionToolParam, ResponseInputItemParam, ResponseInputMessageContentListParam

from switchboard.core.model import ChatMessage, ImagePart
from switchboard.core.providers.transcript import arguments_json, paired

__all__ = ["chat_messages", "data_url", "function_tool", "responses_input"]


def data_url(image: ImagePart) -> str:
    """An image as a base64 ``data:`` URL."""
    return f"data:{image.mime_type};base64,{image.data}"


def function_tool(name: str, description: str, parameters: dict[str, object]) -> FunctionToolParam:
    """A function tool of the Responses API (not strict: the gateway validates arguments itself)."""
    return {"type": "function", "name": name, "description": description, "parameters": parameters, "strict": False}


def responses_input(messages: Sequence[ChatMessage]) -> list[ResponseInputItemParam]:
    """The conversation as Responses API input items."""
    items: list[ResponseInputItemParam] = []
    for message in paired(messages):
        if message.role == "user" and message.images:
            parts: ResponseInputMessageContentListParam = [{"type": "input_text", "text": message.content}]
            for image in message.images:
                parts.append({"type": "input_image", "image_url": data_url(image), "detail": "auto"})
            items.append({"type": "message", "role": "user", "content": parts})
        elif message.role == "user":
            items.append({"type": "message", "role": "user", "content": message.content})
        elif message.role == "assistant":
            if message.content:
                items.append({"type": "message", "role": "assistant", "content": message.content})
            for call in message.tool_calls:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.id,
                        "name": call.name,
                        "arguments": arguments_json(call.arguments),
                    }
                )
        else:
            items.append({"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content})
    return items


def chat_messages(system: str, messages: Sequence[ChatMessage]) -> list[ChatCompletionMessageParam]:
    """The instructions and the conversation as Chat Completions messages."""
    out: list[ChatCompletionMessageParam] = []
    if system:
        out.append({"role": "system", "content": system})
    for message in paired(messages):
        if message.role == "user" and message.images:
            content: list[ChatCompletionContentPartParam] = [{"type": "text", "text": message.content}]
            for image in message.images:
                content.append({"type": "image_url", "image_url": {"url": data_url(image), "detail": "auto"}})
            out.append({"role": "user", "content": content})
        elif message.role == "user":
            out.append({"role": "user", "content": message.content})
        elif message.role == "assistant":
            calls: list[ChatCompletionMessageFunctionToolCallParam] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments_json(call.arguments)},
                }
                for call in message.tool_calls
            ]
            if calls:
                out.append({"role": "assistant", "content": message.content or None, "tool_calls": calls})
            else:
                out.append({"role": "assistant", "content": message.content})
        else:
            out.append({"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content})
    return out
