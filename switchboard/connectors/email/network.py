"""Connections to the mail servers that reach only addresses the egress address guard allows.

The host is resolved once, every address of the answer is checked (:class:`~switchboard.egress.addresses.AddressGuard`,
with the operator's internal networks), and the socket connects to one of exactly those addresses; TLS still verifies
the host's name. A plain-text session (``tls: none``), which would carry the password in clear, is opened only to a
loopback address.
"""

from __future__ import annotations

import imaplib
import ipaddress
import smtplib
import socket
import ssl
from typing import Any

from switchboard.connectors.email.settings import MailSettings, TlsMode
from switchboard.egress.addresses import AddressGuard, AddressRefusedError

__all__ = ["Imap", "ImapTls", "Smtp", "SmtpTls", "open_socket", "tls_context"]


def tls_context(settings: MailSettings) -> ssl.SSLContext:
    """Verifying TLS (the system's CAs plus ``ca_file``)."""
    context = ssl.create_default_context()
    if settings.ca_file is not None:
        context.load_verify_locations(cafile=str(settings.ca_file))
    return context


def open_socket(host: str, port: int, guard: AddressGuard, tls: TlsMode, timeout: float | None) -> socket.socket:
    """A TCP connection to ``host`` on an address the guard allows.

    Raises:
        AddressRefusedError: an address of ``host`` is refused, or ``tls`` is ``none`` and it is not a loopback one.
        OSError: the connection failed.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise OSError(f"{host}: the name does not resolve") from None
    addresses = [str(info[4][0]) for info in infos]
    guard.check(host, addresses)
    if tls == "none" and not all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in addresses):
        raise AddressRefusedError(host, "plain_text_off_host")
    failure: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        return sock
    raise failure or OSError(f"{host}: no address to connect to")


class Imap(imaplib.IMAP4):
    """IMAP over plain TCP (then ``starttls``, unless ``tls`` is ``none``)."""

    def __init__(self, host: str, port: int, guard: AddressGuard, tls: TlsMode, timeout: float) -> None:
        self.guard, self.tls = guard, tls
        super().__init__(host, port, timeout=timeout)

    def _create_socket(self, timeout: float | None) -> socket.socket:
        return open_socket(self.host, self.port, self.guard, self.tls, timeout)


class ImapTls(imaplib.IMAP4_SSL):
    """IMAP over TLS from the first byte."""

    def __init__(self, host: str, port: int, guard: AddressGuard, context: ssl.SSLContext, timeout: float) -> None:
        self.guard = guard
        super().__init__(host, port, ssl_context=context, timeout=timeout)

    def _create_socket(self, timeout: float | None) -> socket.socket:
        sock = open_socket(self.host, self.port, self.guard, "tls", timeout)
        wrapped: socket.socket = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
        return wrapped


class _GuardedSmtp(smtplib.SMTP):
    guard: AddressGuard
    tls: TlsMode

    def _get_socket(self, host: str, port: int, timeout: float) -> Any:
        return open_socket(host, port, self.guard, self.tls, timeout)


class Smtp(_GuardedSmtp):
    """SMTP over plain TCP (then ``starttls``, unless ``tls`` is ``none``)."""

    def __init__(self, host: str, port: int, guard: AddressGuard, tls: TlsMode, timeout: float) -> None:
        self.guard, self.tls = guard, tls
        super().__init__(host, port, timeout=timeout)


class SmtpTls(smtplib.SMTP_SSL, _GuardedSmtp):
    """SMTP over TLS from the first byte."""

    def __init__(self, host: str, port: int, guard: AddressGuard, context: ssl.SSLContext, timeout: float) -> None:
        self.guard, self.tls = guard, "tls"
        super().__init__(host, port, context=context, timeout=timeout)
