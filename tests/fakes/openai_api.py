"""A fake OpenAI API: ``POST /v1/responses`` and ``POST /v1/chat/completions``, streaming over SSE,
``POST /v1/responses/compact`` (native compaction), ``POST /v1/audio/transcriptions`` (multipart, answering
``{"text": ...}`` from :attr:`FakeOpenAI.transcripts`), ``POST /v1/audio/speech`` (JSON in, audio bytes out: a
real OGG/Opus stream as long as the text would take to say, for ``response_format: opus``) and
``POST /v1/images/generations`` (JSON in, ``{"data": [{"b64_json": ...}]}`` out) and ``POST /v1/embeddings``
(deterministic vectors, as floats or base64). Hosted web searches
(:attr:`Reply.searches`) stream as ``web_search_call`` items.

Speaks the wire format the official ``openai`` SDK parses (checked against its types in
``tests/providers/test_fake_wire.py``): Responses events (``response.created`` ...
``response.output_text.delta``, ``response.function_call_arguments.delta/done``,
``response.output_item.added/done``, ``response.completed`` with usage) and Chat Completions chunks
(``delta.content``, ``delta.tool_calls[i].function.arguments`` fragments, a usage chunk, ``[DONE]``).
Errors use OpenAI's body shape ``{"error": {"message", "type", "param", "code"}}``.

Hosted shell runs (:attr:`Reply.shell`) stream as OpenAI runs them: a ``shell_call`` item whose commands arrive
through ``response.shell_call_command.added/delta/done``, then a ``shell_call_output`` item whose output arrives
through ``response.shell_call_output_content.delta/done``. Compaction answers a ``response.compaction`` object:
the user messages of the input, then one ``compaction`` item whose ``encrypted_content`` only this fake issued;
a later request carrying a compaction item it did not issue is refused with a 400, as OpenAI refuses one.
The files a hosted run writes land in the container, listed by ``GET /v1/containers/{id}/files`` (newest first)
and read by ``GET /v1/containers/{id}/files/{file_id}/content``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import struct
import time
from collections import deque
from typing import Any

from aiohttp import web

from switchboard.core.memory.embeddings import LocalEmbedder
from switchboard.core.providers.oggopus import silent_opus
from tests.fakes.model_script import GARBLED, Failure, Received, Reply, Script, ShellRun, split

__all__ = ["CONTAINER_ID", "IMAGES", "FakeOpenAI", "chat_chunks", "compacted_body", "error_body", "responses_events"]

IMAGES = {
    "png": b"\x89PNG\r\n\x1a\n" + bytes(range(200)),
    "jpeg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(200)),
    "webp": b"RIFF\x00\x10\x00\x00WEBPVP8 " + bytes(range(200)),
}
"""What the fake draws in each ``output_format`` (the format's signature and some bytes)."""
CONTAINER_ID = "cntr_fake"
"""The hosted container the fake's shell calls run in."""

Event = tuple[str | None, dict[str, Any] | str]


def error_body(failure: Failure) -> dict[str, Any]:
    """OpenAI's error shape; ``kind`` goes in ``code`` (and ``type`` for the generic kinds)."""
    generic = {"invalid_request_error", "server_error", "rate_limit_error", "insufficient_quota"}
    return {
        "error": {
            "message": failure.message,
            "type": failure.kind if failure.kind in generic else "invalid_request_error",
            "param": None,
            "code": failure.kind,
        }
    }


def _response(model: str, *, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        **extra,
    }


def responses_events(reply: Reply, model: str) -> list[Event]:
    """The Responses API event stream for ``reply``."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response(model, status="in_progress", output=[])},
        {"type": "response.in_progress", "response": _response(model, status="in_progress", output=[])},
    ]
    output: list[dict[str, Any]] = []
    for query in reply.searches:
        events += _search_events(query, len(output), output)
    for run in reply.shell:
        events += _shell_events(run, len(output), output)
    if reply.text:
        index, item_id, full = len(output), "msg_fake", "".join(reply.text)
        item = {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        events.append(
            {
                "type": "response.content_part.added",
                "output_index": index,
                "item_id": item_id,
                "content_index": 0,
                "part": part,
            }
        )
        for delta in reply.text:
            events.append(
                {
                    "type": "response.output_text.delta",
                    "output_index": index,
                    "item_id": item_id,
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": [],
                }
            )
        if reply.fail_after_text is None:
            done_part = {**part, "text": full}
            done_item = {**item, "status": "completed", "content": [done_part]}
            events.append(
                {
                    "type": "response.output_text.done",
                    "output_index": index,
                    "item_id": item_id,
                    "content_index": 0,
                    "text": full,
                    "logprobs": [],
                }
            )
            events.append(
                {
                    "type": "response.content_part.done",
                    "output_index": index,
                    "item_id": item_id,
                    "content_index": 0,
                    "part": done_part,
                }
            )
            events.append({"type": "response.output_item.done", "output_index": index, "item": done_item})
            output.append(done_item)
    if reply.fail_after_text is not None:
        failure = reply.fail_after_text
        error = {"code": failure.kind, "message": failure.message}
        events.append(
            {"type": "response.failed", "response": _response(model, status="failed", output=[], error=error)}
        )
        return _numbered(events)
    for call in reply.calls:
        index, item_id = len(output), f"fc_{call.call_id}"
        item = {
            "type": "function_call",
            "id": item_id,
            "call_id": call.call_id,
            "name": call.name,
            "arguments": "",
            "status": "in_progress",
        }
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        for delta in split(call.raw, call.fragments):
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "output_index": index,
                    "item_id": item_id,
                    "delta": delta,
                }
            )
        events.append(
            {
                "type": "response.function_call_arguments.done",
                "output_index": index,
                "item_id": item_id,
                "arguments": call.raw,
            }
        )
        done_item = {**item, "arguments": call.raw, "status": "completed"}
        events.append({"type": "response.output_item.done", "output_index": index, "item": done_item})
        output.append(done_item)
    usage = {
        "input_tokens": reply.input_tokens,
        "input_tokens_details": {"cached_tokens": reply.cached_input_tokens, "cache_write_tokens": 0},
        "output_tokens": reply.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }
    if reply.stop is not None:
        details = {"reason": reply.stop}
        final = _response(model, status="incomplete", output=output, usage=usage, incomplete_details=details)
        events.append({"type": "response.incomplete", "response": final})
    else:
        events.append(
            {"type": "response.completed", "response": _response(model, status="completed", output=output, usage=usage)}
        )
    return _numbered(events)


def _search_events(query: str, index: int, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A hosted web search as OpenAI streams it: a ``web_search_call`` item, its progress events, then done."""
    item_id = f"ws_{index:04d}"
    item: dict[str, Any] = {"type": "web_search_call", "id": item_id, "status": "in_progress"}
    item["action"] = {"type": "search", "query": query}
    sources = [{"type": "url", "url": "https://example.org/found"}]
    done = {**item, "status": "completed", "action": {"type": "search", "query": query, "sources": sources}}
    where = {"output_index": index, "item_id": item_id}
    output.append(done)
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {"type": "response.web_search_call.in_progress", **where},
        {"type": "response.web_search_call.searching", **where},
        {"type": "response.web_search_call.completed", **where},
        {"type": "response.output_item.done", "output_index": index, "item": done},
    ]


