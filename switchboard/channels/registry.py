"""Which channel accounts are enabled, and routing of send actions to their adapters."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from switchboard.channels.base import Channel, Receipt
from switchboard.core.actions import Action
from switchboard.core.messages import ConversationRef
from switchboard.errors import ConfigError, DeliveryError
from switchboard.settings import Settings, TelegramSettings
from switchboard.types import SessionKey

__all__ = ["ChannelSet", "build_channels"]

logger = logging.getLogger(__name__)

Publish = Callable[[SessionKey, str, dict[str, Any]], Awaitable[str]]


def _telegram_accounts(settings: Settings) -> dict[str, TelegramSettings]:
    accounts: dict[str, TelegramSettings] = {}
    if settings.telegram.enabled:
        accounts["default"] = settings.telegram
    options = settings.file.channels.get("telegram")
    for name, account in (options.accounts if options else {}).items():
        values: dict[str, Any] = dict(account.options)
        for field, env_name in account.secrets_from_env.items():
            value = os.environ.get(env_name)
            if value is None:
                raise ConfigError(
                    f"channels.telegram.accounts.{name}: environment variable {env_name} (for {field}) is not set",
                    field=f"channels.telegram.accounts.{name}.secrets_from_env.{field}",
                )
            values[field] = value
        accounts[name] = TelegramSettings.model_validate(values)
    return accounts


def build_channels(settings: Settings, *, publish: Publish | None) -> dict[tuple[str, str], Channel]:
    """Adapters for every enabled channel account, keyed by ``(channel, account)``.

    The web chat is always on; a platform channel is on when its credentials are present.
    """
    from switchboard.channels.telegram import TelegramChannel
    from switchboard.channels.web import WebChannel

    cfg = settings.file
    found: dict[tuple[str, str], Channel] = {}

    def agent_for(channel: str, account: str) -> tuple[str, str]:
        options = cfg.channels.get(channel)
        extra = options.accounts.get(account) if options else None
        agent = (extra.agent if extra else None) or (options.agent if options else None) or cfg.default_agent
        tenant = (extra.tenant if extra else None) or (options.tenant if options else None) or cfg.tenant
        cfg.agent(agent)  # raises ConfigError naming the agents that exist
        return agent, tenant

    for account, tg in _telegram_accounts(settings).items():
        agent, tenant = agent_for("telegram", account)
        found[("telegram", account)] = TelegramChannel(tg, agent=agent, tenant=tenant, account=account)
    agent, tenant = agent_for("web", "default")
    found[("web", "default")] = WebChannel(publish=publish, agent=agent, tenant=tenant)
    return found


class ChannelSet:
    """Routes send actions to the adapter of the conversation's channel account (the queue's Deliverer)."""

    def __init__(self, channels: dict[tuple[str, str], Channel]) -> None:
        self.channels = channels

    def _adapter(self, conversation: ConversationRef) -> Channel:
        adapter = self.channels.get((conversation.channel, conversation.account))
        if adapter is None:
            raise DeliveryError(
                f"channel account {conversation.channel}/{conversation.account} is not enabled in this process",
                channel=conversation.channel,
                retryable=False,
            )
        return adapter

    def streams(self, conversation: ConversationRef) -> bool:
        """Whether the conversation's channel shows streamed deltas."""
        return bool(self._adapter(conversation).streams)

    async def perform(self, action: Action, conversation: ConversationRef, *, idempotency_key: str) -> Receipt:
        """Carry out one send action."""
        return await self._adapter(conversation).perform(action, conversation, idempotency_key=idempotency_key)

    async def start(self) -> None:
        """Let adapters that need it look themselves up on their platform (Telegram ``getMe``)."""
        for adapter in self.channels.values():
            start = getattr(adapter, "start", None)
            if start is not None:
                try:
                    await start()
                except Exception as exc:  # a platform being down must not stop the gateway
                    logger.warning("%s: start-up lookup failed: %s", adapter.name, exc)

    async def aclose(self) -> None:
        """Close every adapter's connection pool."""
        for adapter in self.channels.values():
            await adapter.aclose()
