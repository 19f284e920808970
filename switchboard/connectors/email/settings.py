"""The email server's settings: ``EMAIL_*`` variables, set by the MCP client's configuration of the server.

The password arrives in ``EMAIL_PASSWORD``, which the worker fills from an egress secret
(``mcp_servers.<name>.secrets``) when it starts the process; it is never a command argument and never leaves this
process except to the mail servers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["MailSettings", "TlsMode"]

TlsMode = Literal["tls", "starttls", "none"]
"""``tls``: TLS from the first byte (IMAPS 993, SMTPS 465); ``starttls``: upgraded before login; ``none``: plain text,
allowed only to a server on a loopback address."""


class MailSettings(BaseSettings):
    """One mailbox: where to read it (IMAP), where to send from it (SMTP), and who logs in."""

    model_config = SettingsConfigDict(env_prefix="EMAIL_", extra="ignore", frozen=True)

    imap_host: str = Field(min_length=1)
    imap_port: int = Field(993, gt=0, lt=65536)
    imap_tls: TlsMode = "tls"
    smtp_host: str = Field(min_length=1)
    smtp_port: int = Field(587, gt=0, lt=65536)
    smtp_tls: TlsMode = "starttls"
    username: str = Field(min_length=1)
    password: SecretStr
    from_address: str | None = None
    """The sender of mail sent (default: the username)."""
    internal_networks: Annotated[tuple[str, ...], NoDecode] = ()
    """Comma-separated CIDRs the mail servers may resolve into although private (as the egress proxy's setting)."""
    ca_file: Path | None = None
    """Extra CA certificates (PEM) trusted for the mail servers, besides the system's."""
    timeout_s: float = Field(30.0, gt=0, le=600)
    """Connecting and each command."""
    max_body_chars: int = Field(20_000, gt=0)
    """Most characters of a message's text returned by ``read_mail``."""
    max_fetch_bytes: int = Field(256 * 1024, gt=0)
    """Most bytes of a message's text part fetched from the server (attachments are never fetched)."""

    @field_validator("from_address", "ca_file", mode="before")
    @classmethod
    def _unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("internal_networks", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @property
    def sender(self) -> str:
        """The address mail is sent from."""
        return self.from_address or self.username
