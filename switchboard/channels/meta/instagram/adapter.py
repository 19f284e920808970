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

from switchboard.channels.base import Capabilities, Rate
from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.messaging.adapter import MessagingAccount, MessagingAdapter
from switchboard.channels.meta.messaging.outbound import MAX_QUICK_REPLIES, QUICK_REPLY_TITLE
from switchboard.channels.meta.webhook import secret_bytes
from switchboard.channels.registry import BuildContext
from switchboard.settings.channels import secure_endpoint

__all__ = ["CAPABILITIES", "InstagramChannel", "account_config", "problems"]

INSTAGRAM_GRAPH_HOST = "graph.instagram.com"
"""The Graph host of "Instagram API with Instagram Login" apps (Instagram user tokens)."""

CAPABILITIES = Capabilities(
    max_text=1000,
    text_unit="bytes",
    edits=False,
    streaming="none",
    buttons=MAX_QUICK_REPLIES,
    button_label=QUICK_REPLY_TITLE,
    files=False,
    typing=True,
    typing_refresh_s=15.0,
    bot_rate=Rate(300.0, 100),
    chat_rate=Rate(1.0, 5),
)
"""Plain text up to 1,000 UTF-8 bytes, no edits (final reply only), 13 quick replies of 20 characters, no
uploads, typing, 300 Send API calls a second per account."""


class InstagramChannel(MessagingAdapter):
    """One Instagram professional account.

    Args:
        settings: The account's ``SWITCHBOARD_INSTAGRAM__*`` block.
        context: Its account name, route, and the other accounts of the channel (``BuildContext``).
    """

    def __init__(self, settings: InstagramSettings, context: BuildContext | None = None) -> None:
        context = context or BuildContext()
        siblings = {
            name: account_config(block, BuildContext(account=name))
            for name, block in context.accounts.items()
            if isinstance(block, InstagramSettings)
        }
        super().__init__(account_config(settings, context), siblings, CAPABILITIES)

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


def account_config(settings: InstagramSettings, context: BuildContext) -> MessagingAccount:
    """What the shared adapter needs of one account's block."""
    return MessagingAccount(
        channel="instagram",
        account=context.account,
        token=settings.access_token.get_secret_value() if settings.access_token else None,
        app_secret=secret_bytes(settings.app_secret),
        verify_token=secret_bytes(settings.verify_token),
        graph_base_url=settings.graph_base_url,
        platform_id=settings.account_id or None,
        human_agent=settings.human_agent,
        agent=context.agent,
        tenant=context.tenant,
    )


def problems(settings: InstagramSettings) -> list[str]:
    """What keeps an account from working, and how to fix it (``switchboard check``)."""
    found = []
    if settings.app_secret is None:
        found.append(
            "no app secret: set SWITCHBOARD_INSTAGRAM__APP_SECRET (the Meta app's secret, or the Instagram app "
            "secret for Instagram Login); every webhook delivery is refused until it is set"
        )
    if settings.verify_token is None:
        found.append(
            "no verify token: set SWITCHBOARD_INSTAGRAM__VERIFY_TOKEN to the string typed in the App Dashboard's "
            "webhook settings; the subscription handshake is refused until it is set"
        )
    if not secure_endpoint(settings.graph_base_url):
        found.append(
            "SWITCHBOARD_INSTAGRAM__GRAPH_BASE_URL must be https (https://graph.facebook.com/v23.0, or "
            "https://graph.instagram.com/v23.0 for Instagram Login)"
        )
    if settings.account_id and not settings.account_id.isdigit():
        found.append("account_id must be the Instagram professional account's numeric id (GET /me)")
    return found
