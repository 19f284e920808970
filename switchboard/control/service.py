"""The control service: what operators read and do, for the console and the CLI alike (one implementation).

Every call takes the operator's :class:`~switchboard.control.scope.OperatorScope` and refuses sessions of other
tenants before reading anything. Operators never write a session's state directly: a decision, a take-over, a
message to the user and a hand-back are each one :class:`~switchboard.core.messages.OperatorActed` ingested into the
session's inbox through the :class:`~switchboard.queue.ingest.Ingestor`, so they are ordered with the conversation
and applied by the worker under the session lease (docs/ARCHITECTURE.md §5). Repairs that concern no running turn
(requeueing a dead letter, resolving an effect in doubt) are one atomic step each.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Final, Literal

import redis.asyncio as aioredis

from switchboard.channels.registry import busy_policy
from switchboard.control.operations import dead_letter_messages, list_dead_letters, list_doubts, resolve_doubt
from switchboard.control.reading import (
    SCAN_LIMIT,
    pending_approvals,
    recent_sessions,
    session_views,
    sessions_in_scope,
    timeline_of,
    usage_rows,
)
from switchboard.control.replay import build_case
from switchboard.control.scope import (
    ALL_TENANTS,
    InvalidRequestError,
    NotFoundError,
    OperatorScope,
    OutOfScopeError,
    is_text,
    session_parts,
)
from switchboard.control.transcript import redacted, transcript_of
from switchboard.control.views import (
    SESSION_STATES,
    Accepted,
    AgentView,
    DeadLetterView,
    DoubtView,
    SessionView,
    TimelineEntry,
    ToolView,
    TranscriptItem,
    UsageRow,
)
from switchboard.core.approvals.grants import may_decide
from switchboard.core.approvals.records import ApprovalRecord
from switchboard.core.messages import OperatorActed
from switchboard.queue.approvals import parse_approval_member, record_from_fields, valid_approval_id
from switchboard.queue.fanout import ScoreCursor, zscan_every
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys, literal
from switchboard.queue.operators import operator_message, session_conversation
from switchboard.queue.review import MAX_NOTE_CHARS, ReviewQueue, ReviewSample, ReviewVerdict
from switchboard.queue.segments import SegmentLabels
from switchboard.queue.store import load_history
from switchboard.settings import Settings
from switchboard.types import SessionKey

__all__ = ["MAX_SAY_CHARS", "ControlService"]

MAX_SAY_CHARS: Final = 4000
"""Longest message an operator may send to a user in one ``say``."""
_GLOBAL = GlobalKeys()


def _due(shard: ShardKeys) -> str:
    return shard.approvals_due


class ControlService:
    """Operators' reads and actions over Redis, scoped per call."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, ingestor: Ingestor) -> None:
        self.redis = redis
        self.settings = settings
        self.ingestor = ingestor

    # -- reading ---------------------------------------------------------------------------------------------------

    async def _existing(self, scope: OperatorScope, session: str) -> SessionKey:
        key = scope.check(session)
        if await self.redis.zscore(SessionKeys(key).shard.sessions, key) is None:
            raise NotFoundError(f"no such session: {session[:200]}")
        return key

    async def sessions(
        self,
        scope: OperatorScope,
        *,
        limit: int = 50,
        channel: str | None = None,
        agent: str | None = None,
        tenant: str | None = None,
        state: str | None = None,
    ) -> list[SessionView]:
        """The scope's most recently active sessions and their state, newest first; each filter narrows the list.

        Raises:
            InvalidRequestError: ``state`` is not one of :data:`~switchboard.control.views.SESSION_STATES`.
            OutOfScopeError: ``tenant`` is not the operator's.
        """
        found, _next = await self.session_page(
            scope, limit=limit, channel=channel, agent=agent, tenant=tenant, state=state
        )
        return found

    async def session_page(
        self,
        scope: OperatorScope,
        *,
        limit: int = 50,
        channel: str | None = None,
        agent: str | None = None,
        tenant: str | None = None,
        state: str | None = None,
        after: ScoreCursor | None = None,
    ) -> tuple[list[SessionView], ScoreCursor | None]:
        """:meth:`sessions` a page at a time: the page past ``after``, and the next page's cursor (``None``: last).

        The sessions come from every shard's index merged by last activity. With ``state`` (a live state, read
        per session) the newest :data:`SCAN_LIMIT` sessions are one page.

        Raises:
            InvalidRequestError: ``state`` is not one of :data:`~switchboard.control.views.SESSION_STATES`.
            OutOfScopeError: ``tenant`` is not the operator's.
        """
        limit = max(1, min(limit, 1000))
        if state is not None and state not in SESSION_STATES:
            raise InvalidRequestError(f"state must be one of: {', '.join(SESSION_STATES)}")
        if tenant is not None and not scope.allows(tenant):
            raise OutOfScopeError(f"{scope.operator} may not see tenant {tenant!r}")
        wanted = (tenant, agent, channel)

        def keep(parts: list[str]) -> bool:
            return all(want is None or want == part for want, part in zip(wanted, parts, strict=False))

        filtered = keep if any(w is not None for w in wanted) else None
        if state is None:
            page = await recent_sessions(self.redis, scope, limit, filtered, after=after)
            following = page[-1][1] if len(page) == limit else None
            return await session_views(self.redis, [session for session, _ in page]), following
        found: list[SessionView] = []  # the state is live: read the candidates' state, a page at a time
        candidates = await sessions_in_scope(self.redis, scope, SCAN_LIMIT, filtered)
        for start in range(0, len(candidates), 200):
            found += [v for v in await session_views(self.redis, candidates[start : start + 200]) if v.state == state]
            if len(found) >= limit:
                break
        return found[:limit], None

    async def session(self, scope: OperatorScope, session: str) -> SessionView:
        """One session and its state."""
        return (await session_views(self.redis, [await self._existing(scope, session)]))[0]

    async def timeline(self, scope: OperatorScope, session: str, *, limit: int = 200) -> list[TimelineEntry]:
        """The session's last ``limit`` events, oldest first, with trace ids."""
        return await timeline_of(self.redis, await self._existing(scope, session), max(1, min(limit, 10_000)))

    async def transcript(self, scope: OperatorScope, session: str, *, limit: int = 200) -> list[TranscriptItem]:
        """The session's conversation in time order, each line with its events (see :mod:`.transcript`).

        The user's and the agent's words, tool calls with arguments and results, approvals and operators' actions;
        the words are withheld unless the scope reads messages.
        """
        key = await self._existing(scope, session)
        limit = max(1, min(limit, 2000))
        items = await transcript_of(self.redis, key, history_limit=limit, events_limit=limit * 5)
        return items if scope.reads_messages else [redacted(item) for item in items]

    async def replay_case(
        self, scope: OperatorScope, session: str, *, run_id: str | None = None, limit: int = 2000
    ) -> dict[str, Any]:
        """The session's turns (up to run ``run_id``) as an evaluation scenario, plain data (:mod:`.replay`).

        Raises:
            NotFoundError: no such session, or no answered turn (of ``run_id``) in its history.
            OutOfScopeError: another tenant's session, or an operator who may not read messages (the case holds
                the words).
        """
        key = await self._existing(scope, session)
        if not scope.reads_messages:
            raise OutOfScopeError(f"{scope.operator} may not read messages, which a replay case holds")
        history = await load_history(self.redis, key, max(1, min(limit, 10_000)))
        events = await timeline_of(self.redis, key, max(1, min(limit * 5, 50_000)))
        config = self.settings.file
        known = {config.tenant, *config.tenants, *(t for o in config.console.operators for t in o.tenants)}
        return build_case(key, history, events, run_id=run_id, others=sorted(known - {ALL_TENANTS}))

    async def review_samples(
        self, scope: OperatorScope, *, limit: int = 100
    ) -> list[tuple[ReviewSample, ReviewVerdict | None]]:
        """The scope's sampled runs awaiting or given a verdict, newest first (``SWITCHBOARD_EVALS__*``)."""
        queue = ReviewQueue(self.redis, max_per_tenant=self.settings.evals.max_per_tenant)
        if scope.unrestricted:
            head, tail = _GLOBAL.review_runs("\0").split("\0")
            tenants = set()
            async for key in self.redis.scan_iter(match=literal(head) + "*" + literal(tail), count=500):
                name = key.decode() if isinstance(key, bytes) else str(key)
                tenants.add(name[len(head) : -len(tail)])
        else:
            tenants = set(scope.tenants)
        found = [pair for tenant in sorted(tenants) for pair in await queue.samples(tenant, limit=limit)]
        return sorted(found, key=lambda pair: pair[0].at, reverse=True)[: max(1, limit)]

    async def judge_run(
        self, scope: OperatorScope, session: str, run_id: str, verdict: str, note: str = ""
    ) -> ReviewVerdict:
        """Give a sampled run of ``session`` a verdict (``pass`` or ``fail``) and a note.

        Raises:
            InvalidRequestError: a verdict other than those, or a note too long.
            NotFoundError: no such run among the tenant's samples.
            OutOfScopeError: another tenant's session.
        """
        key = scope.check(session)
        if verdict not in ("pass", "fail"):
            raise InvalidRequestError("verdict must be 'pass' or 'fail'")
        if len(note) > MAX_NOTE_CHARS or not is_text(note):
            raise InvalidRequestError(f"the note must be text of at most {MAX_NOTE_CHARS} characters")
        labels = SegmentLabels.of(self.settings.file)
        queue = ReviewQueue(self.redis, max_per_tenant=self.settings.evals.max_per_tenant, labels=labels)
        sample = await queue.find(session_parts(key)[0], key, run_id)
        if sample is None:
            raise NotFoundError(f"no sampled run {run_id[:80]!r} of {session[:200]} awaits review")
        judged = ReviewVerdict(verdict="pass" if verdict == "pass" else "fail", note=note, by=scope.operator)
        await queue.judge(sample, judged)
        return judged

    async def approvals(self, scope: OperatorScope, *, limit: int = 100) -> list[ApprovalRecord]:
        """Pending approvals of the scope's tenants, oldest first."""
        return await pending_approvals(self.redis, scope, max(1, min(limit, 1000)))

    async def session_approvals(self, scope: OperatorScope, session: str) -> list[ApprovalRecord]:
        """One session's pending approvals, oldest first."""
        key = await self._existing(scope, session)
        ids = await self.redis.zrange(SessionKeys(key).approvals, 0, -1)
        records = []
        for raw in ids:
            approval_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            record = record_from_fields(await self.redis.hgetall(SessionKeys(key).approval(approval_id)))
            if record is not None and record.status == "pending":
                records.append(record)
        return records

    async def find_approval(self, scope: OperatorScope, approval_id: str) -> ApprovalRecord:
        """The pending approval ``approval_id`` of any session in scope (ids are unique: the CLI takes an id alone).

        Raises:
            NotFoundError: no pending approval with that id in the scope.
        """
        if not valid_approval_id(approval_id):  # also keeps glob characters out of the match below
            raise NotFoundError("no such approval")
        for _shard, member in await zscan_every(self.redis, _due, f"*|{approval_id}"):  # one pipeline of the shards
            session, found = parse_approval_member(member)
            if found == approval_id and scope.allows(session_parts(session)[0]):
                record = record_from_fields(await self.redis.hgetall(SessionKeys(session).approval(approval_id)))
                if record is not None and record.status == "pending":
                    return record
        raise NotFoundError(f"no pending approval {approval_id}")

    async def dead_letters(self, scope: OperatorScope, *, limit: int = 100) -> list[DeadLetterView]:
        """The scope's most recent dead letters, newest first."""
        found = await list_dead_letters(self.redis, scope, max(1, min(limit, 1000)))
        return found if scope.reads_messages else [dataclasses.replace(d, preview="") for d in found]

    async def effects_in_doubt(self, scope: OperatorScope, *, include_resolved: bool = False) -> list[DoubtView]:
        """Effects awaiting reconciliation in the scope's tenants, oldest first."""
        return await list_doubts(self.redis, scope, include_resolved=include_resolved)

    async def usage(self, scope: OperatorScope) -> list[UsageRow]:
        """Credits, tokens and runs per tenant and agent (from the sessions' metered usage)."""
        return await usage_rows(self.redis, scope)

    async def agents(self, scope: OperatorScope) -> list[AgentView]:
        """Every configured agent: draft/ready, model, tools, credit limit, and what it spent in the scope."""
        from switchboard.core.tools.builtin import default_registry

        registry = default_registry()
        spent: dict[str, list[float]] = {}
        for row in await self.usage(scope):
            totals = spent.setdefault(row.agent, [0.0, 0])
            totals[0] += row.credits
            totals[1] += row.runs
        views = []
        for agent in self.settings.file.agents.values():
            tools = []
            for name in agent.tools:
                tool = registry.get(name)
                tools.append(ToolView(name, tool.side_effect, tool.risk) if tool else ToolView(name, "unknown", "-"))
            credits, runs = spent.get(agent.name, [0.0, 0])
            views.append(
                AgentView(
                    name=agent.name,
                    status=agent.status,
                    model=agent.model or self.settings.default_model,
                    tools=tools,
                    max_credits=agent.limits.max_credits,
                    credits=float(credits),
                    runs=int(runs),
                )
            )
        return views

    # -- acting ----------------------------------------------------------------------------------------------------

    async def _act(
        self,
        scope: OperatorScope,
        session: SessionKey,
        event: OperatorActed,
        *,
        text: str = "",
        dedup: str | None = None,
    ) -> Accepted:
        conversation = await session_conversation(self.redis, session)
        if conversation is None:
            raise NotFoundError(f"session {session[:200]} is on no known channel")
        message = operator_message(
            conversation, event, dedup_key=dedup or f"operator:{secrets.token_hex(12)}", text=text
        )
        policy = busy_policy(self.settings.file, conversation.channel, conversation.account, conversation.agent)
        result = await self.ingestor.ingest(message, busy_policy=policy)
        if result.limited is not None:
            raise InvalidRequestError(f"the session refused the message for now ({result.limited}); try again")
        return Accepted(message_id=result.message_id, duplicate=result.duplicate)

    async def decide(self, scope: OperatorScope, session: str, approval_id: str, verdict: str) -> Accepted:
        """Approve or deny a pending approval of ``session`` as the operator (applied by the worker, once).

        Raises:
            InvalidRequestError: ``verdict`` is not ``approve``/``deny``, or the approval is no longer pending.
            NotFoundError: no such session, or no such approval in it.
            OutOfScopeError: the operator is not among the approval's approvers (the policy's ``approvals.approvers``
                names neither ``operators`` nor them).
        """
        if verdict not in ("approve", "deny"):
            raise InvalidRequestError("verdict must be 'approve' or 'deny'")
        chosen: Literal["approve", "deny"] = "approve" if verdict == "approve" else "deny"
        key = await self._existing(scope, session)
        if not valid_approval_id(approval_id):
            raise NotFoundError("no such approval")
        record = record_from_fields(await self.redis.hgetall(SessionKeys(key).approval(approval_id)))
        if record is None:
            raise NotFoundError(f"no approval {approval_id} in {session[:200]}")
        if record.status != "pending":
            raise InvalidRequestError(f"approval {approval_id} is already {record.status}")
        if not may_decide(record, scope.operator, chosen):  # the worker would refuse it: say so now, queue nothing
            raise OutOfScopeError(f"{scope.operator} is not among the approvers of approval {approval_id}")
        event = OperatorActed(action="decide", operator=scope.operator, approval_id=approval_id, verdict=chosen)
        return await self._act(scope, key, event, dedup=f"decide:{approval_id}:{chosen}:{scope.operator}")

    async def take_over(self, scope: OperatorScope, session: str) -> Accepted:
        """Take the conversation over: the agent pauses and the operator's messages reach the user."""
        key = await self._existing(scope, session)
        return await self._act(scope, key, OperatorActed(action="take_over", operator=scope.operator))

    async def say(self, scope: OperatorScope, session: str, text: str) -> Accepted:
        """Send ``text`` to the user as the operator (kept in the conversation's history).

        Raises:
            InvalidRequestError: ``text`` is empty, longer than :data:`MAX_SAY_CHARS`, or not valid Unicode text.
        """
        if not text.strip() or len(text) > MAX_SAY_CHARS:
            raise InvalidRequestError(f"the message must have 1 to {MAX_SAY_CHARS} characters")
        if not is_text(text):
            raise InvalidRequestError("the message is not valid Unicode text")
        key = await self._existing(scope, session)
        return await self._act(scope, key, OperatorActed(action="say", operator=scope.operator), text=text)

    async def hand_back(self, scope: OperatorScope, session: str) -> Accepted:
        """Hand the conversation back to the agent (it resumes with the operator's messages in its history)."""
        key = await self._existing(scope, session)
        return await self._act(scope, key, OperatorActed(action="hand_back", operator=scope.operator))

    async def requeue(self, scope: OperatorScope, session: str, dead_letter_id: str) -> list[Accepted]:
        """Ingest a dead letter's messages into their session again (a second requeue is a duplicate)."""
        key = await self._existing(scope, session)
        accepted = []
        for draft in await dead_letter_messages(self.redis, key, dead_letter_id):
            policy = busy_policy(
                self.settings.file, draft.conversation.channel, draft.conversation.account, draft.conversation.agent
            )
            result = await self.ingestor.ingest(draft, busy_policy=policy)
            accepted.append(Accepted(message_id=result.message_id, duplicate=result.duplicate))
        return accepted

    async def resolve_effect(self, scope: OperatorScope, session: str, key: str, outcome: str) -> DoubtView:
        """Say what became of an effect in doubt: ``done`` (it happened) or ``failed`` (it did not).

        A re-run of its turn then gets that outcome and never performs the call again.

        Raises:
            InvalidRequestError: ``outcome`` is neither.
            NotFoundError: no such effect awaiting reconciliation.
        """
        if outcome not in ("done", "failed"):
            raise InvalidRequestError("outcome must be 'done' or 'failed'")
        chosen: Literal["done", "failed"] = "done" if outcome == "done" else "failed"
        checked = scope.check(session)
        if not is_text(key):
            raise NotFoundError("no such effect awaiting reconciliation")
        return await resolve_doubt(self.redis, checked, key, chosen, scope.operator)
