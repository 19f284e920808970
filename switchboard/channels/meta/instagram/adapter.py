"""① and ⑤ for Instagram: a professional account's direct messages through the Messenger Platform.

Works with both flavours of Meta's API: "Instagram API with Facebook Login" (a Page access token, Graph base
``https://graph.facebook.com/v23.0``) and "with Instagram Login" (an Instagram user token, Graph base
``https://graph.instagram.com/v23.0``): sends go to ``POST /me/messages``, which both understand. One app's webhook
URL (``/webhooks/instagram``) serves every account: a message is routed to the account whose ``account_id`` is
the delivery's ``entry[].id`` (see :mod:`~switchboard.channels.meta.messaging.adapter`). Replies are plain text within
1,000
UTF-8 bytes; choices are quick replies; a workspace file is named in text (the Send API takes media by public URL
only).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.messaging import adapter as messaging
from switchboard.channels.registry import BuildContext

__all__ = ["CAPABILITIES", "InstagramChannel", "account_config", "problems"]

INSTAGRAM_GRAPH_HOST = "graph.instagram.com"
"""The Graph host of "Instagram API with Instagram Login" apps (Instagram user tokens)."""

CAPABILITIES = messaging.platform_capabilities(1000, "bytes", files=False)
"""Plain text up to 1,000 UTF-8 bytes, no edits (final reply only), 13 quick replies of 20 characters, no
uploads, typing, 300 Send API calls a second per account."""


class InstagramChannel(messaging.MessagingAdapter):
    """One Instagram professional account.

    Args:
        settings: The account's ``SWITCHBOARD_INSTAGRAM__*`` block.
        context: Its account name, route, and the other accounts of the channel (``BuildContext``).
    """

    def __init__(self, settings: InstagramSettings, context: BuildContext | None = None) -> None:
        super().__init__(*messaging.account_configs(settings, context, account_config), CAPABILITIES)

    def id_query(self, graph_base_url: str) -> str:
        """Instagram Login: ``me?fields=user_id``; Facebook Login (a Page token): the Page's linked account."""
        if urlsplit(graph_base_url).hostname == INSTAGRAM_GRAPH_HOST:
            return "me?fields=user_id"
        return "me?fields=instagram_business_account"

    def id_in(self, answer: dict[str, Any]) -> str | None:
        """The professional account id (``user_id``, or ``instagram_business_account.id``)."""
        linked = answer.get("instagram_business_account")
        found = linked.get("id") if isinstance(linked, dict) else answer.get("user_id")
        return str(found) if isinstance(found, str | int) and not isinstance(found, bool) and found else None


def account_config(settings: InstagramSettings, context: BuildContext) -> messaging.MessagingAccount:
    """What the shared adapter needs of one account's block."""
    return messaging.platform_account(
        "instagram", settings, context, token=settings.access_token, platform_id=settings.account_id
    )


def problems(settings: InstagramSettings) -> list[str]:
    """What keeps an account from working, and how to fix it (``switchboard check``)."""
    return messaging.block_problems(
        settings,
        "SWITCHBOARD_INSTAGRAM",
        (settings.account_id, "account_id must be the Instagram professional account's numeric id (GET /me)"),
        app_key="the Meta app's secret, or the Instagram app secret for Instagram Login",
        verify="the App Dashboard's webhook settings",
        https="https://graph.facebook.com/v23.0, or https://graph.instagram.com/v23.0 for Instagram Login",
    )
