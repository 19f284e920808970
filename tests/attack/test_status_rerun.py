"""What "a re-run of the call" means for ``shell``: the same command again later in the turn is a new action.

Found while checking the status message's claim that a re-run edits the same message (the message's name is the
call's idempotency key): when the key was only the run and the arguments, the gateway answered a repeated command
from its record. The key now counts the occurrence of the action within the run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio as aioredis

from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.core.workspaces.disk import workspace_for
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.queue.ingest import Ingestor
from switchboard.sandbox.runner import Sandbox
from tests.attack.test_status_hostile import QUEUE, bwrap, channel, fake, make_drainer, private
from tests.core.turns import answer_step, calls_step
from tests.fakes.telegram_api import FakeTelegram
from tests.sandbox.test_shell_progress import history_of, inbound

__all__ = ["bwrap", "channel", "fake"]


async def test_the_same_command_run_again_in_one_turn_really_runs_again(
    fake: FakeTelegram, channel: TelegramChannel, bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    conversation = private(4501)
    message = inbound(conversation)
    workspace = workspace_for(tmp_path, message.session_key)
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "n.txt").write_text("v1")
    steps = [
        calls_step(("shell", {"commands": ["cat n.txt"]}), step=1),
        calls_step(("shell", {"commands": ["printf 'v%s' 2 > n.txt"]}), step=2),
        calls_step(("shell", {"commands": ["cat n.txt"]}), step=3),  # the model checks its change
        answer_step("Changed.", step=4),
    ]
    worker = make_drainer(async_redis, tmp_path, bwrap, steps, ChannelDeliverer({("telegram", "default"): channel}))
    await Ingestor(async_redis, QUEUE).ingest(message)
    await asyncio.wait_for(worker.drain(message.session_key), 60)
    assert (workspace / "n.txt").read_text() == "v2"  # the change was made
    history = await history_of(async_redis, message)
    assert b"Changed." in history
    assert b"v2" in history, "the second `cat n.txt` answered with the first one's output (v1)"