def _shell_events(run: ShellRun, index: int, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A hosted shell call and its output, as two output items (appended to ``output``) and their events."""
    call_id, item_id = run.call_id, f"sh_{run.call_id}"
    environment = {"type": "container_reference", "container_id": CONTAINER_ID}
    action: dict[str, Any] = {"commands": [], "timeout_ms": None, "max_output_length": None}
    call = {"type": "shell_call", "id": item_id, "call_id": call_id, "action": action, "status": "in_progress"}
    call["environment"] = environment
    events: list[dict[str, Any]] = [{"type": "response.output_item.added", "output_index": index, "item": call}]
    for n, command in enumerate(run.commands):
        where: dict[str, Any] = {"output_index": index, "command_index": n}
        events.append({"type": "response.shell_call_command.added", **where, "command": ""})
        events += [{"type": "response.shell_call_command.delta", **where, "delta": d} for d in split(command, 2)]
        events.append({"type": "response.shell_call_command.done", **where, "command": command})
    done_call = {**call, "action": {**action, "commands": list(run.commands)}, "status": "completed"}
    events.append({"type": "response.output_item.done", "output_index": index, "item": done_call})
    out_index, out_id = index + 1, f"sho_{run.call_id}"
    result: dict[str, Any] = {
        "type": "shell_call_output",
        "id": out_id,
        "call_id": call_id,
        "output": [],
        "status": "in_progress",
    }
    result["max_output_length"] = None
    events.append({"type": "response.output_item.added", "output_index": out_index, "item": result})
    chunks = []
    for n, _ in enumerate(run.commands):
        stdout = run.stdout[n] if n < len(run.stdout) else ""
        where = {"output_index": out_index, "item_id": out_id, "command_index": n}
        events.append({"type": "response.shell_call_output_content.delta", **where, "delta": {"stdout": stdout}})
        chunk = {"stdout": stdout, "stderr": "", "outcome": {"type": "exit", "exit_code": run.exit_code}}
        events.append({"type": "response.shell_call_output_content.done", **where, "output": [chunk]})
        chunks.append(chunk)
    done_result = {**result, "output": chunks, "status": "completed"}
    events.append({"type": "response.output_item.done", "output_index": out_index, "item": done_result})
    output += [done_call, done_result]
    return events


def encrypted(items: Any) -> str:
    """What the fake's compaction item carries: opaque, and derived only from the compacted input."""
    return "gAAAAB" + hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


def compacted_body(body: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/responses/compact``'s answer: the input's user messages, then one compaction item."""
    items = body.get("input") or []
    kept: list[dict[str, Any]] = []
    for n, item in enumerate(items if isinstance(items, list) else [{"role": "user", "content": items}]):
        if item.get("role") != "user" or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
        kept.append({"type": "message", "id": f"msg_c{n}", "role": "user", "content": parts, "status": "completed"})
    compaction = {"type": "compaction", "id": "cmp_fake", "encrypted_content": encrypted(items)}
    usage = {
        "input_tokens": len(json.dumps(items)) // 4,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 40,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": len(json.dumps(items)) // 4 + 40,
    }
    return {
        "id": "cmp_resp_fake",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*kept, compaction],
        "usage": usage,
    }


def _numbered(events: list[dict[str, Any]]) -> list[Event]:
    return [(event["type"], {**event, "sequence_number": n}) for n, event in enumerate(events)]


def chat_chunks(reply: Reply, model: str, *, include_usage: bool, whole_calls: bool = False) -> list[Event]:
    """The Chat Completions chunk stream for ``reply``, ending with ``[DONE]``.

    With ``whole_calls`` each tool call arrives complete in one chunk, all at index 0, as some
    OpenAI-compatible servers (Ollama) send them.
    """
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> Event:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return None, {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    events: list[Event] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": text}) for text in reply.text]
    if reply.fail_after_text is not None:
        failure = reply.fail_after_text
        events.append((None, error_body(failure)))
        return events
    for index, call in enumerate(reply.calls):
        if whole_calls:
            function = {"name": call.name, "arguments": call.raw}
            events.append(
                chunk({"tool_calls": [{"index": 0, "id": call.call_id, "type": "function", "function": function}]})
            )
            continue
        head = {
            "index": index,
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        for fragment in split(call.raw, call.fragments):
            events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}))
    finish = reply.stop or ("tool_calls" if reply.calls else "stop")
    events.append(chunk({}, finish))
    if include_usage:
        usage = {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.cached_input_tokens},
        }
        events.append(
            (
                None,
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                },
            )
        )
    events.append((None, "[DONE]"))
    return events


class FakeOpenAI(Script):
    """The fake server's state: the script, the received requests and the aiohttp app."""

    whole_calls = False
    """Chat Completions only: send each tool call whole, at index 0 (Ollama's style)."""

    def __init__(self, *, api_key: str | None = None) -> None:
        super().__init__(api_key=api_key)
        self.transcripts: deque[str] = deque()
        """What ``POST /v1/audio/transcriptions`` answers, in order (then ``"fake transcript"``)."""
        self.audio_status = 200
        """Answer transcriptions with this status instead (errors in OpenAI's shape)."""
        self.speech_status = 200
        """Answer speech requests with this status instead (errors in OpenAI's shape)."""
        self.speech_delay_s = 0.0
        """Wait this long before answering a speech request (a slow provider)."""
        self.speech_body: bytes | None = None
        """Answer speech requests with these bytes instead of the audio (a provider that sends something else)."""
        self.compact_failure: Failure | None = None
        """Answer every ``/v1/responses/compact`` with this error while set."""
        self.issued: set[str] = set()
        """``encrypted_content`` of every compaction item this fake answered (others are refused)."""
        self.image: bytes | None = None
        """What ``POST /v1/images/generations`` draws instead of :data:`IMAGES` (its bytes, sent as ``b64_json``)."""
        self.image_status = 200
        """Answer image requests with this status instead (errors in OpenAI's shape)."""
        self.embeddings_status = 200
        """Answer embeddings requests with this status instead (errors in OpenAI's shape)."""
        self.container: list[dict[str, Any]] = []
        """The files of the hosted container :data:`CONTAINER_ID`, oldest first (``content`` is not listed)."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/responses/compact", self._compact)
        app.router.add_get("/v1/containers/{container}/files", self._container_files)
        app.router.add_get("/v1/containers/{container}/files/{file}/content", self._container_file)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/audio/transcriptions", self._transcriptions)
        app.router.add_post("/v1/audio/speech", self._speech)
        app.router.add_post("/v1/images/generations", self._images)
        app.router.add_post("/v1/embeddings", self._embeddings)
        return app

    async def _embeddings(self, request: web.Request) -> web.Response:
        """OpenAI's embeddings route: ``{"model", "input", "dimensions"?, "encoding_format"?}`` in, vectors out.

        Each vector is the deterministic local embedding of its text at the model's length (``dimensions`` when
        given: text-embedding-3 models only, as OpenAI refuses it for others), as floats or, with
        ``encoding_format: base64``, as little-endian float32 bytes in base64. An empty input, an empty string or
        more than 2,048 inputs are refused as OpenAI refuses them; the key is checked like the model routes.
        """
        body = await request.json()
        self.received.append(
            Received(path=request.path, headers={k.lower(): v for k, v in request.headers.items()}, body=body)
        )
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and presented != self.api_key:
            message = f"Incorrect API key provided: {presented}."
            return web.json_response(error_body(Failure(401, "invalid_api_key", message)), status=401)
        if self.embeddings_status != 200:
            failure = Failure(self.embeddings_status, "server_error", "fake: embeddings failed")
            return web.json_response(error_body(failure), status=self.embeddings_status)
        model = str(body.get("model") or "")
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else raw
        if (
            not isinstance(texts, list)
            or not texts
            or len(texts) > 2048
            or not all(isinstance(text, str) and text for text in texts)
        ):
            failure = Failure(400, "invalid_request_error", "'$.input' is invalid. Please check the API reference.")
            return web.json_response(error_body(failure), status=400)
        native = {"text-embedding-3-large": 3072}.get(model, 1536)
        dims = body.get("dimensions")
        if dims is not None and not model.startswith("text-embedding-3"):
            failure = Failure(400, "invalid_request_error", "This model does not support specifying dimensions.")
            return web.json_response(error_body(failure), status=400)
        size = int(dims) if dims is not None else native
        embedder = LocalEmbedder(size)
        data: list[dict[str, Any]] = []
        for index, text in enumerate(texts):
            vector = embedder.vector(text)
            encoded: Any = vector
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(len(text.split()) for text in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return web.json_response({"object": "list", "data": data, "model": model, "usage": usage})

    def embedding_requests(self) -> list[Received]:
        """The embeddings requests received, in order."""
        return [r for r in self.received if r.path == "/v1/embeddings"]

    async def _images(self, request: web.Request) -> web.Response:
        """OpenAI's image generation route: ``{"model", "prompt", "n", "size", ...}`` in, ``b64_json`` pictures out.

        Checks the key like the model routes; a missing prompt, ``n`` other than 1 or ``response_format`` sent for
        a GPT image model (which always answers base64 and refuses the field) is refused as OpenAI refuses it.
        """
        body = await request.json()
        self.received.append(
            Received(path=request.path, headers={k.lower(): v for k, v in request.headers.items()}, body=body)
        )
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and presented != self.api_key:
            message = f"Incorrect API key provided: {presented}."
            return web.json_response(error_body(Failure(401, "invalid_api_key", message)), status=401)
        model = str(body.get("model") or "dall-e-2")
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt or body.get("n", 1) != 1:
            failure = Failure(400, "invalid_request_error", "fake: a prompt and n=1 are required")
            return web.json_response(error_body(failure), status=400)
        refused = ("response_format",) if model.startswith("gpt-image") else ("output_format", "output_compression")
        if unknown := [name for name in refused if name in body]:
            failure = Failure(400, "invalid_request_error", f"Unknown parameter: '{unknown[0]}'.")
            return web.json_response(error_body(failure), status=400)
        if self.image_status != 200:
            failure = Failure(self.image_status, "server_error", "fake: image generation failed")
            return web.json_response(error_body(failure), status=self.image_status)
        drawn = self.image if self.image is not None else IMAGES[str(body.get("output_format") or "png")]
        picture = {"b64_json": base64.b64encode(drawn).decode("ascii")}
        if model == "dall-e-3":
            picture["revised_prompt"] = f"{prompt}, in detail"
        usage = {"input_tokens": 10, "output_tokens": 100, "total_tokens": 110}
        usage["input_tokens_details"] = {"text_tokens": 10, "image_tokens": 0}
        return web.json_response({"created": int(time.time()), "data": [picture], "usage": usage})

    def image_requests(self) -> list[Received]:
        """The image generation requests received, in order."""
        return [r for r in self.received if r.path == "/v1/images/generations"]

    def images(self) -> list[str]:
        """Every image URL the model requests carried (``input_image`` and ``image_url`` parts), in order."""
        found: list[str] = []
        for received in self.received:
            for item in received.body.get("input") or received.body.get("messages") or []:
                content = item.get("content") if isinstance(item, dict) else None
                for part in content if isinstance(content, list) else []:
                    if part.get("type") == "input_image":
                        found.append(part["image_url"])
                    elif part.get("type") == "image_url":
                        found.append(part["image_url"]["url"])
        return found

    async def _transcriptions(self, request: web.Request) -> web.Response:
        """OpenAI's audio transcription route: a multipart upload with ``file`` and ``model``."""
        form = await request.post()
        upload = form.get("file")
        data = upload.file.read() if isinstance(upload, web.FileField) else b""
        body = {
            "model": str(form.get("model", "")),
            "file_name": upload.filename if isinstance(upload, web.FileField) else "",
            "content_type": upload.content_type if isinstance(upload, web.FileField) else "",
            "bytes": len(data),
        }
        self.received.append(
            Received(path=request.path, headers={k.lower(): v for k, v in request.headers.items()}, body=body)
        )
        if self.audio_status != 200:
            failure = Failure(status=self.audio_status, kind="server_error", message="fake: transcription failed")
            return web.json_response(error_body(failure), status=self.audio_status)
        return web.json_response({"text": self.transcripts.popleft() if self.transcripts else "fake transcript"})

    async def _speech(self, request: web.Request) -> web.Response:
        """OpenAI's speech route: ``{"model", "input", "voice", "response_format"}`` in, the audio file's bytes out.

        Checks the key like the model routes; ``input`` over 4,096 characters is refused as OpenAI refuses it. The
        audio is silence lasting about as long as the text would take to say (15 characters a second).
        """
        body = await request.json()
        self.received.append(
            Received(path=request.path, headers={k.lower(): v for k, v in request.headers.items()}, body=body)
        )
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and presented != self.api_key:
            message = f"Incorrect API key provided: {presented}."  # OpenAI echoes (part of) the key it refused
            return web.json_response(error_body(Failure(401, "invalid_api_key", message)), status=401)
        if self.speech_delay_s:
            await asyncio.sleep(self.speech_delay_s)
        text = body.get("input")
        if not isinstance(text, str) or not text or len(text) > 4096 or not body.get("voice") or not body.get("model"):
            failure = Failure(400, "invalid_request_error", "fake: input (1-4096 characters), voice, model required")
            return web.json_response(error_body(failure), status=400)
        if self.speech_status != 200:
            failure = Failure(status=self.speech_status, kind="server_error", message="fake: speech failed")
            return web.json_response(error_body(failure), status=self.speech_status)
        if body.get("response_format", "mp3") != "opus":
            failure = Failure(400, "invalid_request_error", "fake: only response_format opus is served")
            return web.json_response(error_body(failure), status=400)
        if self.speech_body is not None:
            return web.Response(body=self.speech_body, content_type="audio/ogg")
        return web.Response(body=silent_opus(max(len(text) / 15, 0.1)), content_type="audio/ogg")

    def speech(self) -> list[Received]:
        """The speech requests received, in order."""
        return [r for r in self.received if r.path == "/v1/audio/speech"]

    def put_file(self, path: str, content: bytes, *, source: str = "assistant") -> None:
        """A file in the hosted container (``source``: ``assistant`` for what commands wrote, ``user`` uploads)."""
        number = len(self.container) + 1
        entry: dict[str, Any] = {
            "id": f"cfile_{number}",
            "object": "container.file",
            "container_id": CONTAINER_ID,
            "path": path,
        }
        entry.update({"bytes": len(content), "created_at": int(time.time()) + number, "source": source})
        self.container.append({**entry, "content": content})

    async def _container_files(self, request: web.Request) -> web.Response:
        self.received.append(Received(path=request.path, headers={}, body=dict(request.query)))
        if request.match_info["container"] != CONTAINER_ID:
            return web.json_response(error_body(Failure(404, "not_found", "fake: no such container")), status=404)
        limit = int(request.query.get("limit", "20"))
        newest = sorted(self.container, key=lambda f: f["created_at"], reverse=request.query.get("order") != "asc")
        data = [{k: v for k, v in f.items() if k != "content"} for f in newest[:limit]]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        has_more = len(newest) > limit
        return web.json_response(
            {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more}
        )

    async def _container_file(self, request: web.Request) -> web.Response:
        self.received.append(Received(path=request.path, headers={}, body={}))
        found = [f for f in self.container if f["id"] == request.match_info["file"]]
        if request.match_info["container"] != CONTAINER_ID or not found:
            return web.json_response(error_body(Failure(404, "not_found", "fake: no such file")), status=404)
        return web.Response(body=found[0]["content"], content_type="application/octet-stream")

    def compactions(self) -> list[Received]:
        """The compaction requests received, in order."""
        return [r for r in self.received if r.path == "/v1/responses/compact"]

    def responses(self) -> list[Received]:
        """The ``/v1/responses`` requests received, in order."""
        return [r for r in self.received if r.path == "/v1/responses"]

    async def _compact(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received.append(
            Received(path=request.path, headers={k.lower(): v for k, v in request.headers.items()}, body=body)
        )
        if self.compact_failure is not None:
            failure = self.compact_failure
            return web.json_response(error_body(failure), status=failure.status, headers=failure.headers)
        refused = self._unknown_compaction(body)
        if refused is not None:
            return refused
        answer = compacted_body(body)
        self.issued.add(answer["output"][-1]["encrypted_content"])
        return web.json_response(answer)

    def _unknown_compaction(self, body: dict[str, Any]) -> web.Response | None:
        """OpenAI's 400 for a compaction item it cannot decrypt (``None`` when every one is known)."""
        for item in body.get("input") or []:
            known = not isinstance(item, dict) or item.get("type") != "compaction"
            if not known and item.get("encrypted_content") not in self.issued:
                failure = Failure(400, "invalid_encrypted_content", "fake: the encrypted content is not valid")
                return web.json_response(error_body(failure), status=400)
        return None

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, lambda reply, body: responses_events(reply, body.get("model", "")))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        def render(reply: Reply, body: dict[str, Any]) -> list[Event]:
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return chat_chunks(reply, body.get("model", ""), include_usage=include, whole_calls=self.whole_calls)

        return await self._serve(request, render)

    async def _serve(self, request: web.Request, render: Any) -> web.StreamResponse:
        body = await request.json()
        self.received.append(
            Received(path=request.path, headers={k.lower(): v for k, v in request.headers.items()}, body=body)
        )
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and presented != self.api_key:
            message = (
                f"Incorrect API key provided: {presented}. You can find your API key at https://platform.openai.com."
            )
            failure = Failure(status=401, kind="invalid_api_key", message=message)
            return web.json_response(error_body(failure), status=401)
        refused = self._unknown_compaction(body) if request.path == "/v1/responses" else None
        if refused is not None:
            return refused
        item = self.next()
        if isinstance(item, Failure) and not item.mid_stream:
            return web.json_response(error_body(item), status=item.status, headers=item.headers)
        if not body.get("stream"):
            return web.json_response(error_body(Failure(400, "invalid_request_error", "fake: stream only")), status=400)
        reply = item if isinstance(item, Reply) else Reply(fail_after_text=item)
        for run in reply.shell:  # the container runs the commands: what they write is there from now on
            for path, content in run.files.items():
                self.put_file(path, content)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for n, (name, data) in enumerate(render(reply, body)):
                if reply.stall_after is not None and n == reply.stall_after:
                    await self.stall()
                if reply.garble_after is not None and n == reply.garble_after:
                    await response.write(f"{f'event: {name}' if name else ''}\ndata: {GARBLED}\n\n".lstrip().encode())
                    break
                payload = data if isinstance(data, str) else json.dumps(data)
                await response.write((f"event: {name}\n" if name else "").encode() + f"data: {payload}\n\n".encode())
            await response.write_eof()
        return response
