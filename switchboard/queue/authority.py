"""Who a turn acts for and what it may do: the principal, its permissions and the policy, set on the TurnRequest.

The drain builds each turn's :class:`~switchboard.core.turn.TurnRequest` here. The *actor* is the principal of the
turn's last sender: ``<channel>:<sender id>`` for a channel's user (``telegram:42``, ``slack:U123``; a web chat
sender's id is its session id), or the operator's own principal for what an operator or the gateway did
(``console:alice``, ``switchboard``: their :class:`~switchboard.core.messages.OperatorActed` already names it, and
no channel can produce a sender id starting with ``console:``). Its permissions are the grants of the YAML policy
blocks (:func:`switchboard.core.grants.permissions_for`), and the policy is the effective one of the tenant, agent and
channel, whose version is recorded with the run (docs/ARCHITECTURE.md §6).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from switchboard.core.agent import Agent
from switchboard.core.grants import permissions_for, resolve_policy
from switchboard.core.messages import InboundMessage, OperatorActed
from switchboard.core.turn import TurnRequest
from switchboard.settings import FileConfig
from switchboard.tracing import trace_hex
from switchboard.types import SessionKey

__all__ = ["principal_of", "turn_request"]


def principal_of(message: InboundMessage) -> str:
    """The principal a message comes from (``<channel>:<sender id>``, or an operator's ``console:<name>``)."""
    if isinstance(message.event, OperatorActed):
        return message.sender.id
    return f"{message.conversation.channel}:{message.sender.id}"


def turn_request(
    config: FileConfig | None, session: SessionKey, agent: Agent, messages: Sequence[InboundMessage], run_id: str
) -> TurnRequest:
    """The request of one turn over ``messages``, acting for the last sender's principal.

    Without ``config`` (a drain built without the YAML file: tests, embedded uses) the principal holds no
    permissions and the runtime applies the agent's own policy block.
    """
    last = messages[-1]
    conversation = last.conversation
    actor = principal_of(last)
    policy, permissions = None, frozenset[str]()
    if config is not None:
        policy = resolve_policy(config, tenant=conversation.tenant, agent=agent.name, channel=conversation.channel)
        permissions = permissions_for(config, conversation.tenant, agent.name, actor)
    return TurnRequest(
        session_key=session,
        agent=agent,
        messages=list(messages),
        run_id=run_id,
        deadline=time.time() + agent.limits.deadline_s,
        tenant=conversation.tenant,
        actor=actor,
        request_id=last.id,
        trace_id=trace_hex(messages[0].id),
        policy=policy,
        policy_version=policy.version if policy is not None else "",
        permissions=permissions,
    )
