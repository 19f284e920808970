"""A ``slack:team:<workspace>`` allow entry admits that workspace's members, not a Slack Connect guest's.

In a channel shared with another organisation (Slack Connect), the events of the external members still carry the host
workspace as the callback's ``team_id``; the author's own workspace is the event's ``user_team`` (a button click's
``user.team_id``). Judging by the callback's team would admit every external member of every shared channel.
"""

from __future__ import annotations

from switchboard.channels.slack.fake.payloads import TEAM_ID, make_block_actions, make_event
from switchboard.channels.slack.inbound import (
    SlackIdentity,
    WireCallback,
    WireInteraction,
    parse_event_callback,
    parse_interaction,
)
from switchboard.core.access import AccessConfig, Admitted, Refused, judge, resolve_access

RULES = resolve_access(AccessConfig(mode="allowlist", allow=[f"slack:team:{TEAM_ID}"]), tenant="default")
IDENTITY = SlackIdentity("default", bot_user_id="U0BOT")
EXTERNAL = "T0OUTSIDER"


def test_an_external_members_message_in_a_shared_channel_is_not_the_workspaces() -> None:
    body = make_event("<@U0BOT> hi", channel="C0SHARED", channel_type="channel", user="U0EXT", user_team=EXTERNAL)
    message = parse_event_callback(IDENTITY, WireCallback.model_validate(body))

    assert message is not None
    assert judge(RULES, message) == Refused("not_allowed", "allowlist")


def test_an_external_members_button_click_is_not_the_workspaces() -> None:
    body = make_block_actions("yes", channel="C0SHARED", user="U0EXT")
    body["user"]["team_id"] = EXTERNAL
    message = parse_interaction(IDENTITY, WireInteraction.model_validate(body))

    assert message is not None
    assert judge(RULES, message) == Refused("not_allowed", "allowlist")


def test_a_members_message_and_click_are_still_admitted() -> None:
    event = parse_event_callback(IDENTITY, WireCallback.model_validate(make_event("hi", user_team=TEAM_ID)))
    click = parse_interaction(IDENTITY, WireInteraction.model_validate(make_block_actions("yes")))

    assert event is not None and click is not None
    assert isinstance(judge(RULES, event), Admitted) and isinstance(judge(RULES, click), Admitted)
