"""``switchboard tools import openapi FILE --agent NAME --only ID,...``: REST tool declarations drafted for review.

``switchboard tools check FILE``: a YAML file's declarations checked before it is saved over the running one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from switchboard.errors import ConfigError
from switchboard.settings import Settings, load_file

__all__ = ["check_declarations", "import_openapi"]

MAX_DOCUMENT_BYTES = 16 * 2**20
"""Largest OpenAPI document read."""


def _load(path: Path) -> Any:
    try:
        if path.stat().st_size > MAX_DOCUMENT_BYTES:
            raise ConfigError(f"{path} is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB")
        return yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML too
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as err:  # nesting past the parser's depth
        raise ConfigError(f"{path} is not a readable OpenAPI document ({type(err).__name__})") from None


def import_openapi(
    settings: Settings, file: Path, agent: str, only: str, *, server: str | None = None, out: Path | None = None
) -> int:
    """Draft the declarations of the ``only`` operations for ``agent`` and print them (or write them to ``out``).

    The drafts are YAML for the operator to review and put under ``agents.<agent>.rest_tools``; the file is never
    changed here. A host the agent may not reach is named with the ``egress.allow`` entry it needs.
    """
    from switchboard.core.tools.rest.declaration import RestToolSpec
    from switchboard.core.tools.rest.openapi import OpenApiError, draft_tools
    from switchboard.egress.policy import EgressPolicy

    if agent not in settings.file.agents:
        raise ConfigError(f"unknown agent {agent!r} (defined: {', '.join(sorted(settings.file.agents))})")
    document = _load(file)
    if not isinstance(document, dict):
        raise ConfigError(f"{file} does not hold an OpenAPI document (a mapping)")
    try:
        drafts = draft_tools(document, only.split(","), server=server)
    except OpenApiError as err:
        print(f"switchboard: {file}: {err}", file=sys.stderr)
        return 1
    hosts = sorted({RestToolSpec.model_validate(draft).host for draft in drafts})
    rules = EgressPolicy.from_settings(settings).rules(agent)
    missing = [host for host in hosts if not rules.allows(host)]
    block: dict[str, Any] = {"rest_tools": drafts}
    if missing:
        block = {"egress": {"allow": [*settings.file.agents[agent].egress.allow, *missing]}, **block}
    names = ", ".join(draft["name"] for draft in drafts)
    header = (
        f"# REST tools drafted from {file.name} by `switchboard tools import openapi` ({names}).\n"
        "# Review each one before use: names, descriptions and schemas come from the document. Put them under\n"
        f"# agents.{agent} in your YAML file, and bind each {{{{secret:NAME}}}} under agents.{agent}.egress.secrets.\n"
    )
    text = header + yaml.safe_dump({"agents": {agent: block}}, sort_keys=False, allow_unicode=True, width=100)
    if out is None:
        sys.stdout.write(text)
        return 0
    try:
        with out.open("x", encoding="utf-8") as handle:  # never overwrites: the operator may have edited it
            handle.write(text)
    except FileExistsError:
        raise ConfigError(f"{out} exists: choose another --out (it is never overwritten)") from None
    print(f"wrote {len(drafts)} declaration(s) for agent {agent} to {out}: review them, then add them to the YAML")
    return 0


def check_declarations(settings: Settings, file: Path) -> int:
    """Validate ``file`` as the YAML file and print the REST tools each agent would get; 1 when one cannot work.

    Workers reload the declarations of the running file at their next turn and keep the last good ones when it does
    not load: checking a copy first avoids saving a file that would be refused.

    Raises:
        ConfigError: the file does not load (the message names the field).
    """
    from switchboard.core.tools.builtin import default_registry
    from switchboard.egress.transport import register_rest_tools, rest_problems

    checked = settings.model_copy()
    checked.file = load_file(file, required=True)
    try:
        register_rest_tools(default_registry(), checked, None)
    except ValueError as err:
        raise ConfigError(f"{file}: {err}", field="rest_tools") from None
    shared = {spec.name for spec in checked.file.rest_tools}
    for name, agent in sorted(checked.file.agents.items()):
        listed = [tool for tool in agent.tools if tool in shared] + [spec.name for spec in agent.rest_tools]
        print(f"{name}: {', '.join(listed) or 'no REST tools'}")
    problems = rest_problems(checked)
    for problem in problems:
        print(f"switchboard: {file}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{file}: {len(shared)} shared REST tool(s); the file is valid")
    return 1 if problems else 0
