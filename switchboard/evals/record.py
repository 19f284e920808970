"""``switchboard eval record SESSION``: a real session kept in Redis, written as a replay scenario.

The case is built by the control service (:meth:`~switchboard.control.ControlService.replay_case`, the code the
console's "make a replay case" runs too) and checked against the scenario format before anything is written, so a
file this writes always loads and, unedited, passes ``switchboard eval run``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import ValidationError

from switchboard.control import ControlService, OperatorScope
from switchboard.control.replay import case_yaml
from switchboard.errors import ConfigError
from switchboard.evals.scenario import Scenario
from switchboard.settings import Settings

__all__ = ["record_case", "scope_for", "write_case"]


async def record_case(
    service: ControlService, scope: OperatorScope, session: str, *, run_id: str | None = None
) -> tuple[Scenario, str]:
    """The session's replay scenario and its file text.

    Raises:
        ControlError: no such session, another tenant's, or nothing answered to record.
        ConfigError: the recorded case does not make a valid scenario (a defect: say so with the session).
    """
    case = await service.replay_case(scope, session, run_id=run_id)
    try:
        scenario = Scenario.model_validate(case)
    except ValidationError as err:
        raise ConfigError(f"the replay case of {session[:200]} is not a valid scenario: {err}") from None
    return scenario, case_yaml(case)


def scope_for(settings: Settings, principal: str, operator: str | None) -> OperatorScope:
    """The CLI's scope: every tenant, or with ``--operator NAME`` of a console operator, that operator's."""
    found = settings.file.console.operator(operator) if operator else None
    if found is None:
        return OperatorScope.everything(principal)
    return OperatorScope(
        operator=principal, tenants=frozenset(found.tenants), reads_messages=found.reads_messages
    )  # fmt: skip


def write_case(text: str, out: Path) -> None:
    """Write ``text`` to ``out`` whole or not at all (a temporary file beside it, then renamed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
