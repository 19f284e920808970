"""⑤ What the agent core asks a channel to do. Each adapter performs these in its platform's dialect."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Action", "OfferChoice", "SendError", "SendFile", "SendText", "SendTyping", "SetStatus", "StreamDelta"]


class _Action(BaseModel):
    model_config = ConfigDict(frozen=True)

    reply_to: str | None = None
    """Gateway id of the inbound message this action answers."""


class SendText(_Action):
    """Deliver a final reply. ``text`` is Markdown; the channel renders and splits it."""

    kind: Literal["text"] = "text"
    text: str


class StreamDelta(_Action):
    """A piece of a reply still being written (only channels that stream show it)."""

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
    """Absolute path of the file (inside the session workspace, checked by the tool that asked)."""
    caption: str = ""
    mime_type: str | None = None
    """Guessed from the file name; ``image/*`` lets a channel send a photo rather than a document."""


class OfferChoice(_Action):
    """Ask the user to pick one of a few options (native buttons where the channel has them, else text)."""

    kind: Literal["choice"] = "choice"
    question: str
    options: list[str]


Action = Annotated[
    SendText | StreamDelta | SendTyping | SetStatus | SendError | SendFile | OfferChoice, Field(discriminator="kind")
]
"""Any send action."""
