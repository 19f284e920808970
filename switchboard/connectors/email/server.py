"""The email connector as an MCP server (official SDK): ``search_mail`` and ``read_mail`` read, ``send_mail`` writes.

Run as ``python -m switchboard.connectors.email`` over stdio, configured by ``EMAIL_*`` variables
(:class:`~switchboard.connectors.email.settings.MailSettings`). The blocking IMAP and SMTP clients run in threads. What
a message says is the sender's text, returned as data; the client marks it untrusted and policy, not the model,
decides whether a send goes out.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from switchboard.connectors.email.mailbox import Mailbox, MailError
from switchboard.connectors.email.outbox import Outbox
from switchboard.connectors.email.settings import MailSettings
from switchboard.egress.addresses import AddressGuard

__all__ = ["ADDRESS_PATTERN", "build_server"]

logger = logging.getLogger(__name__)

ADDRESS_PATTERN = r"^[^@\s<>(),;:\"\[\]\\]{1,64}@[A-Za-z0-9.-]{1,253}$"
"""A plain mail address (``name@example.com``): no display name, no list, nothing a header could be split on."""

Folder = Annotated[
    str, Field(pattern=r"^[\x20-\x7e]{1,200}$", description="The folder (mailbox), e.g. INBOX or Archive.")
]


def build_server(settings: MailSettings) -> MCPServer:
    """The MCP server for one mailbox."""
    guard = AddressGuard(settings.internal_networks)
    mailbox, outbox = Mailbox(settings, guard), Outbox(settings, guard)
    server = MCPServer("switchboard-email", instructions="Read and send mail of one mailbox.")

    @server.tool(
        description=(
            "Search a mail folder; the newest matching messages first (uid, from, to, subject, date, message_id, "
            "size, seen). Reading marks nothing as read."
        ),
        annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=True),
    )
    async def search_mail(
        folder: Folder = "INBOX",
        query: Annotated[
            str, Field(max_length=200, pattern=r"^[^\r\n]*$", description="Words anywhere in the message; empty: all.")
        ] = "",
        since: Annotated[dt.date | None, Field(description="Only messages on or after this day (YYYY-MM-DD).")] = None,
        limit: Annotated[int, Field(ge=1, le=50, description="Most messages returned.")] = 10,
    ) -> dict[str, Any]:
        try:
            found = await asyncio.to_thread(mailbox.search, folder, query, since, limit)
        except MailError as err:
            raise ToolError(str(err)) from None
        return {"folder": folder, "messages": found}

    @server.tool(
        description=(
            "Read one message by its uid: headers, the text of its body (capped) and its attachments listed by "
            "name, type and size (their content is not fetched)."
        ),
        annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=True),
    )
    async def read_mail(
        uid: Annotated[int, Field(ge=1, description="The message's uid, from search_mail.")],
        folder: Folder = "INBOX",
    ) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(mailbox.read, folder, uid)
        except MailError as err:
            raise ToolError(str(err)) from None

    @server.tool(
        description="Send a plain-text mail from this mailbox. A reply names the message it answers (in_reply_to).",
        annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False),
    )
    async def send_mail(
        to: Annotated[
            list[Annotated[str, Field(pattern=ADDRESS_PATTERN)]],
            Field(min_length=1, max_length=20, description="Recipients' addresses."),
        ],
        subject: Annotated[str, Field(min_length=1, max_length=300, pattern=r"^[^\r\n]*$")],
        body: Annotated[str, Field(max_length=100_000)],
        in_reply_to: Annotated[
            str | None,
            Field(pattern=r"^<[^<>\s]{1,250}>$", description="The Message-ID of the message answered."),
        ] = None,
    ) -> dict[str, Any]:
        try:
            sent = await asyncio.to_thread(outbox.send, to, subject, body, in_reply_to)
        except MailError as err:
            raise ToolError(str(err)) from None
        logger.info("mail sent to %d recipient(s)", len(sent["to"]))
        return sent

    return server
