"""``switchboard simulate CHANNEL TEXT``: a correctly signed request to a running gateway, and its reply.

For a platform channel it needs the gateway started by ``switchboard run`` without that channel's credentials:
``run`` then serves the channel's built-in fake API (its ``Simulation``, found through the channel table) and
writes what ``simulate`` needs (the gateway's address, the fake's, the made-up secrets) to
``$SWITCHBOARD_DATA_DIR/simulate.json``; the reply is read back from what the fake captured. For the web chat it
speaks the public chat API.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from switchboard.channels import registry
from switchboard.settings import Settings

__all__ = ["SIMULATE_FILE", "simulate"]

SIMULATE_FILE = "simulate.json"
_SETTLE_S = 0.5
"""A reply is complete once the fake has seen nothing new for this long (a streamed reply arrives in parts)."""


def _load(settings: Settings, channel: str) -> tuple[str, Mapping[str, str]]:
    path = settings.data_path / SIMULATE_FILE
    if not path.exists():
        raise SystemExit(
            f"switchboard: no running `switchboard run` found ({path} is missing). Start the gateway with "
            f"`make run` (or `switchboard run`) in this directory, without {channel} credentials, then try again."
        )
    data: dict[str, Any] = json.loads(path.read_text())
    details = data.get(channel)
    if not isinstance(details, dict):
        raise SystemExit(
            f"switchboard: the running `switchboard run` does not simulate {channel} (its credentials are set, so "
            f"it talks to the real platform); unset SWITCHBOARD_{channel.upper()}__* and restart it to simulate"
        )
    return str(data["gateway_url"]).rstrip("/"), details


async def _platform(
    settings: Settings,
    sim: registry.Simulation[Any],
    channel: str,
    text: str,
    wait_s: float,
    group: tuple[str, bool] | None = None,
) -> int:
    gateway, details = _load(settings, channel)
    if group is not None and sim.group_request is None:
        print(f"{channel}'s built-in fake cannot simulate group messages")
        return 2
    sample = (
        sim.request(details, text)
        if group is None or sim.group_request is None
        else sim.group_request(details, text, group[0], group[1])
    )
    async with aiohttp.ClientSession() as http:
        earlier = [r for r in await sim.replies(http, details, sample.conversation) if r] if group is not None else []
        async with http.post(f"{gateway}/webhooks/{channel}", data=sample.body, headers=dict(sample.headers)) as resp:
            if resp.status >= 300:
                print(f"gateway answered {resp.status}: {await resp.text()}")
                return 1
        print(f"→ sent to {channel} conversation {sample.conversation}: {text}")
        if group is not None and not group[1]:
            wait_s = min(wait_s, 3.0)  # not addressed to the bot: answered only where every message is
        deadline = time.monotonic() + wait_s
        seen: list[str] = []
        settled_at = 0.0
        while time.monotonic() < deadline:
            replies = [reply for reply in await sim.replies(http, details, sample.conversation) if reply]
            replies = replies[len(earlier) :]
            if replies != seen:
                seen, settled_at = replies, time.monotonic() + _SETTLE_S
            elif seen and time.monotonic() >= settled_at:
                break
            await asyncio.sleep(0.1)
    if not seen and group is not None and not group[1]:
        print("no reply: the message did not address the bot (kept as context if group_replies.keep_context is on)")
        return 0
    if not seen:
        print(f"no reply within {wait_s:.0f} s (is a worker running? see `switchboard sessions list`)")
        return 1
    for reply in seen:
        print(f"← reply: {reply}")
    return 0


async def _web(settings: Settings, text: str, wait_s: float) -> int:
    base = f"http://{settings.host}:{settings.port}"
    path = settings.data_path / SIMULATE_FILE
    if path.exists():
        base = json.loads(path.read_text())["gateway_url"].rstrip("/")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/chat/sessions") as resp:
            session = await resp.json()
        auth = {"Authorization": f"Bearer {session['token']}"}
        async with http.post(f"{base}/api/chat/messages", json={"text": text}, headers=auth) as resp:
            if resp.status != 202:
                print(f"gateway answered {resp.status}: {await resp.text()}")
                return 1
            message_id = (await resp.json())["message_id"]
        print(f"→ sent: {text}")
        async with http.get(
            f"{base}/api/chat/stream", headers=auth, timeout=aiohttp.ClientTimeout(total=wait_s)
        ) as stream:
            event = ""
            async for raw in stream.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event in {"message", "reply_error"}:
                    data = json.loads(line[5:])
                    if data.get("reply_to") == message_id:
                        print(f"← {event}: {data.get('text') or data.get('message')}")
                        return 0 if event == "message" else 1
    return 1


async def simulate(
    settings: Settings,
    channel: str,
    text: str,
    *,
    wait_s: float = 30.0,
    group: str | None = None,
    mention: bool = False,
) -> int:
    """Send ``text`` as a user of ``channel`` (in ``group``, mentioning the bot or not); print the reply."""
    found = registry.factory(channel)
    if found is None:
        print(f"unknown channel {channel!r} (channels: {', '.join(registry.CHANNEL_MODULES)})")
        return 2
    if found.builtin:
        if group is not None:
            print("the web chat has no groups")
            return 2
        return await _web(settings, text, wait_s)
    sim = registry.simulation(found)
    if sim is None:
        print(f"{channel} has no built-in fake to simulate with")
        return 2
    return await _platform(settings, sim, channel, text, wait_s, None if group is None else (group, mention))
