"""Fixtures over the real local mail servers of :mod:`switchboard.fakes.mail` (Dovecot and aiosmtpd).

Dovecot runs once per session (a new user per test); aiosmtpd per test, accepting that user's login. Skips when
Dovecot is not installed.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.egress.ca import DeploymentCA
from switchboard.fakes.mail import DOVECOT, Dovecot, MailAccount, SmtpServer

__all__ = ["Dovecot", "MailAccount", "SmtpServer", "dovecot", "mail_account", "mail_ca", "smtp_server"]


@pytest.fixture(scope="session")
def mail_ca(tmp_path_factory: pytest.TempPathFactory) -> DeploymentCA:
    """A CA whose certificate the connector trusts (``EMAIL_CA_FILE``), and that signs the servers' certificates."""
    return DeploymentCA.load_or_create(tmp_path_factory.mktemp("mail") / "ca")


@pytest.fixture(scope="session")
def dovecot(mail_ca: DeploymentCA) -> Iterator[Dovecot]:
    """A Dovecot IMAP server for the session (new users per test: :meth:`Dovecot.account`)."""
    if not Path(DOVECOT).exists():
        pytest.skip("Dovecot is not installed (Debian: apt-get install dovecot-imapd)")
    root = Path(tempfile.mkdtemp(prefix="sb-dovecot-"))
    server = Dovecot.start(root, mail_ca)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def mail_account(dovecot: Dovecot) -> MailAccount:
    """A fresh mailbox: its IMAP login is also the SMTP server's."""
    return dovecot.account()


@pytest.fixture
def smtp_server(mail_ca: DeploymentCA, dovecot: Dovecot, mail_account: MailAccount) -> Iterator[SmtpServer]:
    """An SMTP server on a free loopback port that requires STARTTLS and ``mail_account``'s login."""
    server = SmtpServer.start(mail_account, dovecot, mail_ca)
    try:
        yield server
    finally:
        server.stop()
