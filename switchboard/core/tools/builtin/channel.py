"""Channel actions as tools: ``send_file`` (a file or image from the workspace) and ``offer_choice``.

``send_file`` names the file by its path relative to the session workspace, so whichever worker sends it reads
it from the workspace store; ``offer_choice`` gives each option an id that comes back when the user picks it.
Both ask the conversation's channel to act through ``ToolContext.act``; the channel renders them in its
own dialect (a photo or a document; native buttons or a numbered list). They are side effects, so the
gateway stamps them with idempotency keys and approval policy applies to them as to any write.
"""

from __future__ import annotations

import mimetypes
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from switchboard.core.actions import Action, Choice, OfferChoice, SendFile
from switchboard.core.approvals.records import APPROVAL_OPTION_PREFIX
from switchboard.core.tools.builtin.files import check_relative_path, resolve_in_workspace
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.threads import run_blocking
from switchboard.errors import ToolError

__all__ = [
    "MAX_OPTIONS",
    "MAX_OPTION_CHARS",
    "MAX_OPTION_ID_CHARS",
    "MAX_SEND_BYTES",
    "TOOLS",
    "OfferChoiceInput",
    "OptionInput",
    "SendFileInput",
    "offer_choice",
    "send_file",
]

MAX_SEND_BYTES = 50 * 2**20
"""Largest file sent (the smallest common platform cap: Telegram bots upload up to 50 MB)."""
MAX_OPTIONS = 10
MAX_OPTION_CHARS = 64
"""Button labels stay short on every platform (Telegram and Slack truncate or refuse longer ones)."""
MAX_OPTION_ID_CHARS = 64
"""An option id travels with the button (Telegram's ``callback_data`` holds 64 bytes)."""
_ID_UNSAFE = re.compile(r"[^a-z0-9_.:]+")


class SendFileInput(BaseModel):
    """Arguments of ``send_file``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="Path of the file, relative to the session workspace.")
    caption: str = Field("", max_length=1024, description="Text shown with the file.")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return check_relative_path(value)


class OptionInput(BaseModel):
    """One option of ``offer_choice`` with an id of the model's choosing."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=MAX_OPTION_ID_CHARS, pattern=r"^[A-Za-z0-9_.:-]+$")
    label: str = Field(min_length=1, max_length=MAX_OPTION_CHARS)

    @field_validator("id")
    @classmethod
    def _not_a_decision(cls, value: str) -> str:
        if value.lower().startswith(APPROVAL_OPTION_PREFIX):
            raise ValueError(f"option ids starting with {APPROVAL_OPTION_PREFIX!r} are the gateway's approval buttons")
        return value


class OfferChoiceInput(BaseModel):
    """Arguments of ``offer_choice``."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=1000, description="What the user is asked.")
    options: list[str | OptionInput] = Field(
        min_length=2,
        max_length=MAX_OPTIONS,
        description=(
            f"2 to {MAX_OPTIONS} short answers to pick from: labels, or {{id, label}} objects. The user's pick "
            "comes back as 'chose option <id> (<label>)'; a plain label gets an id made from it."
        ),
    )

    @field_validator("options")
    @classmethod
    def _distinct_short(cls, value: list[str | OptionInput]) -> list[str | OptionInput]:
        labels = [(option if isinstance(option, str) else option.label).strip() for option in value]
        if any(not label for label in labels):
            raise ValueError("an option is empty")
        if too_long := [label for label in labels if len(label) > MAX_OPTION_CHARS]:
            raise ValueError(f"options must be at most {MAX_OPTION_CHARS} characters: {too_long[0]!r} is longer")
        if len(set(labels)) != len(labels):
            raise ValueError("options must be distinct")
        ids = [option.id for option in value if isinstance(option, OptionInput)]
        if len(set(ids)) != len(ids):
            raise ValueError("option ids must be distinct")
        return [option.strip() if isinstance(option, str) else option for option in value]

    def choices(self) -> list[Choice]:
        """The options as ``Choice(id, label)``: given ids kept, a plain label's id made from it (unique)."""
        taken = {option.id for option in self.options if isinstance(option, OptionInput)}
        out: list[Choice] = []
        for number, option in enumerate(self.options, 1):
            if isinstance(option, OptionInput):
                out.append(Choice(id=option.id, label=option.label.strip()))
                continue
            made = _ID_UNSAFE.sub("-", option.lower()).strip("-")[:MAX_OPTION_ID_CHARS] or str(number)
            if made.startswith(APPROVAL_OPTION_PREFIX):  # never shaped like an approval button's id
                made = made.replace(":", "-")
            while made in taken:
                made = f"{made[: MAX_OPTION_ID_CHARS - 4]}-{number}"
            taken.add(made)
            out.append(Choice(id=made, label=option))
        return out


