"""``switchboard discord [listen | register-commands]``: hold Discord's gateway, or register the slash commands.

``listen`` (the default) holds each Discord bot's gateway connection in a process of its own
(:func:`switchboard.cli.listeners.run_listeners`: one holder per bot across all processes, so it is safe beside
``web`` or twice). ``register-commands`` registers ``/ask``, ``/reset``, ``/stop`` and the gateway's other commands
(``/new``, ``/status``, ``/help``…, :func:`switchboard.core.commands.menu`) for every configured bot.
"""

from __future__ import annotations

import asyncio
import sys

from switchboard.channels.discord.adapter import DiscordChannel
from switchboard.cli.listeners import build_adapters, run_listeners
from switchboard.cli.processes import require_layout, require_redis, serve_forever, stop_event
from switchboard.core.commands import may_use, menu
from switchboard.errors import DeliveryError
from switchboard.settings import Settings

__all__ = ["ACTIONS", "discord_command", "discord_menu", "register_commands"]

ACTIONS = ("listen", "register-commands")


def discord_menu(settings: Settings) -> list[tuple[str, str, bool]]:
    """``(name, description, admins only)`` of the gateway's commands: one a ``user`` may not use is for admins."""
    config = settings.file
    hidden = config.hidden_commands()
    return [
        (name, description, not may_use(name, "user", config.commands))
        for name, description in menu(config.commands, hidden=hidden)
    ]


async def register_commands(settings: Settings) -> int:
    """Register the slash commands of every configured Discord bot; the exit status."""
    adapters = build_adapters(settings, ["discord"])
    if not adapters:
        print("switchboard: no Discord account is configured (set SWITCHBOARD_DISCORD__BOT_TOKEN)", file=sys.stderr)
        return 1
    status = 0
    for (_, account), adapter in adapters.items():
        assert isinstance(adapter, DiscordChannel)
        try:
            names = await adapter.register_commands(discord_menu(settings))
            print(f"discord/{account}: registered " + ", ".join(f"/{name}" for name in names))
        except DeliveryError as err:
            print(f"discord/{account}: {err}", file=sys.stderr)
            status = 1
        finally:
            await adapter.aclose()
    return status


async def _listen(settings: Settings) -> None:
    stop = stop_event()
    print("Switchboard discord: holding the gateway connection (one process per bot holds it)", flush=True)
    await run_listeners(settings, ["discord"], stop)


def discord_command(settings: Settings, action: str) -> int:
    """Run ``switchboard discord ACTION``; the exit status."""
    if action == "register-commands":
        return asyncio.run(register_commands(settings))
    require_layout(require_redis(settings, "discord"), "discord")
    serve_forever(_listen(settings), use_uvloop=settings.uvloop)
    return 0
