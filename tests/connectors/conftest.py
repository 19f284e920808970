"""Fixtures: real mail servers (Dovecot, aiosmtpd) and the queue's (a real Redis) for the approval flow."""

from __future__ import annotations

from tests.connectors.mail import dovecot, mail_account, mail_ca, smtp_server
from tests.queue.conftest import client, ingestor, queue_settings

__all__ = ["client", "dovecot", "ingestor", "mail_account", "mail_ca", "queue_settings", "smtp_server"]
