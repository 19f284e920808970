"""Real local mail servers for tests and demos: Dovecot (IMAP) and aiosmtpd (SMTP), on loopback, over TLS.

Dovecot (Debian's ``dovecot-imapd``) runs from a generated configuration in a folder of its own, on unprivileged
ports, with one password file per user; it offers STARTTLS on its IMAP port and TLS on its IMAPS port, under a
certificate for ``127.0.0.1`` from a CA kept in the folder. aiosmtpd (``pip install aiosmtpd``) requires STARTTLS and
a login, records what it takes and delivers it to the recipients' Dovecot mailboxes, as an MTA would.

``python -m switchboard.fakes.mail --dir DIR`` runs both for a demo and prints the settings of the email pack.
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP as SmtpProtocol
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session

from switchboard.egress.ca import DeploymentCA

__all__ = ["DOVECOT", "Dovecot", "MailAccount", "Received", "SmtpServer", "free_port"]

DOVECOT = shutil.which("dovecot") or "/usr/sbin/dovecot"


def free_port() -> int:
    """A TCP port free on loopback now."""
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


@dataclass(frozen=True)
class MailAccount:
    """One mailbox: its login and password (IMAP and SMTP alike)."""

    username: str
    password: str


def _dovecot_conf(root: Path, imap_port: int, imaps_port: int) -> str:
    if os.geteuid() == 0:  # the mail processes run as nobody; the login and internal users are the package's
        uid, gid, users = 65534, 65534, ""
    else:  # every process runs as the user who started it
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
ssl_cert = <{root}/cert.pem
ssl_key = <{root}/key.pem
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


@dataclass
class Dovecot:
    """A running Dovecot under ``root``: ``imap_port`` (STARTTLS offered) and ``imaps_port`` (TLS)."""

    root: Path
    imap_port: int
    imaps_port: int
    process: subprocess.Popen[bytes] | None = None
    accounts: dict[str, MailAccount] = field(default_factory=dict)

    @classmethod
    def start(cls, root: Path, ca: DeploymentCA, *, imaps_port: int = 0) -> Dovecot:
        """Configure and start Dovecot in ``root`` (a new folder), its certificate signed by ``ca``; port 0: a free one.

        Raises:
            FileNotFoundError: Dovecot is not installed.
            RuntimeError: it did not start.
        """
        if not Path(DOVECOT).exists():
            raise FileNotFoundError("Dovecot is not installed (Debian: apt-get install dovecot-imapd)")
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        for folder, mode in (("run", 0o755), ("state", 0o755), ("users", 0o755), ("home", 0o777)):
            (root / folder).mkdir(exist_ok=True)
            (root / folder).chmod(mode)
        cert, key = ca.issue("127.0.0.1")
        (root / "cert.pem").write_bytes(cert)
        (root / "key.pem").write_bytes(key)
        (root / "key.pem").chmod(0o600)
        shutil.copy(ca.cert_path, root / "ca.pem")
        imap_port, imaps_port = free_port(), imaps_port or free_port()
        (root / "dovecot.conf").write_text(_dovecot_conf(root, imap_port, imaps_port))
        config = str(root / "dovecot.conf")
        process = subprocess.Popen([DOVECOT, "-F", "-c", config], stdout=subprocess.DEVNULL)  # noqa: S603 - our own config
        started = cls(root, imap_port, imaps_port, process)
        try:
            _wait_for(imap_port, process)
            _wait_for(imaps_port, process)
        except RuntimeError:
            started.stop()
            raise
        return started

    def stop(self) -> None:
        """Stop the server (its folder stays)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    @property
    def ca_file(self) -> Path:
        """The CA certificate a client trusts for this server (PEM)."""
        return self.root / "ca.pem"

    def account(self, username: str | None = None, password: str | None = None) -> MailAccount:
        """A user (a random one by default); its mailbox is created at its first login."""
        account = MailAccount(
            username or f"user{secrets.token_hex(4)}@example.test", password or "pw-" + secrets.token_urlsafe(16)
        )
        entry = self.root / "users" / account.username  # a file per user: a changed shared file is reread slowly
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
            found = re.search(rb"APPENDUID \d+ (\d+)", data[0] or b"") if status == "OK" else None
            if found is None:
                raise RuntimeError(f"APPEND refused: {data!r}")
            return int(found.group(1))

    def sessions(self, account: MailAccount) -> list[dict[str, int]]:
        """Each finished IMAP session of ``account``, as Dovecot logged it: bytes in and out."""
        log = (self.root / "dovecot.log").read_text(errors="replace")
        pattern = rf"imap\({re.escape(account.username)}\).*?Disconnected: Logged out in=(\d+) out=(\d+)"
        return [{"in": int(a), "out": int(b)} for a, b in re.findall(pattern, log)]


