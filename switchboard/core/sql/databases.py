"""Shared read-only databases an agent may query with ``sql``, as written in the YAML file (:class:`SharedDatabase`).

Each is attached to the agent's ``sql`` connections under its name (``catalog.products``), opened read-only; the
operator's descriptions and the tables' columns are shown to the model beside the session's own database.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

__all__ = ["AgentDatabases", "SharedDatabase", "check_database_names", "is_identifier"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_RESERVED_SCHEMAS = frozenset({"main", "temp"})


def is_identifier(name: str) -> bool:
    """``name`` is a plain SQL identifier (letters, digits, ``_``; no quoting needed), not a reserved prefix."""
    lowered = name.lower()
    return bool(_IDENTIFIER.match(name)) and not lowered.startswith(("sqlite_", "_switchboard"))


class SharedDatabase(BaseModel):
    """One operator-provided SQLite file an agent reads (never writes).

    ```yaml
    agents:
      shop:
        tools: [sql, read_document]
        databases:
          catalog:
            path: data/catalog.sqlite          # relative to this YAML file
            description: The product catalogue, refreshed nightly.
            tables:
              products: one row per product (sku, name, price in EUR)
              stock: units in stock per sku and warehouse
    ```
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    """The SQLite file; a relative path is relative to the YAML file that names it."""
    description: str = ""
    """What the database holds, shown to the model."""
    tables: dict[str, str] = Field(default_factory=dict)
    """What each table means (``products: one row per product …``), shown beside its columns."""

    @field_validator("path")
    @classmethod
    def _relative_to_config(cls, value: Path, info: ValidationInfo) -> Path:
        base = (info.context or {}).get("config_dir") if isinstance(info.context, dict) else None
        return Path(base) / value if base is not None and not value.is_absolute() else value


def check_database_names(value: dict[str, SharedDatabase]) -> dict[str, SharedDatabase]:
    """Database names are plain identifiers other than ``main`` and ``temp`` (they become schema names).

    Raises:
        ValueError: naming the offending names.
    """
    bad = [name for name in value if not is_identifier(name) or name.lower() in _RESERVED_SCHEMAS]
    if bad:
        raise ValueError(
            f"database names are letters, digits and _, not main or temp (not {', '.join(map(repr, bad))})"
        )
    return value


AgentDatabases = Annotated[dict[str, SharedDatabase], AfterValidator(check_database_names)]
"""An agent's shared databases by schema name."""
