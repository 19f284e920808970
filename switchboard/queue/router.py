"""① → ③ The ingest router: one place where every inbound message is routed and durably accepted.

Webhooks, the web chat and listeners hand what an adapter received to :class:`IngestRouter`, which fills in agent,
tenant and busy policy from the configuration and ingests each message. All of one ``Inbound`` is accepted, or
:class:`~switchboard.errors.QueueUnavailableError` is raised and the platform retries safely (dedup keys); a message
for an account nobody configured is dropped with a metric, never an error the platform would retry for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Protocol

from pydantic_core import PydanticSerializationError
from redis.exceptions import RedisError

from switchboard.channels.base import Channel, DeliveryStatus, Emit, HttpAnswer, Inbound
from switchboard.channels.registry import CHANNEL_MODULES, Route, account_group_rule, busy_policy, resolve_route
from switchboard.core.access import Admitted, judge
from switchboard.core.groups import CONTEXT_ONLY_META, KeepContext
from switchboard.core.messages import ExternalEvent, InboundMessage, OperatorActed, Scheduled, session_key
from switchboard.core.routing import bound_agent
from switchboard.errors import ConfigError, MalformedBodyError, QueueUnavailableError
from switchboard.queue import groups
from switchboard.queue.access import AccessGate, Notify, rules_from_config
from switchboard.queue.handoffs import Handoffs
from switchboard.queue.ingest import Ingestor, IngestResult
from switchboard.queue.statuses import record_statuses
from switchboard.settings import FileConfig
from switchboard.types import BusyPolicy

__all__ = ["IngestMetrics", "IngestRouter", "Route", "busy_policy", "check_routing", "resolve_route"]

logger = logging.getLogger(__name__)


def _operators(message: InboundMessage) -> bool:
    """Whether the message is the tenant's own (an operator's or API token's action, a scheduled turn), not a user's.

    Channels cannot send these (:meth:`IngestRouter.accept` refuses them); they were authorised by the console, a
    token's scopes or the schedule, so access control, which judges chat users, does not judge them.
    """
    return isinstance(message.event, OperatorActed | ExternalEvent | Scheduled)


class IngestMetrics(Protocol):
    """What the router counts (:class:`switchboard.web.metrics.Metrics` has it)."""

    def ingested(self, channel: str, *, duplicate: bool) -> None:
        """Count one message accepted or deduplicated."""

    def rejected(self, channel: str, reason: str) -> None:
        """Count one message or request refused (``reason`` is a code of ours)."""


def check_routing(config: FileConfig) -> None:
    """The ``routing`` bindings name channels that exist (agents are checked when the file is loaded).

    Raises:
        ConfigError: a binding names an unknown channel, or the web chat (whose sessions pick their agent).
    """
    for index, rule in enumerate(config.routing):
        channel = rule.match.channel
        if channel == "web":
            raise ConfigError(
                f"routing[{index}]: the web chat picks its agent per session (the agent the page asks for); "
                "remove `channel: web` from this binding",
                field=f"routing.{index}.match.channel",
            )
        if channel is not None and channel not in CHANNEL_MODULES:
            raise ConfigError(
                f"routing[{index}]: unknown channel {channel!r} (channels: {', '.join(sorted(CHANNEL_MODULES))})",
                field=f"routing.{index}.match.channel",
            )


class IngestRouter:
    """Routes inbound messages to their agent and tenant and ingests them durably."""

    def __init__(
        self,
        ingestor: Ingestor,
        config: FileConfig,
        accounts: Collection[tuple[str, str]],
        metrics: IngestMetrics | None = None,
        *,
        notify: Notify | None = None,
    ) -> None:
        """Resolve every enabled account's route and access rules once.

        Args:
            ingestor: the durable ingest (dedup, limits, append, drain).
            config: the YAML file (agents, ``channels.<name>`` options and accounts, defaults).
            accounts: the enabled ``(channel, account)`` pairs; a message for any other is dropped.
            metrics: counts accepted, deduplicated and refused messages.
            notify: sends access control's answer to a refused sender (``None``: refused silently).

        Raises:
            ConfigError: an account routes to an agent that is not defined, or a binding names an unknown channel.
        """
        check_routing(config)
        self.ingestor = ingestor
        self.config = config
        self.metrics = metrics
        self._routes: dict[tuple[str, str], Route] = {key: resolve_route(config, *key) for key in accounts}
        rules = rules_from_config(config, {key: route.tenant for key, route in self._routes.items()})
        self.gate: AccessGate | None = (
            AccessGate(ingestor.redis, rules, notify=notify, events_maxlen=ingestor.settings.events_maxlen)
            if rules
            else None
        )
        """Access control (``None`` when every account is open to everyone: no check, no cost)."""
        self._keep: dict[tuple[str, str], KeepContext] = {}
        """``group_replies.keep_context`` of the accounts that keep unanswered group messages."""
        for key in self._routes:
            keep = account_group_rule(config, *key).keep
            if keep is not None:
                self._keep[key] = keep
        self.handoffs = Handoffs.build(ingestor.redis, config)
        """Conversations handed to another agent (``None`` when no agent may hand over: nothing is read)."""
        self._bindings = tuple(config.routing)

    @property
    def routes(self) -> Mapping[tuple[str, str], Route]:
        """Every enabled account's route."""
        return self._routes

    def route(self, message: InboundMessage) -> tuple[InboundMessage, BusyPolicy] | None:
        """The message with its agent and tenant filled in, and its busy policy; ``None`` for an unknown account.

        A message that already names its agent (its adapter built it routed, or a web chat session chose one) keeps
        its agent and tenant, uncopied; its busy policy is then the account's, else the channel's, else that agent's.
        """
        conv = message.conversation
        route = self._routes.get((conv.channel, conv.account))
        if route is None:
            return None
        if conv.agent == route.agent:  # built routed by its adapter (BuildContext): no copy
            return message, route.busy_policy
        if conv.agent:
            return message, busy_policy(self.config, conv.channel, conv.account, conv.agent)
        routed = conv.model_copy(update={"agent": route.agent, "tenant": route.tenant})
        return message.model_copy(update={"conversation": routed}), route.busy_policy

    async def ingest(
        self, message: InboundMessage, *, echo: Mapping[str, str] | None = None, idempotent: bool = False
    ) -> IngestResult | None:
        """Route and durably accept one message; ``None`` when its account is not configured (dropped, counted).

        Counts it as accepted or deduplicated; a message over an abuse limit is counted as refused
        (``rate_limited``) and comes back with ``limited`` set.

        Raises:
            QueueUnavailableError: Redis did not confirm in time (answer 5xx; the platform retries).
        """
        routed = self.route(message)
        if routed is None:
            self._unknown_account(message)
            return None
        draft, policy = routed
        if draft.meta.get(CONTEXT_ONLY_META):
            await self._keep_context(draft)
            return None
        if self.gate is not None and not _operators(draft):
            admitted = await self._admit(draft)  # stamps the sender's role, which a binding may match
            if admitted is None:
                return None
            draft = admitted
        if self._bindings or self.handoffs is not None:
            draft, policy = await self._bind(draft, policy)
        result = await self.ingestor.ingest(draft, busy_policy=policy, echo=echo, idempotent=idempotent)
        self._count(message.conversation.channel, result)
        return result

    async def _keep_context(self, draft: InboundMessage) -> None:
        """Keep a group message that did not address the bot as context (no run), if its account keeps any.

        It is kept for the account's agent: a conversation handed over or bound to another agent answers without it
        (``docs/groups.md``).

        Access control decides from the configuration alone (who is not admitted by it is not kept, and nobody is
        answered: the message was not for the bot).
        """
        conv = draft.conversation
        keep = self._keep.get((conv.channel, conv.account))
        if keep is None:
            return
        if self.gate is not None:
            rules = self.gate.rules_for(conv)
            if rules is not None and not isinstance(judge(rules, draft), Admitted):
                return
        settings = self.ingestor.settings
        try:
            await groups.keep(
                self.ingestor.redis,
                draft,
                keep,
                dedup_ttl_s=settings.dedup_ttl_s,
                events_maxlen=settings.events_maxlen,
            )
        except (TimeoutError, RedisError, OSError) as err:
            raise QueueUnavailableError(f"Redis did not confirm the kept context: {type(err).__name__}") from err

    async def _bind(self, draft: InboundMessage, policy: BusyPolicy) -> tuple[InboundMessage, BusyPolicy]:
        """The draft sent to the agent its conversation was handed to, else the first ``routing`` binding's.

        The web chat is left as it is: its sessions name their agent.
        """
        conv = draft.conversation
        if conv.channel == "web":
            return draft, policy
        agent = None
        if self.handoffs is not None:
            try:
                agent = await self.handoffs.bound(conv)
            except (TimeoutError, RedisError, OSError) as err:
                raise QueueUnavailableError(f"Redis did not answer the handoff lookup: {type(err).__name__}") from err
        if agent is None:
            agent = bound_agent(self._bindings, draft)
        if agent is None or agent == conv.agent:
            return draft, policy
        routed = conv.model_copy(update={"agent": agent})
        return (
            draft.model_copy(update={"conversation": routed}),
            busy_policy(self.config, conv.channel, conv.account, agent),
        )

    async def _admit(self, draft: InboundMessage) -> InboundMessage | None:
        """The routed draft as access control admits it (role stamped), or ``None`` when refused (counted)."""
        assert self.gate is not None
        rules = self.gate.rules_for(draft.conversation)
        if rules is None:
            return draft
        admitted = await self.gate.admit(draft, rules)
        if admitted is None:
            self._rejected(draft.conversation.channel, "access_refused")
        return admitted

    def _unknown_account(self, message: InboundMessage) -> None:
        channel, account = message.conversation.channel, message.conversation.account
        logger.warning(
            "%s: dropped a message for account %r, which is not configured (add it under channels.%s.accounts)",
            channel,
            account[:64],
            channel,
        )
        self._rejected(channel, "unknown_account")

    def _count(self, channel: str, result: IngestResult) -> None:
        if result.limited is not None:
            self._rejected(channel, "rate_limited")
        elif result.reused:
            self._rejected(channel, "client_id_reused")
        elif self.metrics is not None:
            self.metrics.ingested(channel, duplicate=result.duplicate)

    async def accept(self, adapter: Channel, inbound: Inbound) -> HttpAnswer:
        """Durably accept every message of ``inbound``; returns the answer the platform expects.

        Messages over an abuse limit are dropped (the platform is still acknowledged: a refusal would only be
        retried) and recorded in the session's log.

        Raises:
            QueueUnavailableError: one message was not confirmed (answer 5xx: the platform retries them all, and
                the ones already accepted are dropped as duplicates).
        """
        messages = inbound.messages
        for message in messages:
            if _operators(message):  # only the console, API and gateway do
                self._rejected(adapter.name, "forged_operator_event")
                raise MalformedBodyError(f"{adapter.name}: a channel cannot send operator actions")
        try:
            if len(messages) == 1:
                await self.ingest(messages[0])
            elif messages:
                await self._ingest_all(messages)
        except QueueUnavailableError:
            self._rejected(adapter.name, "queue_unavailable")
            raise
        except PydanticSerializationError:  # text that cannot be stored (a lone surrogate an adapter let through)
            self._rejected(adapter.name, "unencodable")
            raise MalformedBodyError(f"{adapter.name}: a message holds text that cannot be stored") from None
        if inbound.statuses:
            await self._record_statuses(adapter, inbound.statuses)
        return inbound.answer

    async def _ingest_all(self, messages: tuple[InboundMessage, ...]) -> None:
        """Route and accept the messages of one delivery, their scripts sent together (one round trip, in order).

        Counted as :meth:`ingest` counts them; a message for an account that is not configured is dropped as there.
        """
        routed = []
        for message in messages:
            found = self.route(message)
            if found is None:
                self._unknown_account(message)
                continue
            if found[0].meta.get(CONTEXT_ONLY_META):
                await self._keep_context(found[0])
                continue
            if self.gate is not None and not _operators(found[0]):
                admitted = await self._admit(found[0])
                if admitted is None:
                    continue
                found = (admitted, found[1])
            if self._bindings or self.handoffs is not None:
                found = await self._bind(*found)
            routed.append(found)
        if routed:  # each counted as soon as it is confirmed, as one by one (also those before a failure)
            await self.ingestor.ingest_all(
                routed, lambda draft, result: self._count(draft.conversation.channel, result)
            )

    async def _record_statuses(self, adapter: Channel, statuses: tuple[DeliveryStatus, ...]) -> None:
        """Record delivery reports in their sessions' event logs (an unknown account's are dropped, counted)."""
        reports = []
        for status in statuses:
            conv = status.conversation
            route = self._routes.get((conv.channel, conv.account))
            if route is None:
                self._rejected(conv.channel, "unknown_account")
                continue
            agent, tenant = (conv.agent, conv.tenant) if conv.agent else (route.agent, route.tenant)
            session = session_key(tenant, agent, conv.channel, conv.account, conv.conversation, conv.thread)
            reports.append((session, status))
        settings = self.ingestor.settings
        try:
            await record_statuses(
                self.ingestor.redis, reports, maxlen=settings.events_maxlen, timeout_s=settings.ingest_timeout_s
            )
        except (TimeoutError, RedisError, OSError) as err:
            self._rejected(adapter.name, "queue_unavailable")
            raise QueueUnavailableError(f"Redis did not confirm the delivery reports: {type(err).__name__}") from err

    def emit_for(self, adapter: Channel) -> Emit:
        """The ``Emit`` a listener of ``adapter`` hands what it receives to."""

        async def emit(inbound: Inbound) -> None:
            await self.accept(adapter, inbound)

        return emit

    def _rejected(self, channel: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected(channel, reason)
