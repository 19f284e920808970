"""Settings of the computer each session works in: the shell's sandbox and the egress proxy.

``SWITCHBOARD_SANDBOX__*`` and ``SWITCHBOARD_EGRESS__*`` (fields of
:class:`switchboard.settings.Settings`; docs/ARCHITECTURE.md §7 and §10).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from switchboard.core.tools.egress import normalize_pattern

__all__ = ["CredentialClient", "EgressCredential", "EgressSecret", "EgressSettings", "SandboxSettings"]


class SandboxSettings(BaseModel):
    """``SWITCHBOARD_SANDBOX__*``: the sandbox of the ``shell`` tool, chosen at start-up from what the host supports."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["auto", "bwrap", "landlock", "weak", "off"] = "auto"
    """``auto``: bubblewrap with seccomp, else Landlock with seccomp, else (if allowed) the weak floor."""
    allow_weak: bool = False
    """Allow the weak floor (rlimits only) when nothing stronger works: only for operator-trusted agents and skills."""
    timeout_s: float = Field(60.0, gt=0)
    """Deadline of a command when the model sets no ``timeout_ms``."""
    max_timeout_s: float = Field(600.0, gt=0)
    """Longest ``timeout_ms`` honoured."""
    cpu_s: int = Field(60, ge=1)
    """CPU seconds of one command (``RLIMIT_CPU``)."""
    memory_mb: int = Field(1024, ge=64)
    """Memory of one command, all its processes together (a memory cgroup, else a watchdog over its processes'
    resident memory), and the address space of each of its processes (``RLIMIT_AS``)."""
    memory_total_mb: int = Field(4096, ge=64)
    """Memory of all the commands of one worker together: a command waits while its budget would pass this."""
    processes: int = Field(64, ge=4)
    """Processes and threads of one command (``RLIMIT_NPROC``, or a ``pids`` cgroup when the worker is root)."""
    file_mb: int = Field(64, ge=1)
    """Largest file one command may write (``RLIMIT_FSIZE``)."""
    tmp_mb: int = Field(64, ge=1)
    """Size of the private ``/tmp``."""
    max_output_chars: int = Field(20_000, ge=100)
    """Default and largest ``max_output_length``: characters kept of each stream (head and tail)."""
    concurrency: int = Field(16, ge=1)
    """Commands running at once in one worker (more wait)."""
    progress_after_s: float = Field(5.0, ge=0)
    """A command still running after this is announced on the user's channel (0: never)."""
    progress_every_s: float = Field(5.0, ge=0.05)
    """How often that status message is edited where the channel edits (the chat's edit budget may skip an edit)."""
    progress_notices: int = Field(2, ge=0, le=10)
    """Most progress messages of one call where the channel cannot edit (WhatsApp, Instagram, Messenger, web chat)."""
    proxy_socket: Path | None = None
    """Unix socket the worker's egress proxy listens on, bound into bubblewrap sandboxes (default:
    ``<data dir>/egress/worker-<pid>.sock``; set it only with one worker process per path)."""


def _comma_list(value: object) -> object:
    """``a, b`` → ``("a", "b")`` (lists from the environment are comma-separated)."""
    return tuple(part.strip() for part in value.split(",") if part.strip()) if isinstance(value, str) else value


