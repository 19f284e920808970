"""The console's settings: operators from the YAML file (``console.operators``), the rest from the environment."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ALL_TENANTS", "ConsoleConfig", "ConsoleSettings", "Operator", "OperatorRole"]

ALL_TENANTS = "*"
"""In an operator's ``tenants``: every tenant."""
OperatorRole = Literal["operator", "viewer"]
"""``operator``: reads the conversations and acts (take over, write, decide, requeue, reconcile); ``viewer``: sees
sessions, states and figures, with message text, tool arguments and results withheld, and cannot act."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_ARGON2 = re.compile(r"^\$argon2(id|i|d)\$")


class Operator(BaseModel):
    """One console operator: ``{name, password_hash, tenants, role}``.

    ``password_hash`` is an Argon2 hash made by ``switchboard console hash-password``; an operator without one can
    sign in only through a trusted reverse proxy's header (``SWITCHBOARD_CONSOLE__AUTH_HEADER``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    password_hash: str | None = None
    tenants: tuple[str, ...] = Field(min_length=1)
    """The tenants whose sessions, approvals and figures this operator sees and acts on (``"*"``: all)."""
    role: OperatorRole = "operator"
    """What they may do in those tenants: ``operator`` reads conversations and acts, ``viewer`` only watches
    (states and figures, message text withheld by the server)."""

    @property
    def reads_messages(self) -> bool:
        """Whether the server shows this operator message text, tool arguments and results."""
        return self.role == "operator"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 letters, digits or . _ @ - (starting with a letter or digit)")
        return v

    @field_validator("password_hash")
    @classmethod
    def _hash(cls, v: str | None) -> str | None:
        if v is not None and not _ARGON2.match(v):
            raise ValueError("must be an Argon2 hash: make one with `switchboard console hash-password`")
        return v

    def sees(self, tenant: str) -> bool:
        """Whether this operator may see and act on ``tenant``."""
        return ALL_TENANTS in self.tenants or tenant in self.tenants


class ConsoleConfig(BaseModel):
    """The YAML file's ``console:`` block."""

    model_config = ConfigDict(extra="forbid")

    operators: tuple[Operator, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> ConsoleConfig:
        names = [operator.name for operator in self.operators]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"operator names must be unique; repeated: {', '.join(duplicates)}")
        return self

    def operator(self, name: str) -> Operator | None:
        """The operator called ``name``, if any."""
        return next((operator for operator in self.operators if operator.name == name), None)


class ConsoleSettings(BaseModel):
    """``SWITCHBOARD_CONSOLE__*``: how operators sign in to ``/console``."""

    model_config = ConfigDict(extra="forbid")

    auth_header: str | None = None
    """A reverse proxy's header naming the signed-in operator (``X-Forwarded-User``); believed only on connections
    from ``SWITCHBOARD_TRUSTED_PROXIES``, and the name must be one of ``console.operators``. Unset: passwords only."""
    cookie_secure: Literal["auto", "always", "never"] = "auto"
    """Mark the sign-in cookie ``Secure``: ``auto`` when the request came over HTTPS (directly, or per a trusted
    proxy's ``X-Forwarded-Proto``)."""
    session_ttl_s: int = Field(8 * 3600, ge=60)
    """A sign-in lasts this long after its last use."""
    login_failures_per_name: int = Field(5, ge=1)
    """Failed sign-ins as one operator name from one client address before each further try from that address waits
    (``login_delay_s``, doubling after each failure, at most ``login_window_s``). Other addresses are not held back:
    nobody can lock an operator out by guessing their name."""
    login_delay_s: float = Field(1.0, gt=0)
    """The first wait imposed on an address past ``login_failures_per_name`` failures for one name."""
    login_failures_per_address: int = Field(20, ge=1)
    """Failed sign-ins one client address may have within ``login_window_s``, whatever names it tries."""
    login_window_s: int = Field(15 * 60, ge=1)
    """The window the failure counts cover (an address's from its first failure, an address and name's from its
    last)."""
