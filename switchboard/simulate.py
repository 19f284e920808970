"""``switchboard simulate CHANNEL TEXT``: a correctly signed request to a running gateway, and its reply.

For Telegram it needs the gateway started by ``switchboard run`` without a bot token: ``run`` then
serves a built-in fake Bot API and writes its address and the webhook secret to
``$SWITCHBOARD_DATA_DIR/simulate.json``; the reply is read back from what the fake captured.
For the web chat it speaks the public chat API.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp

from switchboard.settings import Settings

__all__ = ["simulate"]

SIMULATE_FILE = "simulate.json"


def _load(settings: Settings) -> dict[str, Any]:
    path = settings.data_path / SIMULATE_FILE
    if not path.exists():
        raise SystemExit(
            f"switchboard: no running `switchboard run` found ({path} is missing). Start the gateway with "
            "`make run` (or `switchboard run`) in this directory, without a Telegram token, then try again."
        )
    data: dict[str, Any] = json.loads(path.read_text())
    return data


async def _telegram(settings: Settings, text: str, wait_s: float) -> int:
    from switchboard.fakes.telegram import make_update, sign_update

    info = _load(settings)
    gateway = info["gateway_url"].rstrip("/")
    fake = info["telegram"]["fake_url"].rstrip("/")
    chat_id = 7_000_000 + random.randrange(1_000_000)
    update = make_update(text, chat_id=chat_id, update_id=int(time.time() * 1000) % 2_000_000_000)
    body, headers = sign_update(update, info["telegram"]["secret_token"])
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{fake}/_fake/calls", params={"chat_id": str(chat_id)}) as resp:
            since = max((c.get("seq", 0) for c in await resp.json()), default=0)
        async with http.post(f"{gateway}/webhooks/telegram", data=body, headers=headers) as resp:
            if resp.status != 200:
                print(f"gateway answered {resp.status}: {await resp.text()}")
                return 1
        print(f"→ sent to chat {chat_id}: {text}")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            async with http.get(f"{fake}/_fake/calls", params={"chat_id": str(chat_id), "since": str(since)}) as resp:
                calls = await resp.json()
            replies = [c for c in calls if c.get("method") == "sendMessage"]
            if replies:
                for call in replies:
                    print(f"← reply: {call['params'].get('text', '')}")
                return 0
            await asyncio.sleep(0.1)
    print(f"no reply within {wait_s:.0f} s (is a worker running? see `switchboard sessions list`)")
    return 1


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


async def simulate(settings: Settings, channel: str, text: str, *, wait_s: float = 30.0) -> int:
    """Send ``text`` as a user of ``channel`` and print the gateway's reply."""
    if channel == "telegram":
        return await _telegram(settings, text, wait_s)
    return await _web(settings, text, wait_s)
