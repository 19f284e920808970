"""Who is asking: an operator's principal and the tenants they may see, and the errors the services raise."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from switchboard.errors import SwitchboardError
from switchboard.types import SessionKey

__all__ = [
    "ALL_TENANTS",
    "ControlError",
    "InvalidRequestError",
    "NotFoundError",
    "OperatorScope",
    "OutOfScopeError",
    "is_text",
    "session_parts",
]

ALL_TENANTS = "*"
"""In :attr:`OperatorScope.tenants`: every tenant (the CLI, run by whoever holds the Redis URL)."""


class ControlError(SwitchboardError):
    """A control request that was refused; nothing was changed."""


class OutOfScopeError(ControlError):
    """The session or tenant is outside the operator's scope (HTTP 403)."""


class NotFoundError(ControlError):
    """No such session, approval, dead letter or effect (HTTP 404)."""


class InvalidRequestError(ControlError):
    """The request is malformed or does not apply now (HTTP 400): a bad verdict, an empty text, already decided."""


def session_parts(session: str) -> list[str]:
    """The unescaped components of a session key (``tenant/agent/channel/account/conversation[/thread]``).

    Raises:
        NotFoundError: ``session`` is not a session key.
    """
    parts = [unquote(p) for p in session.split("/")]
    if len(parts) not in (5, 6) or not all(parts) or not is_text(session):
        raise NotFoundError(f"not a session key: {session[:200]!r}")
    return parts


def is_text(value: str) -> bool:
    """Whether ``value`` is valid Unicode text (no lone surrogate, as a JSON escape or undecodable argv bytes make)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class OperatorScope:
    """An operator and the tenants whose sessions they may read and act on."""

    operator: str
    """The operator's principal (``console:<name>``): who sends what they ingest and who decides what they decide."""
    tenants: frozenset[str]
    """Tenant names (unescaped) the operator may see; :data:`ALL_TENANTS` for every tenant."""
    reads_messages: bool = True
    """Whether reads carry message text, tool arguments and results (else they are withheld, marked redacted)."""

    @classmethod
    def everything(cls, operator: str) -> OperatorScope:
        """Every tenant (the CLI)."""
        return cls(operator=operator, tenants=frozenset({ALL_TENANTS}))

    @property
    def unrestricted(self) -> bool:
        """Whether the operator sees every tenant."""
        return ALL_TENANTS in self.tenants

    def allows(self, tenant: str) -> bool:
        """Whether the operator may see ``tenant`` (unescaped name)."""
        return self.unrestricted or tenant in self.tenants

    def check(self, session: str) -> SessionKey:
        """``session`` as a key, after checking its tenant is in scope (no Redis read happens before this).

        Raises:
            NotFoundError: not a session key.
            OutOfScopeError: its tenant is not the operator's.
        """
        tenant = session_parts(session)[0]
        if not self.allows(tenant):
            raise OutOfScopeError(f"{self.operator} may not act on tenant {tenant!r}")
        return SessionKey(session)
