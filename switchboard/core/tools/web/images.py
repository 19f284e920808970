"""``generate_image``: a picture drawn by the agent's image provider, saved in the workspace and sent to the user.

The picture lands in the session workspace under ``images/`` (through the workspace quotas), then goes out through
the channel's file send (:class:`~switchboard.core.actions.SendFile`): a photo on Telegram, an inline image on the
web chat. It costs money and reaches the user, so it is a write: the policy asks a person once untrusted content is
in the turn, and the idempotency key keeps a retried call from drawing and sending twice.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.actions import SendFile
from switchboard.core.agent.config import Agent
from switchboard.core.providers.images import ImageProvider
from switchboard.core.tools.builtin.files import WORKSPACE_QUOTA_BYTES
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.threads import run_blocking
from switchboard.core.tools.web.config import ImageGeneration
from switchboard.core.workspaces.disk import Quotas, Workspaces
from switchboard.errors import ToolError

__all__ = ["IMAGES_DIR", "MAX_PROMPT_CHARS", "GenerateImageInput", "image_tool"]

IMAGES_DIR = "images"
"""Workspace directory generated pictures are saved in."""
MAX_PROMPT_CHARS = 4_000
"""Longest prompt sent (OpenAI's limit for DALL·E 3; the GPT image models take more)."""
_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp"}
_SLUG = re.compile(r"[^a-z0-9]+")


class GenerateImageInput(BaseModel):
    """Arguments of ``generate_image``."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS, description="What the picture shows, in detail.")
    caption: str = Field("", max_length=1024, description="Text shown with the picture.")


def _name(prompt: str, key: str, mime_type: str) -> str:
    """``images/<words of the prompt>-<8 hex>.<ext>``: readable, and distinct per logical call."""
    slug = _SLUG.sub("-", prompt.lower()).strip("-")[:40].rstrip("-") or "image"
    digest = hashlib.sha256(f"{key}\n{prompt}".encode()).hexdigest()[:8]
    return f"{IMAGES_DIR}/{slug}-{digest}.{_EXTENSIONS[mime_type]}"


def _save(ctx: ToolContext, relative: str, data: bytes) -> int:
    workspaces = ctx.workspaces or Workspaces(None, Quotas(session_bytes=WORKSPACE_QUOTA_BYTES))
    target = ctx.workspace.resolve().joinpath(*relative.split("/"))
    return workspaces.store(ctx.workspace, target, data, shown=relative)


def image_tool(agents: Callable[[], Mapping[str, Agent]], provider: ImageProvider | None) -> Tool:
    """The ``generate_image`` tool over each agent's ``images:`` block (``provider`` ``None``: calls fail)."""

    async def call(args: GenerateImageInput, ctx: ToolContext) -> dict[str, Any]:
        if provider is None:
            raise ToolError("generate_image has no image provider in this process (set OPENAI_API_KEY)")
        agent = agents().get(ctx.agent)
        config = agent.images if agent is not None else ImageGeneration()
        image = await provider.generate(
            args.prompt,
            model=config.model,
            size=config.size,
            quality=config.quality,
            timeout_s=config.timeout_s,
            format=config.format,
            compression=config.compression,
        )
        relative = _name(args.prompt, ctx.idempotency_key or ctx.run_id, image.mime_type)
        size = await run_blocking(ctx, _save, ctx, relative, image.data)
        found: dict[str, Any] = {"path": relative, "bytes": size, "mime_type": image.mime_type}
        if image.revised_prompt:
            found["revised_prompt"] = image.revised_prompt[:MAX_PROMPT_CHARS]
        if ctx.act is None:
            return {**found, "sent": False, "note": "saved in the workspace; this conversation has no channel"}
        await ctx.act(SendFile(path=relative, caption=args.caption, mime_type=image.mime_type))
        return {**found, "sent": True}

    return Tool(
        name="generate_image",
        description=(
            "Draw a picture from a text description; it is saved in your workspace under images/ and sent to the "
            "user (do not send it again)."
        ),
        input=GenerateImageInput,
        fn=call,
        side_effect="write",
        # as send_file: reaches only this conversation's user, but it costs money; approved after untrusted content
        risk="medium",
        reversible=True,
        resources=lambda args: (f"a generated image sent to this conversation: {args.prompt[:200]}",),
        key_fields=("prompt",),
        timeout_s=180.0,
        connector="images",
        retry_on=frozenset(),  # a second call would draw (and pay) again
    )