@dataclass
class Received:
    """One message aiosmtpd took: the envelope, the raw content, who had logged in, and whether over TLS."""

    mail_from: str
    rcpt_tos: list[str]
    content: bytes
    login: str | None
    tls: bool


@dataclass
class SmtpServer:
    """A running aiosmtpd that accepts ``account``'s login and delivers to the Dovecot users it knows."""

    port: int
    account: MailAccount
    dovecot: Dovecot
    received: list[Received] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)
    """Every login tried: (username, password) as the server saw them."""
    controller: Controller | None = None
    echo: bool = False
    """Print a line for each message taken (the demo)."""

    @classmethod
    def start(cls, account: MailAccount, dovecot: Dovecot, ca: DeploymentCA, port: int = 0) -> SmtpServer:
        """Serve on ``port`` (0: a free one) with a certificate for ``127.0.0.1`` signed by ``ca``."""
        server = cls(port or free_port(), account, dovecot)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cert, key = ca.issue("127.0.0.1")
        pem = dovecot.root / f"smtp-{server.port}.pem"
        pem.write_bytes(cert + key)
        pem.chmod(0o600)
        context.load_cert_chain(pem)
        server.controller = Controller(
            _Recorder(server),
            hostname="127.0.0.1",
            port=server.port,
            tls_context=context,
            require_starttls=True,
            authenticator=server._authenticate,
            auth_required=True,
        )
        server.controller.start()
        return server

    def stop(self) -> None:
        """Stop serving."""
        if self.controller is not None:
            self.controller.stop()

    def _authenticate(self, smtp: Any, session: Session, envelope: Envelope, mechanism: str, data: Any) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        user, password = data.login.decode(), data.password.decode()
        self.logins.append((user, password))
        return AuthResult(success=(user, password) == (self.account.username, self.account.password), auth_data=data)


class _Recorder:
    def __init__(self, server: SmtpServer) -> None:
        self.server = server

    async def handle_DATA(self, smtp: SmtpProtocol, session: Session, envelope: Envelope) -> str:
        login = session.auth_data.login.decode() if isinstance(session.auth_data, LoginPassword) else None
        content = envelope.original_content or b""
        self.server.received.append(
            Received(str(envelope.mail_from), list(envelope.rcpt_tos), content, login, session.ssl is not None)
        )
        if self.server.echo:
            subject = next((line for line in content.splitlines() if line.lower().startswith(b"subject:")), b"")
            print(
                f"SMTP took a message from {envelope.mail_from} to {', '.join(envelope.rcpt_tos)}: {subject.decode()}",
                flush=True,
            )
        for rcpt in envelope.rcpt_tos:  # the local delivery an MTA would make
            known = self.server.dovecot.accounts.get(rcpt)
            if known is not None:
                await asyncio.to_thread(self.server.dovecot.append, known, content)
        return "250 OK"


def main(argv: list[str] | None = None) -> None:
    """Run Dovecot and aiosmtpd for one mailbox until interrupted, and print the email pack's settings."""
    import argparse
    import logging
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped like Ctrl-C: the servers stop too
    logging.getLogger("mail.log").setLevel(logging.ERROR)  # aiosmtpd's own notices
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, required=True, help="a folder for the servers' files (created)")
    parser.add_argument("--user", default="support@example.test")
    parser.add_argument("--password", default="dev-password")
    parser.add_argument("--imap-port", type=int, default=8993, help="IMAP over TLS")
    parser.add_argument("--smtp-port", type=int, default=8025, help="SMTP with STARTTLS")
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    ca = DeploymentCA.load_or_create(root / "ca")
    dovecot = Dovecot.start(root / "dovecot", ca, imaps_port=args.imap_port)
    account = dovecot.account(args.user, args.password)
    smtp = SmtpServer.start(account, dovecot, ca, args.smtp_port)
    smtp.echo = True
    dovecot.append(
        account,
        b"From: Ann <ann@example.test>\r\nTo: " + account.username.encode() + b"\r\nSubject: Where is my parcel?\r\n"
        b"Message-ID: <parcel-1@example.test>\r\n\r\nHello, order 77 has not arrived yet. Ann\r\n",
    )
    print(f"IMAP (TLS) on 127.0.0.1:{dovecot.imaps_port}, SMTP (STARTTLS) on 127.0.0.1:{smtp.port}", flush=True)
    print(f"mailbox {account.username}, password {account.password!r}, one message in INBOX")
    print(
        "email pack settings: "
        f"{{imap_host: 127.0.0.1, imap_port: {dovecot.imaps_port}, smtp_host: 127.0.0.1, smtp_port: {smtp.port}, "
        f"username: {account.username}, password: MAIL_PASSWORD, internal_networks: 127.0.0.0/8, "
        f"ca_file: {dovecot.ca_file}}}",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        smtp.stop()
        dovecot.stop()


if __name__ == "__main__":
    main()
