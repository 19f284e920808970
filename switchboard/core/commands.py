"""Chat commands: which ones there are, who may use them, and how a message is recognised as one.

A command comes as a platform command (:class:`~switchboard.core.messages.CommandIssued`: Telegram bot commands,
Slack and Discord slash commands) or as a ``/word`` typed into a message (every channel; only the words this module
knows, or the YAML file's ``commands`` names, so other ``/words`` stay ordinary text). The built-in ones are answered
by the gateway without a model call (``switchboard.worker.commands``); ``/stop`` is the queue's, ``/reset`` and
``/new`` forget the conversation (:func:`switchboard.core.inbound.plan_turn`).

Each command is limited by role (``commands: {<name>: {roles: [...]}}``; :data:`BUILTIN_COMMANDS` holds the
defaults): a sender whose role may not use one is told so, and the model is not asked. The same table gives each
platform's native command menu (Telegram ``setMyCommands``, Discord and Slack slash commands) and ``/help``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, assert_never

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.access import ROLES, Role
from switchboard.core.messages import (
    ChoiceSelected,
    CommandIssued,
    ExternalEvent,
    InboundMessage,
    MessageDeleted,
    MessageEdited,
    OperatorActed,
    Posted,
    Scheduled,
)

__all__ = [
    "BUILTIN_COMMANDS",
    "COMMAND_NAME_PATTERN",
    "Command",
    "CommandRule",
    "CommandSpec",
    "CommandsConfig",
    "RoleMenu",
    "allowed_roles",
    "command_name",
    "help_text",
    "may_use",
    "menu",
    "refusal_text",
    "role_menus",
    "turn_command",
    "typed_command",
]

COMMAND_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
"""What a command name may be (Telegram's rule, the strictest of the platforms: 1–32 of ``a-z0-9_``)."""

_TYPED = re.compile(r"^/([a-z][a-z0-9_]{0,31})(?:@\S+)?(?:\s+(.*))?$", re.IGNORECASE | re.DOTALL)

_EVERYONE: Final[tuple[Role, ...]] = ROLES


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One built-in command: what the menu says about it and who may use it unless the YAML file says otherwise."""

    description: str
    roles: tuple[Role, ...] = _EVERYONE


BUILTIN_COMMANDS: Final[Mapping[str, CommandSpec]] = {
    "new": CommandSpec("Start a new conversation"),
    "reset": CommandSpec("Start a new conversation (same as /new)"),
    "stop": CommandSpec("Stop the reply being written"),
    "status": CommandSpec("What I am doing: agent, model, messages waiting"),
    "usage": CommandSpec("Your usage against the budgets", ("admin", "user")),
    "model": CommandSpec("Show or switch the model of this conversation", ("admin",)),
    "whoami": CommandSpec("Who I think you are, and your role"),
    "help": CommandSpec("The commands you can use here"),
    "link": CommandSpec("Link this account to your account on another app", ("admin", "user")),
    "voice": CommandSpec("Voice replies on or off in this conversation"),
}
"""The gateway's own commands, in menu order, with their default roles (``/model``: admins only)."""


class CommandRule(BaseModel):
    """One command's block under ``commands:``."""

    model_config = ConfigDict(extra="forbid")

    roles: list[Role] | None = None
    """Who may use it (``admin``, ``user``, ``guest``); unset: the built-in default (everyone for a command of your
    own); empty: nobody (it is refused, and left out of menus)."""
    description: str | None = Field(None, min_length=1, max_length=100)
    """What the native menus and ``/help`` say about it (a command of your own is listed only with one)."""


CommandsConfig = dict[str, CommandRule]
"""The YAML file's ``commands:`` block: command name (no slash) → :class:`CommandRule`."""


@dataclass(frozen=True, slots=True)
class Command:
    """A message recognised as a command."""

    name: str
    """Lower case, without the slash or a ``@botname`` suffix."""
    args: str
    """What follows the name."""


def typed_command(text: str) -> tuple[str, str] | None:
    """``(name, arguments)`` of a ``/word args`` text (lower-case name, ``@botname`` dropped), else ``None``."""
    found = _TYPED.match(text.strip())
    if found is None:
        return None
    return found.group(1).lower(), (found.group(2) or "").strip()


def command_name(message: InboundMessage, known: Mapping[str, object] | None = None) -> str | None:
    """The command ``message`` is, else ``None``.

    A platform command is always one; a typed ``/word`` is one when the word is built in or named in ``known``
    (the YAML file's ``commands``), so other ``/words`` stay text the model reads.
    """
    event = message.event
    match event:
        case CommandIssued(name=name):
            return name
        case Posted():
            typed = typed_command(message.text)
            if typed is None or not (typed[0] in BUILTIN_COMMANDS or (known is not None and typed[0] in known)):
                return None
            return typed[0]
        case ChoiceSelected() | MessageEdited() | MessageDeleted() | OperatorActed() | ExternalEvent() | Scheduled():
            return None
        case _:
            assert_never(event)


def _command(message: InboundMessage, known: Mapping[str, object] | None) -> Command | None:
    name = command_name(message, known)
    if name is None:
        return None
    if isinstance(message.event, CommandIssued):
        return Command(name, message.text.strip())
    typed = typed_command(message.text)
    return Command(name, typed[1] if typed else "")


def turn_command(messages: Sequence[InboundMessage], known: Mapping[str, object] | None = None) -> Command | None:
    """The command a turn is (every message the same command, the last one's arguments), else ``None``."""
    found = [_command(message, known) for message in messages]
    names = {command.name if command is not None else None for command in found}
    if len(names) != 1 or found[-1] is None:
        return None
    return found[-1]


def allowed_roles(name: str, config: CommandsConfig) -> tuple[Role, ...]:
    """Who may use command ``name``: the YAML file's ``roles``, else the built-in default, else everyone."""
    rule = config.get(name)
    if rule is not None and rule.roles is not None:
        return tuple(rule.roles)
    spec = BUILTIN_COMMANDS.get(name)
    return spec.roles if spec is not None else _EVERYONE


def may_use(name: str, role: Role, config: CommandsConfig) -> bool:
    """Whether a sender of ``role`` may use command ``name``."""
    return role in allowed_roles(name, config)


def menu(
    config: CommandsConfig, role: Role | None = None, *, hidden: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """``(name, description)`` of the commands a native menu (or ``/help``) lists, built-in ones first.

    With ``role``, only those that role may use; ``hidden`` leaves commands out (``link`` where identity linking is
    off). A command of the YAML file's own is listed when it has a description.
    """
    found: list[tuple[str, str]] = []
    for name, spec in BUILTIN_COMMANDS.items():
        rule = config.get(name)
        if name in hidden or not allowed_roles(name, config) or (role is not None and not may_use(name, role, config)):
            continue
        found.append((name, rule.description if rule is not None and rule.description else spec.description))
    for name, rule in config.items():
        if name in BUILTIN_COMMANDS or rule.description is None or not allowed_roles(name, config):
            continue
        if role is None or may_use(name, role, config):
            found.append((name, rule.description))
    return found


@dataclass(frozen=True, slots=True)
class RoleMenu:
    """The command menu of one role, and the senders of a channel it is shown to."""

    role: Role
    commands: list[tuple[str, str]]
    senders: tuple[str, ...] = ()
    """Sender ids (``42`` of ``telegram:42``) of the channel given this menu; empty: everyone else's (the default)."""


def role_menus(
    config: CommandsConfig,
    channel: str,
    default_role: Role,
    roles: Sequence[tuple[str, Role]],
    *,
    hidden: frozenset[str] = frozenset(),
) -> list[RoleMenu]:
    """The menus a platform that scopes menus per chat shows: the default role's, then one per other role.

    ``roles`` are access control's ``(principal glob, role)`` entries, first match winning; only exact principals of
    ``channel`` can be given their role's menu (a glob names no chat), the others see the default one.
    """
    found = [RoleMenu(default_role, menu(config, default_role, hidden=hidden))]
    by_role: dict[Role, list[str]] = {}
    seen: set[str] = set()
    for pattern, role in roles:
        head, _, sender = pattern.partition(":")
        if head != channel or not sender or any(c in sender for c in "*?[") or sender in seen:
            continue
        seen.add(sender)
        if role != default_role:
            by_role.setdefault(role, []).append(sender)
    for role, senders in by_role.items():
        found.append(RoleMenu(role, menu(config, role, hidden=hidden), tuple(senders)))
    return found


def help_text(config: CommandsConfig, role: Role, *, hidden: frozenset[str] = frozenset()) -> str:
    """What ``/help`` answers: one line per command ``role`` may use."""
    lines = [f"/{name} — {description}" for name, description in menu(config, role, hidden=hidden)]
    return "Commands you can use here:\n" + "\n".join(lines)


def refusal_text(name: str) -> str:
    """What a sender whose role may not use ``/name`` is told."""
    return f"/{name} is not available to you here. Send /help to see the commands you can use."
