"""Sending mail over SMTP: one message, one connection, one attempt (a send is never repeated here).

The message gets its own ``Message-ID`` before it is sent, so the caller can tell it apart from any other; headers
refuse line breaks (no header injection), recipients are plain addresses.
"""

from __future__ import annotations

import email.utils
import smtplib
from email.message import EmailMessage
from typing import Any

from switchboard.connectors.email.mailbox import MailError
from switchboard.connectors.email.network import Smtp, SmtpTls, tls_context
from switchboard.connectors.email.settings import MailSettings
from switchboard.egress.addresses import AddressGuard

__all__ = ["Outbox"]


class Outbox:
    """One account's SMTP side."""

    def __init__(self, settings: MailSettings, guard: AddressGuard) -> None:
        self.settings = settings
        self.guard = guard

    def _connect(self) -> smtplib.SMTP:
        s = self.settings
        try:
            if s.smtp_tls == "tls":
                smtp: smtplib.SMTP = SmtpTls(s.smtp_host, s.smtp_port, self.guard, tls_context(s), s.timeout_s)
            else:
                smtp = Smtp(s.smtp_host, s.smtp_port, self.guard, s.smtp_tls, s.timeout_s)
                if s.smtp_tls == "starttls":
                    smtp.starttls(context=tls_context(s))
        except (OSError, smtplib.SMTPException) as exc:
            raise MailError(f"the SMTP server {s.smtp_host} could not be reached: {_reason(exc)}") from None
        try:
            smtp.ehlo_or_helo_if_needed()
            if smtp.has_extn("auth"):
                smtp.login(s.username, s.password.get_secret_value())
        except (OSError, smtplib.SMTPException):
            _close(smtp)
            raise MailError(f"the SMTP server {s.smtp_host} refused the login of {s.username}") from None
        return smtp

    def message(self, to: list[str], subject: str, body: str, in_reply_to: str | None) -> EmailMessage:
        """The message as it will be sent.

        Raises:
            MailError: a header would carry a line break.
        """
        message = EmailMessage()
        try:
            message["From"] = self.settings.sender
            message["To"] = ", ".join(to)
            message["Subject"] = subject
            message["Date"] = email.utils.formatdate(localtime=False)
            domain = self.settings.sender.rpartition("@")[2] or "localhost"
            message["Message-ID"] = email.utils.make_msgid(domain=domain)
            if in_reply_to:
                message["In-Reply-To"] = in_reply_to
                message["References"] = in_reply_to
        except ValueError as err:
            raise MailError(f"the message cannot be built: {err}") from None
        message.set_content(body)
        return message

    def send(self, to: list[str], subject: str, body: str, in_reply_to: str | None) -> dict[str, Any]:
        """Send one message; what the server accepted.

        Raises:
            MailError: nothing was sent (unreachable, login refused, every recipient refused).
        """
        message = self.message(to, subject, body, in_reply_to)
        smtp = self._connect()
        try:
            refused = smtp.send_message(message, from_addr=self.settings.sender, to_addrs=to)
        except smtplib.SMTPRecipientsRefused:
            raise MailError("the SMTP server refused every recipient") from None
        except (OSError, smtplib.SMTPException) as exc:
            raise MailError(f"the SMTP server did not take the message: {_reason(exc)}") from None
        finally:
            _close(smtp)
        return {
            "message_id": message["Message-ID"],
            "to": [address for address in to if address not in refused],
            "refused": sorted(refused),
        }


def _reason(exc: BaseException) -> str:
    if isinstance(exc, smtplib.SMTPResponseException):
        return f"{exc.smtp_code}"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return type(exc).__name__


def _close(smtp: smtplib.SMTP) -> None:
    try:
        smtp.quit()
    except (OSError, smtplib.SMTPException):
        smtp.close()