async def _act(ctx: ToolContext, action: Action) -> None:
    if ctx.act is None:
        raise ToolError("this conversation has no channel to send to", error_class="permanent")
    await ctx.act(action)


def _file_to_send(ctx: ToolContext, path: str) -> tuple[str, int, str | None]:
    """The file's path relative to the workspace (any worker can send it), its size and type."""
    target = resolve_in_workspace(ctx.workspace, path)
    if not target.is_file():
        raise ToolError(f"no file {path!r} in the session workspace", error_class="validation")
    size = target.stat().st_size
    if size > MAX_SEND_BYTES:
        raise ToolError(f"{path!r} is {size} bytes, over the {MAX_SEND_BYTES}-byte send cap")
    return target.relative_to(ctx.workspace.resolve()).as_posix(), size, mimetypes.guess_type(target.name)[0]


async def send_file(args: SendFileInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: send a workspace file to the conversation."""
    target, size, mime_type = await run_blocking(ctx, _file_to_send, ctx, args.path)
    await _act(ctx, SendFile(path=target, caption=args.caption, mime_type=mime_type))
    return {"sent": args.path, "bytes": size, "mime_type": mime_type}


async def offer_choice(args: OfferChoiceInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: ask the user to pick an option; the answer arrives as the user's next message."""
    choices = args.choices()
    await _act(ctx, OfferChoice(question=args.question, options=choices))
    return {
        "offered": [{"id": choice.id, "label": choice.label} for choice in choices],
        "note": (
            "the user's pick arrives as their next message: 'chose option <id> (<label>)'; 'clicked an option that "
            "was not offered here: <id>' is not a pick (a forged or stale click)"
        ),
    }


TOOLS: list[Tool] = [
    Tool(
        name="send_file",
        description="Send a file from your workspace to the user (images are shown as pictures).",
        input=SendFileInput,
        fn=send_file,
        side_effect="write",
        # Reaches only this conversation's user, who asked for it: not gated in a clean turn, but once untrusted
        # content entered the turn it needs approval (switchboard.core.approvals.policy defaults).
        risk="medium",
        reversible=True,
        resources=lambda args: (f"file {args.path} to this conversation",),
        key_fields=("path",),  # the logical action, for idempotency keys
        timeout_s=60.0,
        connector="channel",
        retry_on=frozenset(),  # the outbox retries deliveries itself; a second call would send twice
    ),
    Tool(
        name="offer_choice",
        description="Ask the user a question with 2-10 short options to pick from (buttons where the app has them).",
        input=OfferChoiceInput,
        fn=offer_choice,
        side_effect="write",
        risk="medium",  # as send_file: a question to this conversation's user, approved after untrusted content
        reversible=True,
        resources=lambda args: (f"question to this conversation: {args.question}",),
        key_fields=("question",),  # the logical action, for idempotency keys
        timeout_s=30.0,
        connector="channel",
        retry_on=frozenset(),  # the outbox retries deliveries itself; a second call would send twice
    ),
]
"""The channel-action tools."""
