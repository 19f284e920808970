"""⑤ What the agent core asks a channel to do. Each adapter performs these in its platform's dialect."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AckChoice",
    "Action",
    "ApprovalCard",
    "Choice",
    "EditText",
    "OfferChoice",
    "SendError",
    "SendFile",
    "SendText",
    "SendTyping",
    "SendVoice",
    "SetStatus",
    "SettleChoices",
    "ShowToolCall",
    "StreamDelta",
    "StreamText",
    "ToolFile",
    "ToolState",
]


class _Action(BaseModel):
    model_config = ConfigDict(frozen=True)

    reply_to: str | None = None
    """Gateway id of the inbound message this action answers."""


class SendText(_Action):
    """Deliver a final reply. ``text`` is Markdown; the channel renders and splits it."""

    kind: Literal["text"] = "text"
    text: str
    notice: bool = False
    """The gateway's own word about the conversation (``/stop`` answered), not the agent's: a channel that can
    shows it as a small system line."""


class StreamDelta(_Action):
    """A piece of a reply still being written, for a channel whose own transport streams (the web chat's SSE)."""

    kind: Literal["delta"] = "delta"
    text: str


class SendTyping(_Action):
    """Show that the agent is working (refreshed by the worker while a run lasts)."""

    kind: Literal["typing"] = "typing"


class SetStatus(_Action):
    """Tell the conversation where its run stands (web chat shows it)."""

    kind: Literal["status"] = "status"
    status: Literal["queued", "running", "idle"]


class SendError(_Action):
    """Tell the user a reply failed, with a short code and a human message."""

    kind: Literal["error"] = "error"
    code: str
    message: str


class SendFile(_Action):
    """Deliver a file from the session workspace (channels show images inline where they can)."""

    kind: Literal["file"] = "file"
    path: str
    """Path relative to the session workspace (checked by the tool that asked). Any worker can send it: the
    channel reads it through its send context, never from one worker's disk by absolute path."""
    caption: str = ""
    mime_type: str | None = None
    """Guessed from the file name; ``image/*`` lets a channel send a photo rather than a document."""


class SendVoice(_Action):
    """Deliver the turn's reply spoken, as a voice note where the platform has one (sent after its text reply).

    The audio rides in the action (the outbox keeps it, so a resumed send needs no second speech request); it is
    small: the text spoken is capped by the agent's ``voice.max_chars``. A channel without voice notes sends nothing
    for it (the text reply already went out).
    """

    kind: Literal["voice"] = "voice"
    audio: str
    """The audio, base64-encoded (OGG/Opus)."""
    mime_type: str = "audio/ogg"
    duration_s: float | None = None
    """Length of the audio, when known (Telegram and WhatsApp show it on the note)."""
    text: str = ""
    """What it says (the text that was spoken), for a channel that labels the audio."""


class Choice(BaseModel):
    """One option of an ``OfferChoice``."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=64)
    """Comes back in ``ChoiceSelected.option_id`` (64 bytes fit Telegram's ``callback_data``)."""
    label: str = Field(min_length=1)


class ApprovalCard(BaseModel):
    """What an approval's question is about, for a channel that shows it as a card (the web chat)."""

    model_config = ConfigDict(frozen=True)

    id: str
    tool: str
    title: str
    """What would run, on one line."""
    reason: str
    """Why a person must decide."""
    expires_at: float | None = None


class OfferChoice(_Action):
    """Ask the user to pick one of a few options (native buttons where the channel has them, else numbered text)."""

    kind: Literal["choice"] = "choice"
    question: str
    options: list[Choice]
    approval: ApprovalCard | None = None
    """Set when the options decide an approval."""


class EditText(_Action):
    """Replace the text of a message the gateway sent (by the id its ``Receipt`` returned).

    Markdown, one message: the caller keeps it within the channel's ``max_text``.
    """

    kind: Literal["edit"] = "edit"
    message_id: str
    text: str


class StreamText(_Action):
    """Stream a reply into one message with the platform's own streaming.

    Slack ``chat.*Stream``, Telegram ``sendMessageDraft``. The first action has no ``handle`` and opens the
    stream (its ``Receipt.handle`` names it); later ones carry the handle. ``text`` is always the whole reply so
    far and ``sent`` how much of it the platform already has, so a channel that appends sends ``text[sent:]`` and
    one that replaces sends ``text``. ``final`` closes the stream: the channel then makes the complete reply
    permanent, split within its limits.
    """

    kind: Literal["stream"] = "stream"
    handle: str | None = None
    text: str
    sent: int = 0
    final: bool = False


ToolState = Literal["running", "ok", "failed", "waiting_approval", "refused"]
"""Where one tool call stands: running, then how it ended (``waiting_approval``: a person decides first)."""


class ToolFile(BaseModel):
    """A workspace file a tool call made or changed."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str
    """Relative to the session workspace."""


class ShowToolCall(_Action):
    """Show one tool call as it starts and ends (web chat: one card per call); best effort, never the reply.

    Only a channel whose capabilities declare ``tool_activity`` is sent these. Every field is safe to show the user:
    the arguments are a redacted preview, the output its head and tail.
    """

    kind: Literal["tool"] = "tool"
    call_id: str
    tool: str
    title: str
    """The tool and its main argument on one line (at most 120 characters)."""
    arguments: str = ""
    """A preview of the arguments as JSON (at most 500 characters, secret-looking values redacted)."""
    state: ToolState
    started_at: float
    """Unix seconds."""
    duration_ms: float | None = None
    """``None`` while running."""
    exit_status: int | None = None
    """The shell's (or a program's) exit status, when there is one."""
    output_head: str = ""
    """The output's first lines (at most 20 lines and 2,000 characters)."""
    output_tail: str = ""
    """Its last lines, when the head does not hold everything."""
    omitted_lines: int = 0
    """Lines between the head and the tail, not shown."""
    files: tuple[ToolFile, ...] = ()


class SettleChoices(_Action):
    """An offer was decided (anywhere: a click, the console, a command) or expired: its buttons are spent.

    Like :class:`ShowToolCall`, sent only to a channel whose capabilities declare ``tool_activity``.
    """

    kind: Literal["settled"] = "settled"
    ids: tuple[str, ...]
    """Every option id of the offer."""
    chosen: str | None = None
    """The option taken (``None``: none was, e.g. it expired)."""
    label: str
    """What became of it: ``Approved``, ``Denied``, ``Expired`` or the picked option's label."""
    by: str = ""
    """Who decided: ``you`` (the user of the conversation) or a principal (``console:alice``)."""


class AckChoice(_Action):
    """Acknowledge a click (Telegram ``answerCallbackQuery``), with an optional short notice."""

    kind: Literal["ack"] = "ack"
    ack_ref: str
    """``ChoiceSelected.ack_ref`` of the click."""
    text: str = ""


Action = Annotated[
    SendText
    | StreamDelta
    | SendTyping
    | SetStatus
    | SendError
    | SendFile
    | SendVoice
    | OfferChoice
    | EditText
    | StreamText
    | AckChoice
    | ShowToolCall
    | SettleChoices,
    Field(discriminator="kind"),
]
"""Any send action."""
