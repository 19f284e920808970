"""``switchboard agents drafts|accept NAME|reject NAME``: review the agents MCP clients proposed.

A draft lives in Redis (:class:`~switchboard.queue.drafts.DraftStore`) and is never served; accepting writes it to
``agents.d/<tenant>/<name>.yaml`` beside the YAML file (:mod:`switchboard.settings.accepted`), where every process
reads it from its next start.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from switchboard.core.agent.config import Agent
from switchboard.settings import Settings

__all__ = ["accept_writer", "drafts_command"]


def accept_writer(settings: Settings, tenant: str) -> Callable[[Agent], Path]:
    """Writes an accepted draft beside the YAML file (``agents.d/<tenant>/<name>.yaml``); refuses a taken name."""
    from switchboard.settings.accepted import write_accepted

    def write(agent: Agent) -> Path:
        if agent.name in settings.file.agents:
            raise ValueError(f"an agent {agent.name!r} exists already: reject the draft, or rename the agent")
        return write_accepted(settings.config, tenant, agent)

    return write


def drafts_command(settings: Settings, action: str, name: str | None, tenant: str) -> int:
    """``agents drafts`` / ``agents accept NAME`` / ``agents reject NAME``: review proposed agents of a tenant."""
    from switchboard.cli.sessions import redis_url_for, with_redis
    from switchboard.queue.drafts import DraftStore

    async def body(redis: Any) -> int:
        store = DraftStore(redis)
        if action == "drafts":
            drafts = await store.all(tenant)
            for draft in drafts:
                agent = draft.agent
                at = time.strftime("%Y-%m-%d %H:%M", time.gmtime(draft.proposed_at))
                print(
                    f"{agent.name:<20} by {draft.proposed_by:<20} {at} UTC  tools: {', '.join(agent.tools) or 'none'}"
                )
                print(f"    instructions (the proposer's text): {agent.instructions[:300]!r}")
            if not drafts:
                print(f"no draft agents for tenant {tenant!r}")
            return 0
        assert name is not None
        if action == "reject":
            if not await store.drop(tenant, name):
                print(f"switchboard: tenant {tenant!r} has no draft agent {name!r}", file=sys.stderr)
                return 1
            print(f"rejected the draft agent {name!r}")
            return 0
        try:
            path = await store.accept(tenant, name, accept_writer(settings, tenant))
        except (LookupError, ValueError) as err:
            print(f"switchboard: {err.args[0] if err.args else err}", file=sys.stderr)
            return 1
        print(f"accepted {name!r} for tenant {tenant!r}: wrote {path}; processes serve it from their next start")
        return 0

    return with_redis(redis_url_for(settings), body)
