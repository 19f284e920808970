"""⑤ What the agent core asks a channel to do. Each adapter performs these in its platform's dialect."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AckChoice",
    "Action",
    "Choice",
    "EditText",
    "OfferChoice",
    "SendError",
    "SendFile",
    "SendText",
    "SendTyping",
    "SetStatus",
    "StreamDelta",
    "StreamText",
]


class _Action(BaseModel):
    model_config = ConfigDict(frozen=True)

    reply_to: str | None = None
    """Gateway id of the inbound message this action answers."""


class SendText(_Action):
    """Deliver a final reply. ``text`` is Markdown; the channel renders and splits it."""

    kind: Literal["text"] = "text"
    text: str


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


class Choice(BaseModel):
    """One option of an ``OfferChoice``."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=64)
    """Comes back in ``ChoiceSelected.option_id`` (64 bytes fit Telegram's ``callback_data``)."""
    label: str = Field(min_length=1)


class OfferChoice(_Action):
    """Ask the user to pick one of a few options (native buttons where the channel has them, else numbered text)."""

    kind: Literal["choice"] = "choice"
    question: str
    options: list[Choice]


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
    | OfferChoice
    | EditText
    | StreamText
    | AckChoice,
    Field(discriminator="kind"),
]
"""Any send action."""
