"""The sandbox of this process, chosen once from the settings (``SWITCHBOARD_SANDBOX__*``)."""

from __future__ import annotations

from switchboard.core.tools.builtin.shell import ShellOptions
from switchboard.sandbox.detect import Choice, choose_now
from switchboard.sandbox.limits import CommandLimits
from switchboard.settings import SandboxSettings, Settings

_WHY_CHARS = 160

__all__ = ["describe", "limits_of", "shell_line", "shell_options", "startup_choice"]


def limits_of(settings: SandboxSettings) -> CommandLimits:
    """The per-command limits the settings ask for."""
    return CommandLimits(
        max_wall_s=settings.max_timeout_s,
        cpu_s=settings.cpu_s,
        memory_mb=settings.memory_mb,
        memory_total_mb=settings.memory_total_mb,
        processes=settings.processes,
        file_mb=settings.file_mb,
        tmp_mb=settings.tmp_mb,
    )


def shell_options(settings: SandboxSettings) -> ShellOptions:
    """How the ``shell`` tool treats the model's arguments."""
    return ShellOptions(
        default_timeout_s=settings.timeout_s,
        max_timeout_s=settings.max_timeout_s,
        max_output_chars=settings.max_output_chars,
        progress_after_s=settings.progress_after_s,
        progress_every_s=settings.progress_every_s,
        progress_notices=settings.progress_notices,
    )


_CHOSEN: dict[str, Choice] = {}


def startup_choice(settings: Settings) -> Choice:
    """The sandbox this process runs commands in (detected once per distinct settings), or none and why.

    Egress is not part of the choice: the worker hands each ``shell`` call its way to the egress proxy (bubblewrap
    only; see :mod:`switchboard.egress.gate`).
    """
    config = settings.sandbox
    key = config.model_dump_json()
    if key not in _CHOSEN:
        _CHOSEN[key] = choose_now(
            config.kind, limits=limits_of(config), allow_weak=config.allow_weak, concurrency=config.concurrency
        )
    return _CHOSEN[key]


def describe(choice: Choice) -> list[str]:
    """Lines for ``switchboard check``: the isolation that applies and why stronger kinds do not."""
    lines: list[str] = []
    if choice.sandbox is None:
        lines.append("none — the shell tool is not offered")
    else:
        lines.append(f"{choice.sandbox.label} — {choice.sandbox.detail}")
        if choice.sandbox.proxy_socket is not None:
            lines.append(f"egress through the proxy socket {choice.sandbox.proxy_socket}")
    lines.extend(f"not used: {reason}" for reason in choice.reasons)
    return lines


def shell_line(choice: Choice, settings: Settings) -> str:
    """One line saying whether agents get the ``shell`` tool here and, when not, why and which agents go without it.

    For ``switchboard check`` and the ``run`` banner: agents that list ``shell`` are still served, without it.
    """
    if choice.sandbox is not None:
        return f"on — commands run in a {choice.sandbox.label} sandbox"
    why = choice.reasons[0] if choice.reasons else "no sandbox works on this host"
    why = why if len(why) <= _WHY_CHARS else why[: _WHY_CHARS - 1] + "…"
    listing = [agent.name for agent in settings.file.agents.values() if "shell" in agent.tools]
    served = f"; {', '.join(listing)} run{'s' if len(listing) == 1 else ''} without it" if listing else ""
    return f"off — no sandbox to isolate commands here: {why}{served} (see `switchboard check`)"
