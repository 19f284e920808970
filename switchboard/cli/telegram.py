"""``switchboard telegram set-webhook URL | delete-webhook | webhook-info``: point Telegram at the gateway.

``set-webhook`` registers ``URL`` with the account's secret token (``SWITCHBOARD_TELEGRAM__SECRET_TOKEN``), so
Telegram echoes it in every request and the gateway refuses anything else; ``delete-webhook`` stops Telegram
posting (updates wait for long polling, up to 24 h); ``webhook-info`` shows where Telegram posts and whether its
last delivery failed. The secret itself is never printed.
"""

from __future__ import annotations

import asyncio
import sys

from switchboard.channels.registry import env_block
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.factory import FACTORY
from switchboard.cli.listeners import build_adapters
from switchboard.errors import ConfigError
from switchboard.settings import Settings

__all__ = ["ACTIONS", "telegram_command"]

ACTIONS = ("set-webhook", "delete-webhook", "webhook-info")


def _adapter(settings: Settings, account: str) -> TelegramChannel:
    adapters = build_adapters(settings, ["telegram"])
    adapter = adapters.get(("telegram", account))
    if not isinstance(adapter, TelegramChannel):
        known = ", ".join(sorted(name for _, name in adapters)) or "none"
        raise ConfigError(
            f"no Telegram account {account!r} is configured (configured: {known}); set "
            "SWITCHBOARD_TELEGRAM__BOT_TOKEN, or add channels.telegram.accounts to the YAML file",
            field="telegram",
        )
    return adapter


async def _run(settings: Settings, action: str, url: str | None, account: str) -> int:
    adapter = _adapter(settings, account)
    try:
        match action:
            case "set-webhook":
                if not url or not url.startswith(("https://", "http://")):
                    print("switchboard: set-webhook needs the gateway's public https:// URL", file=sys.stderr)
                    return 2
                await adapter.set_webhook(url)
                print(f"Telegram now posts account {account!r}'s updates to {url}, with the secret token.")
                if env_block(settings, FACTORY).transport == "polling" and account == "default":
                    print("Note: SWITCHBOARD_TELEGRAM__TRANSPORT=polling deletes the webhook when the gateway starts.")
            case "delete-webhook":
                await adapter.delete_webhook()
                print(f"Telegram no longer posts account {account!r}'s updates; they wait for long polling.")
            case "webhook-info":
                info = await adapter.webhook_info()
                print(f"url: {info.get('url') or '(none: long polling)'}")
                print(f"pending updates: {info.get('pending_update_count', 0)}")
                if info.get("last_error_message"):
                    print(f"last error: {info['last_error_message']}")
            case _:
                raise ConfigError(f"unknown telegram action {action!r} (one of {', '.join(ACTIONS)})", field="telegram")
    finally:
        await adapter.aclose()
    return 0


def telegram_command(settings: Settings, action: str, url: str | None, account: str = "default") -> int:
    """Run one ``switchboard telegram`` action; returns the exit status.

    Raises:
        ConfigError: the account is not configured, or (``set-webhook``) it has no secret token.
        DeliveryError: Telegram refused the call or could not be reached.
    """
    return asyncio.run(_run(settings, action, url, account))
