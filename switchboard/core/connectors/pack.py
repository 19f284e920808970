"""A connector pack: a prebuilt integration, shipped as data (``switchboard/connectors/packs/<pack>.yaml``).

A pack names the settings an operator gives (secret ones name an egress secret, never hold a value) and declares its
operations as REST tools or one MCP server, with ``{{setting:NAME}}`` and ``{{secret:NAME}}`` placeholders that the
loader (:mod:`.expand`) fills in from the operator's ``connectors:`` block. Every REST operation states its side
effect, risk class and timeout; writes wait for a person's approval unless the operator relaxes it.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from switchboard.core.tools.mcp.config import SERVER_NAME_PATTERN, McpServer
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.errors import ConfigError

__all__ = [
    "OPERATOR_OPTIONS",
    "PLACEHOLDER",
    "ConnectorPack",
    "PackSetting",
    "load_packs",
    "render",
]

PLACEHOLDER = re.compile(r"\{\{\s*(setting|regex|secret):([a-z][a-z0-9_]{0,63})\s*\}\}")
"""``{{setting:NAME}}`` (the operator's value), ``{{regex:NAME}}`` (the value escaped for a JSON Schema ``pattern``)
and ``{{secret:NAME}}`` (the egress secret a secret setting names, as a ``{{secret:...}}`` placeholder)."""

OPERATOR_OPTIONS = frozenset({"approve_writes"})
"""Keys of a ``connectors.<pack>`` block that are the operator's options, not the pack's settings."""

_EXAMPLE = "x"


class PackSetting(BaseModel):
    """One value the operator gives a pack (``connectors.<pack>.<name>``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = Field(min_length=1, max_length=300)
    default: str | None = None
    """Used when the operator gives none; without a default the setting is required."""
    secret: bool = False
    """The value names an egress secret (``TRACKER_TOKEN``); the pack uses it only as ``{{secret:NAME}}``."""
    pattern: str | None = None
    """A regular expression the whole value must match (a repository ``owner/name``, a calendar id)."""
    example: str | None = None
    """A value shown in docs and used to check the pack's declarations when it loads."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            re.compile(value)
        return value

    @property
    def required(self) -> bool:
        """The operator must give it."""
        return self.default is None

    def sample(self) -> str:
        """A value that stands for the operator's when the pack itself is checked."""
        return self.example or self.default or ("EXAMPLE_SECRET" if self.secret else _EXAMPLE)


def render(value: Any, replace: Any) -> Any:
    """``value`` (strings, lists, mappings) with each placeholder replaced by ``replace(kind, name)``."""
    if isinstance(value, str):
        return PLACEHOLDER.sub(lambda m: replace(m.group(1), m.group(2)), value)
    if isinstance(value, list):
        return [render(item, replace) for item in value]
    if isinstance(value, dict):
        return {key: render(item, replace) for key, item in value.items()}
    return value


def _placeholders(value: Any) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()

    def note(kind: str, name: str) -> str:
        found.add((kind, name))
        return ""

    render(value, note)
    return found


class ConnectorPack(BaseModel):
    """A pack file: its settings and its operations (REST tools, or one MCP server)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=SERVER_NAME_PATTERN, max_length=24)
    description: str = Field(min_length=1, max_length=300)
    settings: dict[str, PackSetting] = Field(default_factory=dict)
    rest_tools: list[dict[str, Any]] = Field(default_factory=list)
    """REST tool declarations (:class:`RestToolSpec`) with placeholders; each ``name`` is the operation's, the tool
    is ``<pack>_<name>``."""
    mcp_server: dict[str, Any] | None = None
    """An MCP server declaration (:data:`McpServer`) with placeholders; it is added as server ``<pack>``."""
    mcp_reads: list[str] = Field(default_factory=list)
    """Tools of the MCP server that only read; every other one is a write, gated like a REST write."""

    @field_validator("settings")
    @classmethod
    def _setting_names(cls, value: dict[str, PackSetting]) -> dict[str, PackSetting]:
        for name in value:
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", name) or name in OPERATOR_OPTIONS:
                raise ValueError(f"setting name {name!r}: lower-case letters, digits and _, not an operator option")
        return value

    @model_validator(mode="after")
    def _check(self) -> ConnectorPack:
        if not self.rest_tools and self.mcp_server is None:
            raise ValueError("a pack declares rest_tools or an mcp_server")
        for index, raw in enumerate(self.rest_tools):
            missing = [key for key in ("name", "side_effect", "risk", "timeout_s") if key not in raw]
            if missing:
                raise ValueError(f"rest_tools[{index}] does not state {', '.join(missing)} (every operation does)")
        for kind, name in _placeholders([self.rest_tools, self.mcp_server]):
            setting = self.settings.get(name)
            if setting is None:
                raise ValueError(f"{{{{{kind}:{name}}}}} names no setting of the pack")
            if setting.secret != (kind == "secret"):
                use = "{{secret:" if setting.secret else "{{setting: or {{regex:"
                raise ValueError(f"{{{{{kind}:{name}}}}}: the setting {name} is used only as {use}{name}}}}}")
        self.operations(self.samples())  # the declarations hold with example settings
        return self

    def samples(self) -> dict[str, str]:
        """Example values of every setting."""
        return {name: setting.sample() for name, setting in self.settings.items()}

    def operations(self, values: dict[str, str]) -> list[RestToolSpec]:
        """The REST tools with ``values`` filled in (a secret setting's value is the egress secret's name).

        Raises:
            ValueError: a declaration does not hold with these values.
        """
        filled = render(self.rest_tools, lambda kind, name: _fill(kind, values[name]))
        specs: list[RestToolSpec] = []
        for raw in filled:
            try:
                named = {**raw, "name": f"{self.name}_{raw['name']}", "owner": f"connector:{self.name}"}
                specs.append(RestToolSpec.model_validate(named))
            except ValidationError as err:
                raise ValueError(f"rest_tools {raw['name']}: {_first(err)}") from None
        return specs

    def server(self, values: dict[str, str]) -> dict[str, Any] | None:
        """The MCP server declaration with ``values`` filled in, checked.

        Raises:
            ValueError: it does not hold with these values.
        """
        if self.mcp_server is None:
            return None
        filled: dict[str, Any] = render(self.mcp_server, lambda kind, name: _fill(kind, values[name]))
        if "reads" not in filled:
            filled["reads"] = list(self.mcp_reads)
        try:
            _SERVER.validate_python(filled)
        except ValidationError as err:
            raise ValueError(f"mcp_server: {_first(err)}") from None
        return filled

    def effects(self) -> dict[str, Literal["read", "write"]]:
        """Each REST operation's tool name and side effect."""
        return {spec.name: spec.effect for spec in self.operations(self.samples())}


def _fill(kind: str, value: str) -> str:
    if kind == "secret":
        return "{{secret:" + value + "}}"
    return re.escape(value) if kind == "regex" else value


def _first(err: ValidationError) -> str:
    item = err.errors()[0]
    where = ".".join(str(p) for p in item["loc"])
    return f"{where}: {item['msg']}" if where else str(item["msg"])


_SERVER: TypeAdapter[Any] = TypeAdapter(McpServer)


@functools.cache
def load_packs() -> dict[str, ConnectorPack]:
    """The shipped packs by name, each file checked.

    Raises:
        ConfigError: a pack file is not valid (a broken install).
    """
    folder = resources.files("switchboard").joinpath("connectors", "packs")
    packs: dict[str, ConnectorPack] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        try:
            pack = ConnectorPack.model_validate(yaml.safe_load(entry.read_text(encoding="utf-8")))
        except (yaml.YAMLError, ValidationError) as err:
            raise ConfigError(f"connector pack {entry.name} is not valid: {err}", field="connectors") from None
        if f"{pack.name}.yaml" != entry.name:
            raise ConfigError(
                f"connector pack {entry.name} is named {pack.name!r}: they must agree", field="connectors"
            )
        packs[pack.name] = pack
    return packs
