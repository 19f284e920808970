"""Recognising commands (the platform's or typed) and the role defaults, as pure functions."""

from __future__ import annotations

import pytest

from switchboard.core.access import ROLE_META
from switchboard.core.commands import BUILTIN_COMMANDS, CommandRule, may_use, turn_command, typed_command
from switchboard.core.messages import CommandIssued, ConversationRef, InboundMessage, Posted, Sender


def message(text: str, *, command: str | None = None, role: str = "user") -> InboundMessage:
    return InboundMessage(
        dedup_key="1",
        conversation=ConversationRef(channel="web", account="default", conversation="c1"),
        sender=Sender(id="u1"),
        text=text,
        event=CommandIssued(name=command) if command else Posted(),
        meta={ROLE_META: role},
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/status", ("status", "")),
        ("  /Model   offline:careful ", ("model", "offline:careful")),
        ("/help@switchboard_bot", ("help", "")),
        ("/link 12345678", ("link", "12345678")),
        ("/etc/hosts is a file", None),
        ("status", None),
        ("/", None),
        ("/9lives", None),
        (f"/{'a' * 33}", None),
    ],
)
def test_typed_command(text: str, expected: tuple[str, str] | None) -> None:
    assert typed_command(text) == expected


@pytest.mark.parametrize(
    ("messages", "known", "expected"),
    [
        ([message("/status")], None, ("status", "")),
        ([message("/billing now")], None, None),  # not built in, not configured: text
        ([message("/billing now")], {"billing": CommandRule()}, ("billing", "now")),
        ([message("refund", command="billing")], None, ("billing", "refund")),  # the platform's: always a command
        ([message("/status"), message("/status")], None, ("status", "")),
        ([message("/status"), message("hello")], None, None),  # a batch that is not one command
        ([message("/status"), message("/help")], None, None),
    ],
)
def test_turn_command(
    messages: list[InboundMessage], known: dict[str, CommandRule] | None, expected: tuple[str, str] | None
) -> None:
    found = turn_command(messages, known)
    assert (None if found is None else (found.name, found.args)) == expected


@pytest.mark.parametrize("name", list(BUILTIN_COMMANDS))
@pytest.mark.parametrize("role", ["admin", "user", "guest"])
def test_defaults_and_overrides(name: str, role: str) -> None:
    default = role in BUILTIN_COMMANDS[name].roles
    assert may_use(name, role, {}) is default  # type: ignore[arg-type]
    assert may_use(name, role, {name: CommandRule(roles=[role])}) is True  # type: ignore[arg-type,list-item]
    assert may_use(name, role, {name: CommandRule(roles=[])}) is False  # type: ignore[arg-type]
    assert may_use("model", role, {}) is (role == "admin")  # type: ignore[arg-type]
