"""Which agent a message goes to: the ``routing:`` bindings of the YAML file, and handoffs between agents.

A binding sends the messages it matches to an agent other than their account's: ``routing: [{match: {...}, agent}]``,
read in order, the first match winning, and the account's agent when none matches. Every field given in ``match`` must
match (an empty ``match`` matches every message):

- ``channel`` / ``account``: where the message came from;
- ``group``: the conversation id of a group chat, channel or guild channel (``"*"``: any group; ``is_group``);
- ``user``: the sender's principal (``telegram:42``; globs ``slack:U1*``);
- ``role``: the role access control stamped on the message (``admin``, ``user``, ``guest``);
- ``keyword``: a word or phrase in the text (case-insensitive, whole words);
- ``command``: the message is this command (``/billing`` typed, or the platform's command of that name).

A conversation an agent handed over (the ``handoff`` tool) is bound to the receiving agent until ``/new``; that
per-conversation binding is consulted before the static ones (:mod:`switchboard.queue.handoffs` keeps it).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from switchboard.core.access import Role, is_group, principal, stamped_role
from switchboard.core.commands import command_name
from switchboard.core.messages import InboundMessage
from switchboard.types import CHANNEL_NAME_PATTERN

__all__ = [
    "HandoffConfig",
    "HandoffHistory",
    "RouteMatch",
    "RoutingRule",
    "bound_agent",
]

HandoffHistory = Literal["none", "summary", "full"]
"""What the receiving agent may see of the conversation before the handoff: only the handing agent's note
(``none``), the note and the last exchanges as text (``summary``), or the whole history (``full``)."""


class RouteMatch(BaseModel):
    """What a binding matches; every field given must match."""

    model_config = ConfigDict(extra="forbid")

    channel: str | None = Field(None, pattern=CHANNEL_NAME_PATTERN)
    account: str | None = None
    group: str | None = None
    """A group conversation's id, or ``"*"`` for any group (direct messages never match)."""
    user: str | None = None
    """The sender's principal, ``<channel>:<sender id>``; a glob (``telegram:*``)."""
    role: Role | None = None
    keyword: str | None = Field(None, min_length=1, max_length=100)
    """A word or phrase in the message text (case-insensitive, whole words)."""
    command: str | None = Field(None, pattern=r"^/?[a-z][a-z0-9_]{0,31}$")
    """The message is this command (``billing`` or ``/billing``)."""

    @field_validator("command")
    @classmethod
    def _bare(cls, value: str | None) -> str | None:
        return value.lstrip("/") if value else value

    @model_validator(mode="after")
    def _one_of_text(self) -> RouteMatch:
        if self.keyword is not None and self.command is not None:
            raise ValueError("give 'keyword' or 'command', not both: a command's text is not searched for keywords")
        return self

    def matches(self, message: InboundMessage) -> bool:
        """Whether ``message`` matches every field given."""
        conv = message.conversation
        if self.channel is not None and conv.channel != self.channel:
            return False
        if self.account is not None and conv.account != self.account:
            return False
        if self.group is not None and not (
            is_group(message) and (self.group == "*" or conv.conversation == self.group)
        ):
            return False
        if self.user is not None and not fnmatch.fnmatchcase(principal(message), self.user):
            return False
        if self.role is not None and stamped_role(message.meta) != self.role:
            return False
        if self.command is not None and command_name(message, {self.command: None}) != self.command:
            return False
        if self.keyword is not None:
            words = r"\s+".join(map(re.escape, self.keyword.split()))
            if re.search(rf"(?<!\w){words}(?!\w)", message.text, re.IGNORECASE) is None:
                return False
        return True


class RoutingRule(BaseModel):
    """One binding: the messages it matches go to ``agent``."""

    model_config = ConfigDict(extra="forbid")

    match: RouteMatch = Field(default_factory=RouteMatch)
    agent: str = Field(min_length=1)


def bound_agent(rules: Sequence[RoutingRule], message: InboundMessage) -> str | None:
    """The agent of the first binding ``message`` matches, or ``None`` (its account's agent then)."""
    for rule in rules:
        if rule.match.matches(message):
            return rule.agent
    return None


class HandoffConfig(BaseModel):
    """An agent's ``handoff:`` block: to whom it may hand a conversation, and what the receiver sees."""

    model_config = ConfigDict(extra="forbid")

    to: list[str] = Field(min_length=1)
    """The agents it may hand a conversation to (the ``handoff`` tool refuses any other)."""
    history: HandoffHistory = "summary"
    """What the receiving agent may see of the conversation so far (see :data:`HandoffHistory`)."""
    summary_entries: int = Field(10, ge=1, le=100)
    """How many of the last user and assistant messages a ``summary`` carries."""
