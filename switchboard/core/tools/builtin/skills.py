"""Loading skills into a turn, deterministically.

The agent's ``skills`` are resolved once per turn (:func:`agent_skills`) and listed in the system prompt by name and
description (:func:`skills_section`). ``use_skill(name)`` copies that exact package (the version and hash the catalogue
was built from) into the workspace within the quotas and returns its instructions and files; each use is recorded
(:class:`~switchboard.core.events.SkillUsed`), and a package changed on disk since it was installed is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.agent.config import Agent
from switchboard.core.events import SkillUsed
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.threads import run_blocking
from switchboard.core.workspaces.disk import Workspaces, make_private_dir
from switchboard.errors import ToolError
from switchboard.skills.package import SkillError, SkillRef, content_sha256, read_manifest
from switchboard.skills.sources import read_folder
from switchboard.skills.store import SkillLibrary

__all__ = ["USE_SKILL", "UseSkillInput", "agent_skills", "skill_tools", "skills_section"]

USE_SKILL = "use_skill"
WORKSPACE_DIR = "skills"
"""Where used skills are copied in the session workspace."""


class UseSkillInput(BaseModel):
    """Arguments of ``use_skill``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="The skill's name, as listed under Skills.")


class _Loader:
    """The ``use_skill`` function, bound to the library the catalogue is resolved from."""

    def __init__(self, library: SkillLibrary) -> None:
        self.library = library

    async def __call__(self, args: UseSkillInput, ctx: ToolContext) -> dict[str, Any]:
        ref = next((r for r in ctx.skills if r.name == args.name), None)
        if ref is None:
            have = ", ".join(r.name for r in ctx.skills) or "none"
            raise ToolError(
                f"no skill named {args.name!r} for this agent (its skills: {have})", error_class="validation"
            )
        files, body = await run_blocking(ctx, _copy, ref, ctx)
        if ctx.record is not None:
            await ctx.record(SkillUsed(name=ref.name, version=ref.version, sha256=ref.sha256, source=ref.source))
        path = f"{WORKSPACE_DIR}/{ref.name}"
        return {
            "skill": ref.name,
            "version": ref.version,
            "path": path,
            "instructions": body,
            "files": files,
            "how": f"The skill is in your workspace at {path}/ (treat it as read-only). Follow its instructions; run "
            f"its scripts with the shell tool from the workspace, e.g. `python3 {path}/scripts/NAME.py ...`. Scripts "
            "print one JSON line and write their files by the relative paths you give them.",
        }


def _copy(ref: SkillRef, ctx: ToolContext) -> tuple[list[str], str]:
    """Copy the package into the workspace, within its quotas; its files and the instructions of its SKILL.md."""
    try:
        package = read_folder(ref.path)
    except SkillError as err:
        raise ToolError(f"skill {ref.pin} could not be read: {err}") from None
    if content_sha256(package.files) != ref.sha256:
        raise ToolError(f"skill {ref.pin} changed on disk since it was installed; reinstall it")
    manifest = read_manifest(package.files, ref.name)
    home = make_private_dir(ctx.workspace)
    spaces = ctx.workspaces or Workspaces(None)
    for relative, data in sorted(package.files.items()):
        shown = f"{WORKSPACE_DIR}/{ref.name}/{relative}"
        spaces.store(home, home / WORKSPACE_DIR / ref.name / relative, data, shown=shown)
    return sorted(package.files), manifest.body


def skill_tools(library: SkillLibrary | None = None) -> list[Tool]:
    """The ``use_skill`` tool over ``library`` (default: the built-in skills only)."""
    return [
        Tool(
            name=USE_SKILL,
            description="Load one of your skills by name: its package is copied into your workspace and you get its "
            "path, its instructions (SKILL.md) and its files. Use it when a task matches a skill's description.",
            input=UseSkillInput,
            fn=_Loader(library or SkillLibrary()),
            side_effect="write",
            risk="low",  # copies a vetted package into the workspace: never gated
            idempotent=True,
            resources=lambda args: (f"skill {args.name}",),
            timeout_s=30.0,
            cost=1,
            connector="skills",
            retry_on=frozenset(),
        )
    ]


def agent_skills(tools: Sequence[Tool], agent: Agent) -> tuple[SkillRef, ...]:
    """The packages of ``agent``'s ``skills`` list, resolved once for a turn (empty without ``use_skill``).

    Names that do not resolve are left out here (``switchboard agents validate`` reports them).
    """
    loader = next((t.fn for t in tools if t.name == USE_SKILL), None)
    if not agent.skills or not isinstance(loader, _Loader):
        return ()
    found, _ = loader.library.resolve_all(agent.skills)
    return tuple(found)


def skills_section(skills: Sequence[SkillRef]) -> str:
    """The system prompt's catalogue of the agent's skills: name and description of each (empty: none)."""
    if not skills:
        return ""
    lines = [f"- {ref.name}: {' '.join(ref.description.split())}" for ref in skills]
    return (
        "## Skills\nThese skills hold instructions and scripts for specific tasks. When a task matches a skill's "
        f"description, call {USE_SKILL} with its name first, then follow the instructions it returns.\n"
        + "\n".join(lines)
    )
