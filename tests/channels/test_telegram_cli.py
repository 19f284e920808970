"""``switchboard telegram set-webhook URL | delete-webhook | webhook-info`` against the fake Bot API."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator

import pytest

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.cli.main import main
from tests.channels.test_telegram import SECRET, TOKEN


@pytest.fixture
def fake() -> Iterator[FakeTelegram]:
    """The fake on a loop of its own thread: the command runs its own event loop (``asyncio.run``)."""
    loop = asyncio.new_event_loop()
    server = FakeTelegram(token=TOKEN)
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    yield server
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture
def env(base_env: dict[str, str], fake: FakeTelegram, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {
        **base_env,
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake.base_url,
    }
    for key in list(os.environ):
        if key.startswith("SWITCHBOARD_"):
            monkeypatch.delenv(key)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def test_set_webhook_sends_the_secret_and_never_prints_it(
    env: dict[str, str], fake: FakeTelegram, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "https://bot.example.com/webhooks/telegram"
    assert main(["telegram", "set-webhook", url]) == 0
    assert fake.state.webhook == {"url": url, "secret_token": SECRET}
    assert main(["telegram", "webhook-info"]) == 0
    out = capsys.readouterr()
    assert url in out.out and SECRET not in out.out + out.err and TOKEN not in out.out + out.err
    assert main(["telegram", "delete-webhook"]) == 0
    assert fake.state.webhook == {}
    assert [c.method for c in fake.calls] == ["setWebhook", "getWebhookInfo", "deleteWebhook"]


def test_set_webhook_without_a_secret_or_url_or_account_says_what_to_do(
    env: dict[str, str], fake: FakeTelegram, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit):
        main(["telegram", "set-webhook"])
    assert "needs the URL" in capsys.readouterr().err
    assert main(["telegram", "webhook-info", "--account", "support"]) == 2
    assert "no Telegram account 'support'" in capsys.readouterr().err
    monkeypatch.delenv("SWITCHBOARD_TELEGRAM__SECRET_TOKEN")
    assert main(["telegram", "set-webhook", "https://bot.example.com/webhooks/telegram"]) == 2
    assert "SWITCHBOARD_TELEGRAM__SECRET_TOKEN" in capsys.readouterr().err
    assert fake.state.webhook == {} and fake.calls == []


def test_an_invalid_channel_variable_stops_every_command_naming_it(
    env: dict[str, str], fake: FakeTelegram, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_TELEGRAM__TRANSPORT", "carrier-pigeon")
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("switchboard: invalid configuration in the environment:\n")
    assert "  SWITCHBOARD_TELEGRAM__TRANSPORT: Input should be 'webhook' or 'polling'" in err
    monkeypatch.setenv("SWITCHBOARD_TELEGRAM__TRANSPORT", "polling")
    monkeypatch.setenv("SWITCHBOARD_TELEGRAM__TRANSPOTR", "polling")  # a typo in a channel's block is refused too
    assert main(["telegram", "webhook-info"]) == 2
    assert "SWITCHBOARD_TELEGRAM__TRANSPOTR: Extra inputs are not permitted" in capsys.readouterr().err
    assert fake.calls == []
