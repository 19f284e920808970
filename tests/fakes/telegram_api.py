"""The fake Telegram Bot API for tests: the one shipped in the package (``switchboard simulate`` uses it too)."""

from switchboard.fakes.telegram import (
    FAKE_STATE,
    SECRET_HEADER,
    FakeCall,
    FakeTelegram,
    FakeTelegramState,
    check_html,
    create_fake_telegram,
    make_update,
    sign_update,
)

__all__ = [
    "FAKE_STATE",
    "SECRET_HEADER",
    "FakeCall",
    "FakeTelegram",
    "FakeTelegramState",
    "check_html",
    "create_fake_telegram",
    "make_update",
    "sign_update",
]
