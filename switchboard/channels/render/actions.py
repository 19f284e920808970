"""Markdown standing in for the actions a channel cannot show natively (a choice, a file it cannot upload)."""

from __future__ import annotations

from pathlib import PurePath
from typing import assert_never

from switchboard.core.actions import OfferChoice, SendFile

__all__ = ["action_markdown"]


def action_markdown(action: OfferChoice | SendFile) -> str:
    """Markdown standing in for an action a channel shows as text: a choice as numbered options, a file's line.

    A :class:`SendFile` gives its caption and a ``📎 name`` line (for channels that cannot upload the file itself).
    """
    match action:
        case OfferChoice():
            options = "\n".join(f"{number}. {option.label}" for number, option in enumerate(action.options, 1))
            return f"{action.question}\n\n{options}" if action.question.strip() else options
        case SendFile():
            line = f"📎 {PurePath(action.path).name}"
            return f"{action.caption}\n\n{line}" if action.caption.strip() else line
        case _:
            assert_never(action)
