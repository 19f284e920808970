"""① → ③ The ingest router: one place where every inbound message is routed and durably accepted.

Webhooks, the web chat and long-running listeners (Discord's gateway, Telegram long polling, Slack Socket Mode) all
hand what an adapter received to :class:`IngestRouter`. It fills the conversation's agent and tenant from the
configuration (an adapter given them in its ``BuildContext`` builds its drafts routed, which spares a copy of each;
others leave them empty), picks the busy policy (account > channel > agent), and ingests each
message (dedup, limits, append, drain) with the metrics counted. Every message of one ``Inbound`` is accepted, or
:class:`~switchboard.errors.QueueUnavailableError` is raised and the platform is not acknowledged: it retries, and
the dedup keys make the retry safe. A message for an account that is not configured (a payload naming a Meta page
nobody set up) is dropped with a warning and a metric: never an error the platform would retry for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Protocol

from switchboard.channels.base import Channel, Emit, HttpAnswer, Inbound
from switchboard.channels.registry import Route, busy_policy, resolve_route
from switchboard.core.messages import InboundMessage
from switchboard.errors import QueueUnavailableError
from switchboard.queue.ingest import Ingestor, IngestResult
from switchboard.settings import FileConfig
from switchboard.types import BusyPolicy

__all__ = ["IngestMetrics", "IngestRouter", "Route", "busy_policy", "resolve_route"]

logger = logging.getLogger(__name__)


class IngestMetrics(Protocol):
    """What the router counts (:class:`switchboard.metrics.Metrics` has it)."""

    def ingested(self, channel: str, *, duplicate: bool) -> None:
        """Count one message accepted or deduplicated."""

    def rejected(self, channel: str, reason: str) -> None:
        """Count one message or request refused (``reason`` is a code of ours)."""


class IngestRouter:
    """Routes inbound messages to their agent and tenant and ingests them durably."""

    def __init__(
        self,
        ingestor: Ingestor,
        config: FileConfig,
        accounts: Collection[tuple[str, str]],
        metrics: IngestMetrics | None = None,
    ) -> None:
        """Resolve every enabled account's route once.

        Args:
            ingestor: the durable ingest (dedup, limits, append, drain).
            config: the YAML file (agents, ``channels.<name>`` options and accounts, defaults).
            accounts: the enabled ``(channel, account)`` pairs; a message for any other is dropped.
            metrics: counts accepted, deduplicated and refused messages.

        Raises:
            ConfigError: an account routes to an agent that is not defined.
        """
        self.ingestor = ingestor
        self.config = config
        self.metrics = metrics
        self._routes: dict[tuple[str, str], Route] = {key: resolve_route(config, *key) for key in accounts}

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
        channel = message.conversation.channel
        routed = self.route(message)
        if routed is None:
            logger.warning(
                "%s: dropped a message for account %r, which is not configured (add it under channels.%s.accounts)",
                channel,
                message.conversation.account[:64],
                channel,
            )
            self._rejected(channel, "unknown_account")
            return None
        draft, policy = routed
        result = await self.ingestor.ingest(draft, busy_policy=policy, echo=echo, idempotent=idempotent)
        if result.limited is not None:
            self._rejected(channel, "rate_limited")
        elif result.reused:
            self._rejected(channel, "client_id_reused")
        elif self.metrics is not None:
            self.metrics.ingested(channel, duplicate=result.duplicate)
        return result

    async def accept(self, adapter: Channel, inbound: Inbound) -> HttpAnswer:
        """Durably accept every message of ``inbound``; returns the answer the platform expects.

        Messages over an abuse limit are dropped (the platform is still acknowledged: a refusal would only be
        retried) and recorded in the session's log.

        Raises:
            QueueUnavailableError: one message was not confirmed (answer 5xx: the platform retries them all, and
                the ones already accepted are dropped as duplicates).
        """
        for message in inbound.messages:
            try:
                await self.ingest(message)
            except QueueUnavailableError:
                self._rejected(adapter.name, "queue_unavailable")
                raise
        return inbound.answer

    def emit_for(self, adapter: Channel) -> Emit:
        """The ``Emit`` a listener of ``adapter`` hands what it receives to."""

        async def emit(inbound: Inbound) -> None:
            await self.accept(adapter, inbound)

        return emit

    def _rejected(self, channel: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected(channel, reason)
