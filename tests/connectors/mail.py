"""Real mail servers for the tests: Dovecot (IMAP, Debian's ``dovecot-imapd``) and ``aiosmtpd`` (SMTP).

Dovecot runs from a generated configuration in a temporary folder, on unprivileged loopback ports, with its users in a
password file the tests write; it offers STARTTLS on its IMAP port and TLS on its IMAPS port with a certificate from a
test CA. ``aiosmtpd`` requires STARTTLS and a login, and records every message it takes. Skips when Dovecot is not
installed.
"""

from __future__ import annotations

import asyncio
import imaplib
import os
import pwd
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP as SmtpProtocol
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session

from switchboard.egress.ca import DeploymentCA

__all__ = ["Dovecot", "MailAccount", "SmtpServer", "dovecot", "free_port", "mail_account", "mail_ca", "smtp_server"]

DOVECOT = shutil.which("dovecot") or "/usr/sbin/dovecot"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(port: int, process: subprocess.Popen[bytes] | None = None, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port}") from None
            time.sleep(0.05)


@pytest.fixture(scope="session")
def mail_ca(tmp_path_factory: pytest.TempPathFactory) -> DeploymentCA:
    """A CA whose certificate the connector trusts (``EMAIL_CA_FILE``), and that signs the servers' certificates."""
    return DeploymentCA.load_or_create(tmp_path_factory.mktemp("mail") / "ca")


@dataclass(frozen=True)
class MailAccount:
    """One mailbox on the Dovecot server."""

    username: str
    password: str


@dataclass
class Dovecot:
    """A running Dovecot: ``imap_port`` (plain, STARTTLS offered) and ``imaps_port`` (TLS)."""

    root: Path
    imap_port: int
    imaps_port: int
    users: Path
    accounts: dict[str, MailAccount] = field(default_factory=dict)

    def account(self) -> MailAccount:
        """A new user with a fresh, random password (its mailbox is created at its first login)."""
        account = MailAccount(f"user{secrets.token_hex(4)}@example.test", "pw-" + secrets.token_urlsafe(16))
        entry = self.users / account.username  # a file per user: Dovecot reads a changed shared file once a second
        entry.write_text(f"{account.username}:{{PLAIN}}{account.password}::::::\n")
        entry.chmod(0o644)
        self.accounts[account.username] = account
        return account

    def append(self, account: MailAccount, message: bytes, folder: str = "INBOX") -> int:
        """Store ``message`` in a folder of ``account`` with IMAP APPEND (over STARTTLS); its uid."""
        with imaplib.IMAP4("127.0.0.1", self.imap_port, timeout=30) as imap:
            imap.starttls(ssl.create_default_context(cafile=str(self.ca_file)))
            imap.login(account.username, account.password)
            if folder != "INBOX":
                imap.create(folder)
            status, data = imap.append(folder, None, None, message)
            assert status == "OK", data
            found = re.search(rb"APPENDUID \d+ (\d+)", data[0] or b"")
            assert found is not None, data
            return int(found.group(1))

    def sessions(self, account: MailAccount) -> list[dict[str, int]]:
        """Each finished IMAP session of ``account``, as Dovecot logged it: bytes in and out."""
        log = (self.root / "dovecot.log").read_text(errors="replace")
        pattern = rf"imap\({re.escape(account.username)}\).*?Disconnected: Logged out in=(\d+) out=(\d+)"
        return [{"in": int(a), "out": int(b)} for a, b in re.findall(pattern, log)]

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"


def _dovecot_conf(root: Path, imap_port: int, imaps_port: int, cert: Path, key: Path) -> str:
    if os.geteuid() == 0:  # the mail processes run as nobody; the login and internal users are the package's
        uid, gid, users = 65534, 65534, ""
    else:  # a developer's machine: every process runs as the user running the tests
        me = pwd.getpwuid(os.geteuid()).pw_name
        uid, gid = os.geteuid(), os.getegid()
        users = f"default_login_user = {me}\ndefault_internal_user = {me}\ndefault_internal_group = {me}\n"
    return f"""\
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
protocols = imap
listen = 127.0.0.1
{users}first_valid_uid = 1
ssl = yes
ssl_cert = <{cert}
ssl_key = <{key}
disable_plaintext_auth = no
auth_mechanisms = plain login
passdb {{
  driver = passwd-file
  args = scheme=PLAIN {root}/users/%u
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={root}/home/%u
}}
mail_location = maildir:~/Maildir
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {imap_port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {imaps_port}
    ssl = yes
  }}
}}
service stats {{
  unix_listener stats-reader {{
    mode = 0666
  }}
  unix_listener stats-writer {{
    mode = 0666
  }}
}}
"""


