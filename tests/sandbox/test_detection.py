"""Choosing the sandbox at start-up, and what ``switchboard check`` says about it."""

from __future__ import annotations

import subprocess
import sys

from switchboard.cli.sandbox import describe
from switchboard.sandbox.detect import choose_now
from switchboard.sandbox.runner import Sandbox
from tests.sandbox.conftest import LIMITS


def sb_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "check"], env=env, capture_output=True, text=True, timeout=60
    )


def test_auto_picks_the_strongest_kind_that_runs(bwrap: Sandbox) -> None:
    choice = choose_now("auto", limits=LIMITS)
    assert choice.sandbox is not None and choice.sandbox.label == "bwrap+seccomp" and choice.reasons == ()


def test_off_offers_no_sandbox_and_says_why() -> None:
    choice = choose_now("off")
    assert choice.sandbox is None
    assert describe(choice) == [
        "none — the shell tool is not offered",
        "not used: the sandbox is turned off (SWITCHBOARD_SANDBOX__KIND=off)",
    ]


def test_the_weak_floor_needs_the_operators_consent() -> None:
    refused = choose_now("weak", limits=LIMITS)
    assert refused.sandbox is None and "ALLOW_WEAK" in refused.reasons[0]
    allowed = choose_now("weak", limits=LIMITS, allow_weak=True)
    assert allowed.sandbox is not None and allowed.sandbox.label == "weak"
    assert allowed.sandbox.detail.startswith("WEAK")


def test_check_shows_the_isolation_that_applies(base_env: dict[str, str], bwrap: Sandbox) -> None:
    result = sb_check(base_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sandbox:     bwrap+seccomp — bubblewrap" in result.stdout


def test_check_says_why_there_is_no_shell(base_env: dict[str, str]) -> None:
    result = sb_check(base_env | {"SWITCHBOARD_SANDBOX__KIND": "weak"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sandbox:     none — the shell tool is not offered" in result.stdout
    assert "not used: weak: not allowed (SWITCHBOARD_SANDBOX__ALLOW_WEAK=false)" in result.stdout
