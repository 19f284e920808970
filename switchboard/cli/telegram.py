"""``switchboard telegram set-webhook URL | delete-webhook | webhook-info | set-commands``: Telegram set-up.

``set-webhook`` registers ``URL`` with the account's secret token (``SWITCHBOARD_TELEGRAM__SECRET_TOKEN``), so
Telegram echoes it in every request and the gateway refuses anything else; ``delete-webhook`` stops Telegram
posting (updates wait for long polling, up to 24 h); ``webhook-info`` shows where Telegram posts and whether its
last delivery failed. The secret itself is never printed. ``set-commands`` sets the bot's command menu
(``setMyCommands``) from the gateway's commands: the default role's menu for every chat, and each other role's for the
private chats of the senders access control names with that role (``roles: {telegram:42: admin}``).
"""

from __future__ import annotations

import asyncio
import sys

from switchboard.channels.registry import env_block, resolve_route
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.factory import FACTORY
from switchboard.cli.listeners import build_adapters
from switchboard.core.commands import RoleMenu, role_menus
from switchboard.errors import ConfigError
from switchboard.queue.access import rules_from_config
from switchboard.settings import Settings

__all__ = ["ACTIONS", "telegram_command", "telegram_menus"]

ACTIONS = ("set-webhook", "delete-webhook", "webhook-info", "set-commands")


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
            case "set-commands":
                for scope in telegram_menus(settings, account):
                    for chat in scope.senders or (None,):
                        await adapter.set_commands(scope.commands, chat)
                    where = f"the private chats of {', '.join(scope.senders)}" if scope.senders else "every chat"
                    names = " ".join(f"/{name}" for name, _ in scope.commands)
                    print(f"Telegram menu for {where} ({scope.role}): {names}")
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


def telegram_menus(settings: Settings, account: str) -> list[RoleMenu]:
    """The command menus of a Telegram account: its default role's, then one per role access control gives senders."""
    config = settings.file
    route = resolve_route(config, "telegram", account)
    rules = rules_from_config(config, {("telegram", account): route.tenant}).get(("telegram", account))
    hidden = config.hidden_commands()
    default_role = rules.default_role if rules is not None else "user"
    roles = rules.roles if rules is not None else ()
    return role_menus(config.commands, "telegram", default_role, roles, hidden=hidden)


def telegram_command(settings: Settings, action: str, url: str | None, account: str = "default") -> int:
    """Run one ``switchboard telegram`` action; returns the exit status.

    Raises:
        ConfigError: the account is not configured, or (``set-webhook``) it has no secret token.
        DeliveryError: Telegram refused the call or could not be reached.
    """
    return asyncio.run(_run(settings, action, url, account))
