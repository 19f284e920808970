"""① and ⑤ for Facebook Messenger: a Page's conversations through the Messenger Platform (webhooks + Send API).

One app's webhook URL (``/webhooks/messenger``) serves every Page of the app: each message is routed to the
account whose ``page_id`` is the delivery's ``entry[].id`` (see :mod:`~switchboard.channels.meta.messaging.adapter`,
which
also holds what Instagram shares). Replies are plain text within 2,000 characters, choices are quick replies,
files are uploaded with the message, and the typing indicator is ``sender_action: typing_on``.
"""

from __future__ import annotations

from switchboard.channels.base import Capabilities, Rate
from switchboard.channels.meta.messaging.adapter import MessagingAccount, MessagingAdapter
from switchboard.channels.meta.messaging.outbound import MAX_QUICK_REPLIES, QUICK_REPLY_TITLE
from switchboard.channels.meta.messenger.settings import MessengerSettings
from switchboard.channels.meta.webhook import secret_bytes
from switchboard.channels.registry import BuildContext
from switchboard.settings.channels import secure_endpoint

__all__ = ["CAPABILITIES", "MessengerChannel", "account_config", "problems"]

CAPABILITIES = Capabilities(
    max_text=2000,
    text_unit="chars",
    edits=False,
    streaming="none",
    buttons=MAX_QUICK_REPLIES,
    button_label=QUICK_REPLY_TITLE,
    files=True,
    typing=True,
    typing_refresh_s=15.0,
    bot_rate=Rate(300.0, 100),
    chat_rate=Rate(1.0, 5),
)
"""Plain text up to 2,000 characters, no edits (final reply only), 13 quick replies of 20 characters, uploads,
typing (cleared by Messenger after 20 s), 300 Send API calls a second per Page."""


class MessengerChannel(MessagingAdapter):
    """One Facebook Page.

    Args:
        settings: The account's ``SWITCHBOARD_MESSENGER__*`` block.
        context: Its account name, route, and the other accounts of the channel (``BuildContext``).
    """

    def __init__(self, settings: MessengerSettings, context: BuildContext | None = None) -> None:
        context = context or BuildContext()
        siblings = {
            name: account_config(block, BuildContext(account=name))
            for name, block in context.accounts.items()
            if isinstance(block, MessengerSettings)
        }
        super().__init__(account_config(settings, context), siblings, CAPABILITIES)


def account_config(settings: MessengerSettings, context: BuildContext) -> MessagingAccount:
    """What the shared adapter needs of one account's block."""
    return MessagingAccount(
        channel="messenger",
        account=context.account,
        token=settings.page_access_token.get_secret_value() if settings.page_access_token else None,
        app_secret=secret_bytes(settings.app_secret),
        verify_token=secret_bytes(settings.verify_token),
        graph_base_url=settings.graph_base_url,
        platform_id=settings.page_id or None,
        human_agent=settings.human_agent,
        agent=context.agent,
        tenant=context.tenant,
    )


def problems(settings: MessengerSettings) -> list[str]:
    """What keeps a Page from working, and how to fix it (``switchboard check``)."""
    found = []
    if settings.app_secret is None:
        found.append(
            "no app secret: set SWITCHBOARD_MESSENGER__APP_SECRET (App Dashboard → App settings → Basic → App secret); "
            "every webhook delivery is refused until it is set"
        )
    if settings.verify_token is None:
        found.append(
            "no verify token: set SWITCHBOARD_MESSENGER__VERIFY_TOKEN to the string typed in the App Dashboard "
            "(Messenger → Webhooks → Verify token); the subscription handshake is refused until it is set"
        )
    if not secure_endpoint(settings.graph_base_url):
        found.append("SWITCHBOARD_MESSENGER__GRAPH_BASE_URL must be https (like https://graph.facebook.com/v23.0)")
    if settings.page_id and not settings.page_id.isdigit():
        found.append("page_id must be the Page's numeric id (Page → About → Page transparency, or GET /me)")
    return found
