"""What an agent may reach on the network, as written in the YAML file (:class:`AgentEgress`).

Enforced by :mod:`switchboard.egress`. Default deny: an agent without ``egress.allow`` reaches only the hosts
``SWITCHBOARD_EGRESS__ALLOW`` lists.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["AgentEgress", "SecretBinding", "normalize_pattern"]

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def normalize_pattern(pattern: str) -> str:
    """A host pattern, lowercased and checked: ``api.example.com`` (exact) or ``*.example.com`` (any subdomain).

    Raises:
        ValueError: for anything else (a bare ``*``, a wildcard inside a name, a scheme or a path).
    """
    value = pattern.strip().lower().rstrip(".")
    name = value[2:] if value.startswith("*.") else value
    labels = name.split(".")
    if not name or not all(_LABEL.match(label) for label in labels) or (value.startswith("*.") and len(labels) < 2):
        raise ValueError(f"{pattern!r} is not a host name or *.domain pattern (e.g. api.example.com, *.example.com)")
    return value


class SecretBinding(BaseModel):
    """A secret an agent's requests may carry: its value comes from an environment variable, never from YAML."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str = Field(min_length=1)
    """The environment variable that holds the value (``GH_TOKEN``)."""
    domains: tuple[str, ...] = Field(min_length=1)
    """Hosts the value may be sent to; the placeholder sent anywhere else is refused."""

    @field_validator("domains")
    @classmethod
    def _patterns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(normalize_pattern(p) for p in v)


class AgentEgress(BaseModel):
    """An agent's network policy: the hosts it may reach and the secrets its requests may carry.

    ```yaml
    agents:
      researcher:
        egress:
          allow: [api.github.com, "*.wikipedia.org"]
          secrets:
            GITHUB_TOKEN: {env: GH_TOKEN, domains: [api.github.com]}
    ```
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: tuple[str, ...] = ()
    """Hosts the agent's sandboxes and tools may reach (``api.example.com``, ``*.example.com``)."""
    secrets: dict[str, SecretBinding] = Field(default_factory=dict)
    """Secrets by placeholder name (``{{secret:GITHUB_TOKEN}}``)."""

    @field_validator("allow")
    @classmethod
    def _patterns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(normalize_pattern(p) for p in v)

    @field_validator("secrets")
    @classmethod
    def _names(cls, v: dict[str, SecretBinding]) -> dict[str, SecretBinding]:
        bad = [name for name in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name)]
        if bad:
            raise ValueError(f"secret names are letters, digits and _ (not {', '.join(map(repr, bad))})")
        return {name.upper(): binding for name, binding in v.items()}
