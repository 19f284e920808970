"""The Slack ingest benchmark's helpers sign what they send, and the benchmark runs (``--quick``; no timing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from bench._slack_load import SIGNING_SECRET, self_check, slack_load
from switchboard.channels.base import RawRequest
from switchboard.channels.slack.adapter import SlackChannel
from switchboard.channels.slack.settings import SlackSettings

REPO = Path(__file__).resolve().parents[2]


async def test_every_generated_request_is_signed_and_parses_to_its_own_message() -> None:
    self_check()  # the precomputed-state HMAC (what the wrk script runs) equals hmac's
    spec = slack_load(start=500)
    channel = SlackChannel(SlackSettings(bot_token="xoxb-b", signing_secret=SIGNING_SECRET))  # type: ignore[arg-type]
    keys = set()
    for n in range(50):
        body, headers = spec.request(n)
        request = RawRequest("POST", spec.path, CIMultiDictProxy(CIMultiDict(headers)), {}, body)
        await channel.verify(request)
        (message,) = (await channel.receive(request)).messages
        keys.add(message.dedup_key)
    assert len(keys) == 50 and 1300 < spec.body_bytes < 1700


def test_the_wrk_script_carries_the_precomputed_signer() -> None:
    script = slack_load().lua()
    assert 'require("bit")' in script and "X-Slack-Signature" in script and SIGNING_SECRET not in script


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_the_benchmark_runs() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.slack_ingest", "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Slack webhook req/s vs slack-bolt" in proc.stdout
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| 1 | slack |")]
    assert row.split("|")[-2].strip() == "0"  # no errors: every signed request was accepted