@pytest.fixture(scope="session")
def dovecot(mail_ca: DeploymentCA) -> Iterator[Dovecot]:
    """A Dovecot IMAP server for the session (new users per test: :meth:`Dovecot.account`)."""
    if not Path(DOVECOT).exists():
        pytest.skip("Dovecot is not installed (Debian: apt-get install dovecot-imapd)")
    root = Path(tempfile.mkdtemp(prefix="sb-dovecot-"))
    root.chmod(0o755)
    (root / "run").mkdir()
    (root / "state").mkdir()
    (root / "home").mkdir(mode=0o777)
    (root / "home").chmod(0o777)
    cert, key = mail_ca.issue("127.0.0.1")
    (root / "cert.pem").write_bytes(cert)
    (root / "key.pem").write_bytes(key)
    (root / "key.pem").chmod(0o600)
    shutil.copy(mail_ca.cert_path, root / "ca.pem")
    users = root / "users"
    users.mkdir(mode=0o755)
    imap_port, imaps_port = free_port(), free_port()
    (root / "dovecot.conf").write_text(_dovecot_conf(root, imap_port, imaps_port, root / "cert.pem", root / "key.pem"))
    process = subprocess.Popen(
        [DOVECOT, "-F", "-c", str(root / "dovecot.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _wait_for(imap_port, process)
        _wait_for(imaps_port, process)
        yield Dovecot(root, imap_port, imaps_port, users)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Received:
    """One message aiosmtpd took: the envelope, the raw content and who had logged in."""

    mail_from: str
    rcpt_tos: list[str]
    content: bytes
    login: str | None
    tls: bool


@dataclass
class SmtpServer:
    """A running aiosmtpd: what it received, the account it accepts; it delivers to Dovecot's users it knows."""

    port: int
    account: MailAccount
    dovecot: Dovecot
    received: list[Received] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)
    """Every login tried: (username, password) as the server saw them."""


class _Recorder:
    def __init__(self, server: SmtpServer) -> None:
        self.server = server

    async def handle_DATA(self, smtp: SmtpProtocol, session: Session, envelope: Envelope) -> str:
        login = session.auth_data.login.decode() if isinstance(session.auth_data, LoginPassword) else None
        content = envelope.original_content or b""
        self.server.received.append(
            Received(str(envelope.mail_from), list(envelope.rcpt_tos), content, login, session.ssl is not None)
        )
        for rcpt in envelope.rcpt_tos:  # the local delivery an MTA would make
            known = self.server.dovecot.accounts.get(rcpt)
            if known is not None:
                await asyncio.to_thread(self.server.dovecot.append, known, content)
        return "250 OK"


@pytest.fixture
def mail_account(dovecot: Dovecot) -> MailAccount:
    """A fresh mailbox: its IMAP login is also the SMTP server's."""
    return dovecot.account()


@pytest.fixture
def smtp_server(mail_ca: DeploymentCA, dovecot: Dovecot, mail_account: MailAccount) -> Iterator[SmtpServer]:
    """An SMTP server on a free loopback port that requires STARTTLS and a login (``mail_account``'s)."""
    account = mail_account
    server = SmtpServer(free_port(), account, dovecot)

    def authenticate(smtp: Any, session: Session, envelope: Envelope, mechanism: str, data: Any) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        user, password = data.login.decode(), data.password.decode()
        server.logins.append((user, password))
        return AuthResult(success=(user, password) == (account.username, account.password), auth_data=data)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert, key = mail_ca.issue("127.0.0.1")
    with tempfile.NamedTemporaryFile(suffix=".pem") as pem:
        pem.write(cert + key)
        pem.flush()
        context.load_cert_chain(pem.name)
    controller = Controller(
        _Recorder(server),
        hostname="127.0.0.1",
        port=server.port,
        tls_context=context,
        require_starttls=True,
        authenticator=authenticate,
        auth_required=True,
    )
    controller.start()
    try:
        yield server
    finally:
        controller.stop()
