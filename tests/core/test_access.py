"""The ``access`` configuration: validation with errors that say what to fix, precedence of the blocks, the checks
``switchboard check`` makes, and the pure decision for each channel's message shapes."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from switchboard.core.access import (
    AccessConfig,
    Admitted,
    NeedsPairing,
    Refused,
    facets,
    is_group,
    judge,
    resolve_access,
)
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.queue.access import access_problems, code_digest, new_code, normalise_code, rules_from_config
from switchboard.settings import FileConfig


def _message(channel: str, sender: str, conversation: str, *, extra: Any = None, meta: Any = None) -> InboundMessage:
    return InboundMessage(
        dedup_key="1",
        conversation=ConversationRef(channel=channel, conversation=conversation, extra=extra or {}),
        sender=Sender(id=sender),
        text="hi",
        meta=meta or {},
    )


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"mode": "closed"}, "mode"),
        ({"allow": ["42"]}, "is not a principal"),
        ({"allow": ["telegram:"]}, "is not a principal"),
        ({"roles": {"telegram:1": "root"}}, "roles"),
        ({"groups": "allowlist"}, "groups"),
        ({"pairing": {"code_ttl_s": 5}}, "code_ttl_s"),
        ({"surprise": 1}, "Extra inputs are not permitted"),
    ],
)
def test_bad_blocks_are_refused_with_what_to_fix(block: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AccessConfig.model_validate(block)


@pytest.mark.parametrize("written", ["whatsapp:+4915112345678", "whatsapp:004915112345678", "whatsapp:4915112345678"])
def test_a_whatsapp_number_is_its_digits_as_the_cloud_api_sends_them(written: str) -> None:
    assert AccessConfig.model_validate({"allow": [written]}).allow == ["whatsapp:4915112345678"]


def test_the_most_specific_block_wins_per_field_and_roles_merge() -> None:
    tenant = AccessConfig.model_validate({"mode": "pairing", "roles": {"telegram:*": "guest"}, "default_role": "guest"})
    channel = AccessConfig.model_validate({"allow": ["telegram:1"], "roles": {"telegram:1": "admin"}})
    account = AccessConfig.model_validate({"mode": "allowlist"})
    rules = resolve_access(account, channel, tenant, tenant="t")
    assert (rules.mode, rules.allow, rules.default_role) == ("allowlist", ("telegram:1",), "guest")
    assert rules.roles == (("telegram:1", "admin"), ("telegram:*", "guest"))
    assert judge(rules, _message("telegram", "1", "1")) == Admitted("allowlist:telegram:1", "admin")


def test_an_unconfigured_file_checks_nothing() -> None:
    config = FileConfig.model_validate({"channels": {"telegram": {}}})
    assert rules_from_config(config, {("telegram", "default"): "default"}) == {}
    config = FileConfig.model_validate({"tenants": {"default": {"access": {"mode": "allowlist"}}}})
    found = rules_from_config(config, {("telegram", "default"): "default", ("web", "default"): "default"})
    assert list(found) == [("telegram", "default")], "the web chat is never checked"


@pytest.mark.parametrize(
    ("message", "group"),
    [
        (_message("telegram", "1", "1", extra={"chat_type": "private"}), False),
        (_message("telegram", "1", "-100", extra={"chat_type": "supergroup"}), True),
        (_message("slack", "U1", "D1", extra={"channel_type": "im"}), False),
        (_message("slack", "U1", "C1", extra={"channel_type": "channel"}), True),
        (_message("discord", "1", "9", meta={"guild_id": ""}), False),
        (_message("discord", "1", "9", meta={"guild_id": "200"}), True),
        (_message("teams", "a", "x", extra={"conversation_type": "personal"}), False),
        (_message("teams", "a", "x", extra={"conversation_type": "channel"}), True),
        (_message("whatsapp", "49", "49"), False),
    ],
)
def test_groups_are_told_from_each_channels_own_facts(message: InboundMessage, group: bool) -> None:
    assert is_group(message) is group


def test_facets_name_the_slack_workspace_and_the_teams_tenant() -> None:
    assert facets(_message("slack", "U1", "D1", extra={"team": "T9"})) == ("slack:U1", "slack:team:T9")
    assert facets(_message("teams", "a", "x", extra={"tenant_id": "d1"})) == ("teams:a", "teams:tenant:d1")


def test_pairing_leaves_an_unknown_sender_to_the_store() -> None:
    rules = resolve_access(AccessConfig.model_validate({"mode": "pairing"}), tenant="t")
    assert judge(rules, _message("telegram", "5", "5")) == NeedsPairing("telegram:5")
    closed = resolve_access(AccessConfig.model_validate({"mode": "allowlist"}), tenant="t")
    assert judge(closed, _message("telegram", "5", "5")) == Refused("not_allowed", "allowlist")


def test_check_reports_blocks_that_cannot_work() -> None:
    config = FileConfig.model_validate(
        {
            "channels": {
                "web": {"access": {"mode": "allowlist"}},
                "telegram": {
                    "access": {"allow": ["slack:U1", "telegram:*"], "groups": {"-1": {"allow": ["discord:2", "*"]}}}
                },
            }
        }
    )
    problems = access_problems(config)
    assert len(problems) == 3
    assert "channels.web.access: the web chat is never checked" in problems[0]
    assert "'slack:U1' names another channel" in problems[1] and "'discord:2'" in problems[2]


def test_codes_are_short_random_and_typed_loosely() -> None:
    codes = {new_code() for _ in range(200)}
    assert len(codes) == 200 and all(len(c) == 7 and c[3] == "-" for c in codes)
    code = next(iter(codes))
    assert normalise_code(code.lower().replace("-", " ")) == code
    assert normalise_code("ABC-10O") == "", "look-alikes are not in the alphabet"
    assert code_digest(code) != code and len(code_digest(code)) == 64
