"""Every channel of the registry, the echo test channel and the mock channel pass the conformance kit.

The kit (``switchboard/channels/testing.py``) drives each adapter against its own fake: verify, parse every sample
payload, answer, render, split, and every kind of ``Action``. A channel added with its folder and one registry line
is checked here without an edit to this file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchboard.channels import registry
from switchboard.channels.base import Inbound, RawRequest
from switchboard.channels.testing import (
    ConformanceError,
    MockChannel,
    channel_harness,
    check_actions,
    check_parse,
    check_verify,
    run_conformance,
    sample_actions,
)
from switchboard.core.actions import SendFile

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads"
ECHO = Path(__file__).resolve().parent / "echo"


@pytest.mark.parametrize("name", list(registry.CHANNEL_MODULES))
async def test_every_channel_of_the_registry_passes_the_kit(name: str) -> None:
    async with channel_harness(registry.factory(name)) as harness:
        await run_conformance(harness, PAYLOADS / name)


async def test_the_echo_channel_passes_the_kit_from_its_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.CHANNEL_MODULES, "echo", "tests.channels.echo.factory")
    async with channel_harness(registry.factory("echo")) as harness:
        await run_conformance(harness, ECHO / "payloads")


@pytest.fixture
def mock_payloads(tmp_path: Path) -> Path:
    for n, body in enumerate([{"id": "1", "chat": "c", "text": "hi"}, {"id": "2", "chat": "c"}, [], "x" * 10]):
        (tmp_path / f"{n}.json").write_text(json.dumps(body))
    return tmp_path


async def test_the_mock_channel_passes_the_kit(monkeypatch: pytest.MonkeyPatch, mock_payloads: Path) -> None:
    monkeypatch.setitem(registry.CHANNEL_MODULES, "mock", "switchboard.channels.testing")
    async with channel_harness(registry.factory("mock")) as harness:
        await run_conformance(harness, mock_payloads)


# ---- the kit can fail: adapters with the faults it exists to catch


class _TrustingMock(MockChannel):
    async def verify(self, request: RawRequest) -> None:
        return None  # accepts a forged body


class _CrashingMock(MockChannel):
    async def receive(self, request: RawRequest) -> Inbound:
        json.loads(request.body)["text"].strip()  # KeyError / AttributeError on odd payloads
        return await super().receive(request)


class _FileDroppingMock(MockChannel):
    @property
    def capabilities(self):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        return replace(super().capabilities, files=True)  # promises files, yet refuses them


@pytest.mark.parametrize(
    ("broken", "check", "message"),
    [
        (_TrustingMock, "verify", "verify: no headers: accepted"),
        (_CrashingMock, "parse", "raised"),
        (_FileDroppingMock, "actions", "perform file: promised by its capabilities"),
    ],
)
async def test_the_kit_catches_a_broken_adapter(
    broken: type[MockChannel], check: str, message: str, monkeypatch: pytest.MonkeyPatch, mock_payloads: Path
) -> None:
    monkeypatch.setitem(registry.CHANNEL_MODULES, "mock", "switchboard.channels.testing")
    async with channel_harness(registry.factory("mock")) as harness:
        assert isinstance(harness.adapter, MockChannel)
        harness.adapter = broken(harness.adapter.settings, registry.BuildContext())
        with pytest.raises(ConformanceError, match=message):
            match check:
                case "verify":
                    await check_verify(harness)
                case "parse":
                    await check_parse(harness, mock_payloads)
                case "actions":
                    await check_actions(harness)


def test_the_kit_has_a_sample_of_every_action_kind() -> None:
    kinds = [type(action) for action in sample_actions()]
    assert len(kinds) == len(set(kinds)) and SendFile in kinds
