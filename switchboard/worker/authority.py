"""Who a turn acts for and what it may do: the principal, its permissions and the policy, set on the TurnRequest.

The actor is the principal of the turn's last sender: ``<channel>:<sender id>`` for a channel's user, or the
operator's own principal (``console:alice``, ``switchboard``), which no channel can produce. Its permissions are the
grants every sender of the batch holds, and the policy is the effective one of tenant, agent and channel, its version
recorded with the run (``docs/ARCHITECTURE.md`` §6).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from switchboard.core.access import least_role, stamped_role
from switchboard.core.agent.config import Agent
from switchboard.core.agent.taskclass import class_budgets, classify
from switchboard.core.approvals.grants import permissions_for, resolve_policy
from switchboard.core.approvals.suspend import principal_of
from switchboard.core.messages import InboundMessage, OperatorActed, Scheduled
from switchboard.core.turn import TurnRequest
from switchboard.settings import FileConfig
from switchboard.tracing import trace_hex
from switchboard.types import SessionKey

__all__ = ["principal_of", "turn_request"]  # principal_of: switchboard.core.approvals.suspend, the one definition


def turn_request(
    config: FileConfig | None, session: SessionKey, agent: Agent, messages: Sequence[InboundMessage], run_id: str
) -> TurnRequest:
    """The request of one turn over ``messages``, acting for the last sender's principal.

    The turn acts on every message of the batch, so it holds only the permissions *every* sender of the batch holds
    (a group chat's second user, or an operator's click queued behind a user's message, lends the turn none of
    theirs), and it acts for the last channel user when there is one (an operator's or the gateway's message
    batched behind a user's does not make the user's request the operator's).

    Its role is the least trusted of the roles ingest stamped on the people's messages (``ROLE_META``; ``user``
    where access control stamped none), for the same reason.

    The agent's task class (``task_classes``) of the batch sets the step, token, credit and time budgets.

    Without ``config`` (a drain built without the YAML file: tests, embedded uses) the principal holds no
    permissions and the runtime applies the agent's own policy block.
    """
    last = messages[-1]
    conversation = last.conversation
    principals = list(dict.fromkeys(principal_of(m) for m in messages))
    people = [principal_of(m) for m in messages if not isinstance(m.event, OperatorActed | Scheduled)]
    actor = people[-1] if people else principals[-1]
    role = least_role(stamped_role(m.meta) for m in messages if not isinstance(m.event, OperatorActed))
    policy, permissions, permissions_of = None, frozenset[str](), None
    if config is not None:
        permissions_of = functools.partial(permissions_for, config, conversation.tenant, agent.name)
        policy = resolve_policy(config, tenant=conversation.tenant, agent=agent.name, channel=conversation.channel)
        permissions = frozenset.intersection(*(permissions_of(principal) for principal in principals))
    deadline_s, budgets = agent.limits.deadline_s, {}
    if (picked := classify(agent.task_classes, messages)) is not None:  # the class's budgets narrow the agent's
        task = agent.task_classes[picked.name]
        deadline_s = min(deadline_s, task.deadline_s or deadline_s)
        budgets = class_budgets(task, picked)
    return TurnRequest(
        session_key=session,
        agent=agent,
        messages=list(messages),
        run_id=run_id,
        deadline=time.time() + deadline_s,
        tenant=conversation.tenant,
        actor=actor,
        role=role,
        request_id=last.id,
        trace_id=trace_hex(messages[0].id),
        policy=policy,
        policy_version=policy.version if policy is not None else "",
        permissions=permissions,
        permissions_of=permissions_of,
        **budgets,
    )
