"""Accepted agents: draft agents an owner accepted, each a YAML file in ``agents.d/<tenant>/<name>.yaml``.

The folder sits beside the YAML file (``SWITCHBOARD_CONFIG``); each file holds one agent's block, as it would stand
under ``agents.<name>``. :func:`switchboard.settings.load_file` reads them with the file, so an accepted agent is an
agent like any other from each process's next start, and belongs to the tenant its folder names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import yaml

from switchboard.core.agent.config import Agent
from switchboard.errors import ConfigError

__all__ = ["ACCEPTED_DIR", "accepted_path", "read_accepted", "write_accepted"]

ACCEPTED_DIR: Final = "agents.d"
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


def accepted_path(config: Path, tenant: str, name: str) -> Path:
    """Where an accepted agent of ``tenant`` is written, beside the YAML file ``config``.

    Raises:
        ValueError: the tenant or the name cannot be a file name.
    """
    if not _NAME.match(tenant) or not _NAME.match(name):
        raise ValueError(f"tenant {tenant!r} and agent {name!r} must be 1-64 letters, digits or _ . @ -")
    return config.parent / ACCEPTED_DIR / tenant / f"{name}.yaml"


def write_accepted(config: Path, tenant: str, agent: Agent) -> Path:
    """Write ``agent`` as an accepted agent of ``tenant``; returns the file written (never overwrites one).

    Raises:
        ValueError: a bad tenant or name, or the file exists.
    """
    path = accepted_path(config, tenant, agent.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = agent.model_dump(mode="json", exclude_defaults=True, exclude={"name"})
    text = f"# accepted for tenant {tenant}; edit it like any agent block\n" + yaml.safe_dump(
        body, allow_unicode=True, sort_keys=False
    )
    try:
        with path.open("x", encoding="utf-8") as file:
            file.write(text)
    except FileExistsError:
        raise ValueError(f"{path} exists already: remove it, or accept the draft under another name") from None
    return path


def read_accepted(config: Path) -> dict[str, tuple[str, Agent]]:
    """Every accepted agent beside ``config``: name → (its tenant, the agent).

    Raises:
        ConfigError: a file that is not valid YAML or not a valid agent, or one name under two tenants.
    """
    found: dict[str, tuple[str, Agent]] = {}
    root = config.parent / ACCEPTED_DIR
    if not root.is_dir():
        return found
    for path in sorted(root.glob("*/*.yaml")):
        tenant, name = path.parent.name, path.stem
        try:
            raw: Any = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            if not isinstance(raw, dict):
                raise ValueError("the file must hold one agent's block (a mapping)")
            agent = Agent.model_validate({**raw, "name": name}, context={"config_dir": config.parent})
        except (yaml.YAMLError, ValueError, OSError) as err:
            raise ConfigError(f"{path}: not a valid accepted agent: {err}", field="agents") from None
        if name in found:
            raise ConfigError(f"{path}: agent {name!r} is also accepted for tenant {found[name][0]!r}", field="agents")
        found[name] = (tenant, agent)
    return found
