"""① and ⑤ for Facebook Messenger: a Page's conversations through the Messenger Platform (webhooks + Send API).

One app's webhook URL (``/webhooks/messenger``) serves every Page of the app: each message is routed to the
account whose ``page_id`` is the delivery's ``entry[].id`` (see :mod:`~switchboard.channels.meta.messaging.adapter`,
which
also holds what Instagram shares). Replies are plain text within 2,000 characters, choices are quick replies,
files are uploaded with the message, and the typing indicator is ``sender_action: typing_on``.
"""

from __future__ import annotations

from switchboard.channels.meta.messaging import adapter as messaging
from switchboard.channels.meta.messenger.settings import MessengerSettings
from switchboard.channels.registry import BuildContext

__all__ = ["CAPABILITIES", "MessengerChannel", "account_config", "problems"]

CAPABILITIES = messaging.platform_capabilities(2000, "chars", files=True)
"""Plain text up to 2,000 characters, no edits (final reply only), 13 quick replies of 20 characters, uploads,
typing (cleared by Messenger after 20 s), 300 Send API calls a second per Page."""


class MessengerChannel(messaging.MessagingAdapter):
    """One Facebook Page.

    Args:
        settings: The account's ``SWITCHBOARD_MESSENGER__*`` block.
        context: Its account name, route, and the other accounts of the channel (``BuildContext``).
    """

    def __init__(self, settings: MessengerSettings, context: BuildContext | None = None) -> None:
        super().__init__(*messaging.account_configs(settings, context, account_config), CAPABILITIES)


def account_config(settings: MessengerSettings, context: BuildContext) -> messaging.MessagingAccount:
    """What the shared adapter needs of one account's block."""
    return messaging.platform_account(
        "messenger", settings, context, token=settings.page_access_token, platform_id=settings.page_id
    )


def problems(settings: MessengerSettings) -> list[str]:
    """What keeps a Page from working, and how to fix it (``switchboard check``)."""
    return messaging.block_problems(
        settings,
        "SWITCHBOARD_MESSENGER",
        (settings.page_id, "page_id must be the Page's numeric id (Page → About → Page transparency, or GET /me)"),
        app_key="App Dashboard → App settings → Basic → App secret",
        verify="the App Dashboard (Messenger → Webhooks → Verify token)",
        https="like https://graph.facebook.com/v23.0",
    )