class EgressSecret(BaseModel):
    """``SWITCHBOARD_EGRESS__SECRETS__<NAME>__VALUE`` and ``__DOMAINS``: a secret the egress proxy injects.

    Sandboxes and the model see only the placeholder ``{{secret:<NAME>}}``; the proxy puts the value in its place in
    request headers on requests to these domains, and refuses a request that carries the placeholder anywhere else.
    """

    model_config = ConfigDict(extra="forbid")

    value: SecretStr
    domains: Annotated[tuple[str, ...], NoDecode] = Field(min_length=1)
    """Comma-separated hosts the secret may be sent to (``api.github.com``, ``*.example.com``)."""

    @field_validator("domains", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        return _comma_list(v)

    @field_validator("domains")
    @classmethod
    def _patterns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(normalize_pattern(p) for p in v)


class CredentialClient(BaseModel):
    """``…__CREDENTIALS__<NAME>__TENANTS__<TENANT>__*``: the OAuth2 client one tenant's tokens are obtained as."""

    model_config = ConfigDict(extra="forbid")

    client_id: str = Field(min_length=1)
    client_secret_secret: str | None = None
    """Name of the egress secret (``SWITCHBOARD_EGRESS__SECRETS__<NAME>``) holding this client's secret."""


class EgressCredential(BaseModel):
    """``SWITCHBOARD_EGRESS__CREDENTIALS__<NAME>__*``: a short-lived token the egress proxy obtains and injects.

    Requests carry ``{{credential:<NAME>}}`` (or ``{{credential:<NAME>:<scope>}}`` for a narrower scope) in a header;
    egress puts a bearer token it obtained from ``token_url`` in its place, on requests to ``hosts`` only. The token
    is cached per tenant and scope until shortly before it expires; the model and the sandbox never see it.
    """

    model_config = ConfigDict(extra="forbid")

    type: Literal["oauth2_client_credentials", "oauth2_token_exchange"] = "oauth2_client_credentials"
    """RFC 6749 §4.4 client credentials, or RFC 8693 token exchange of a static subject token."""
    token_url: str = Field(min_length=1)
    """The authorization server's token endpoint (``https`` only), reached through the same address checks."""
    client_id: str = ""
    client_secret_secret: str | None = None
    """Name of the egress secret holding the client secret; it must be bound to the token endpoint's host."""
    client_auth: Literal["basic", "body"] = "basic"
    """How the client authenticates: HTTP Basic (RFC 6749 §2.3.1) or ``client_id``/``client_secret`` in the form."""
    scope: str = ""
    """Space-separated scopes asked for; a request may ask for a subset of them, never more."""
    audience: str | None = None
    """Sent as ``audience`` (token exchange, and servers that take it for client credentials)."""
    hosts: Annotated[tuple[str, ...], NoDecode] = Field(min_length=1)
    """Comma-separated hosts the token may be sent to (``api.example.com``, ``*.example.com``)."""
    subject_token_secret: str | None = None
    """Token exchange: name of the egress secret holding the subject token."""
    subject_token_type: str = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 (a type URI)
    """Token exchange: the subject token's type URI."""
    refresh_margin_s: float = Field(30.0, ge=0)
    """A token is used until this long before it expires (at most half its lifetime), then a new one is obtained."""
    tenants: dict[str, CredentialClient] = Field(default_factory=dict)
    """A tenant's own client (``client_id``, ``client_secret_secret``) in place of the default one."""

    @field_validator("hosts", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        return _comma_list(v)

    @field_validator("hosts")
    @classmethod
    def _patterns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(normalize_pattern(p) for p in v)

    @field_validator("token_url")
    @classmethod
    def _https(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme != "https" or not parts.hostname or parts.username or parts.password or parts.fragment:
            raise ValueError(f"token_url {v!r} must be an https URL with a host (no credentials, no fragment)")
        return v

    @model_validator(mode="after")
    def _complete(self) -> EgressCredential:
        if self.type == "oauth2_client_credentials" and not (self.client_id and self.client_secret_secret):
            raise ValueError("oauth2_client_credentials needs client_id and client_secret_secret")
        if self.type == "oauth2_token_exchange" and not self.subject_token_secret:
            raise ValueError("oauth2_token_exchange needs subject_token_secret (the egress secret to exchange)")
        if self.client_secret_secret and not self.client_id:
            raise ValueError("client_secret_secret needs client_id")
        return self

    @property
    def token_host(self) -> str:
        """The token endpoint's host (lower-case)."""
        return (urlsplit(self.token_url).hostname or "").lower()

    def secret_names(self) -> tuple[str, ...]:
        """Every egress secret this credential's token requests use (client secrets, subject token)."""
        names = [self.client_secret_secret, self.subject_token_secret]
        names += [client.client_secret_secret for client in self.tenants.values()]
        return tuple(name for name in names if name)

    def client(self, tenant: str) -> CredentialClient | None:
        """The client ``tenant``'s tokens are obtained as (its own, else the default; ``None``: no client auth)."""
        own = self.tenants.get(tenant)
        if own is not None:
            return own
        return (
            CredentialClient(client_id=self.client_id, client_secret_secret=self.client_secret_secret)
            if (self.client_id)
            else None
        )


class EgressSettings(BaseModel):
    """``SWITCHBOARD_EGRESS__*``: the host-side proxy every outbound request of a sandbox or tool goes through."""

    model_config = ConfigDict(extra="forbid")

    allow: Annotated[tuple[str, ...], NoDecode] = ()
    """Comma-separated hosts every agent may reach, besides each agent's own ``egress.allow`` (default: none)."""
    methods: Annotated[tuple[str, ...], NoDecode] = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    """HTTP methods passed on; any other is refused with 405."""
    ports: Annotated[tuple[int, ...], NoDecode] = (80, 443)
    """Destination ports allowed."""
    internal_networks: Annotated[tuple[str, ...], NoDecode] = ()
    """CIDRs an allowlisted host may resolve into although they are private (an internal service); the metadata
    address is refused whatever this says."""
    max_request_bytes: int = Field(10 * 2**20, ge=0)
    """Largest request body passed on (413 past it)."""
    max_response_bytes: int = Field(50 * 2**20, ge=0)
    """Largest response body passed back (502 past it)."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Connecting to the destination (TCP and TLS)."""
    timeout_s: float = Field(60.0, gt=0)
    """One request from sending it to its last response byte."""
    client_timeout_s: float = Field(30.0, gt=0)
    """A client must send a request's head and body within this."""
    upstream_ca_file: Path | None = None
    """Extra CA certificates (PEM) trusted for destinations, besides the system's (a corporate CA)."""
    host: str = "127.0.0.1"
    """Loopback address of the proxy's TCP listener."""
    port: int = Field(0, ge=0, le=65535)
    """Its port (``0``: any free port, handed to each sandbox)."""
    secrets: dict[str, EgressSecret] = Field(default_factory=dict)
    """Secrets by name, bound to the domains they may be sent to."""
    credentials: dict[str, EgressCredential] = Field(default_factory=dict)
    """Short-lived tokens by name (``{{credential:NAME}}``), obtained by egress itself (``docs/credentials.md``)."""

    @field_validator("allow", "methods", "ports", "internal_networks", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        return _comma_list(v)

    @field_validator("allow")
    @classmethod
    def _patterns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(normalize_pattern(p) for p in v)

    @field_validator("methods")
    @classmethod
    def _upper(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(m.upper() for m in v)

    @field_validator("internal_networks")
    @classmethod
    def _networks(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for net in v:
            ipaddress.ip_network(net, strict=False)  # ValueError names the bad entry
        return v

    @model_validator(mode="after")
    def _credential_secrets(self) -> EgressSettings:
        secrets = {name.upper(): secret for name, secret in self.secrets.items()}
        for name, credential in self.credentials.items():
            where = f"egress.credentials.{name}"
            named = [("client_secret_secret", credential.client_secret_secret, credential.token_host)]
            named += [
                (f"tenants.{tenant}.client_secret_secret", client.client_secret_secret, credential.token_host)
                for tenant, client in credential.tenants.items()
            ]
            named.append(("subject_token_secret", credential.subject_token_secret, credential.token_host))
            for field, secret_name, host in named:
                if secret_name is None:
                    continue
                secret = secrets.get(secret_name.upper())
                if secret is None:
                    raise ValueError(
                        f"{where}.{field} names the egress secret {secret_name!r}, which is not set: set "
                        f"SWITCHBOARD_EGRESS__SECRETS__{secret_name.upper()}__VALUE and __DOMAINS={host}"
                    )
                if not _host_in(host, secret.domains):
                    raise ValueError(
                        f"{where}.{field}: the egress secret {secret_name.upper()} is not bound to the token "
                        f"endpoint's host {host}: add it to SWITCHBOARD_EGRESS__SECRETS__{secret_name.upper()}__DOMAINS"
                    )
        return self


def _host_in(host: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``host`` is one of ``patterns`` (exact, or under a ``*.`` pattern)."""
    return any(host == p or (p.startswith("*.") and host.endswith(p[1:])) for p in patterns)
